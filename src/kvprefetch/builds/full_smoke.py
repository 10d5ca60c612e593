"""The full-mode smoke's parts (``build --mode full --smoke``; the mode itself, its plan, steps
and manifest, is ``modes/smoke.py``): what it configures with (``resolve_inputs``), the copy
of the tree, the toolkit view, the generated commands and the SASS check of the objects.

The smoke: vLLM 0.10.2's real CMake project,
configured for the plan's archs against a torch 2.8.0 environment with the FetchContent
dependencies given locally, then only the objects of ``_C`` that include the patched header
(``csrc/attention/paged_attention_v1.cu`` and ``v2.cu``) built through the generated
``build.ninja``, per tree, and their SASS checked for ``UBLKPF``. It proves on a machine with no
GPU and no GitHub that the full path is not broken: the configure that a full build runs,
and the compile commands it generates for the two files the patch touches. It does not link
``_C`` and compiles nothing else (a full build takes hours).

Layout: ``<workdir>/build/<tree>/full-smoke/`` holds ``src/`` (a copy of the tree),
``cuda/`` (the toolkit view below), ``cmake/`` (CMake's binary directory), ``logs/`` and
``manifest.json`` (inputs, tool versions, the exact commands, each object's sha256 and UBLKPF
counts).

Why a copy of the tree: vLLM's configure writes into its source directory. It regenerates the
Machete and Marlin kernel sources under ``csrc/`` for the toolkit and archs it finds (with CUDA
12.4 it rewrites ten files the sdist ships), so configuring the tree itself would leave it
"edited after kvprefetch recorded it". The copy is made from the recorded tree, and the
manifest records the sha256 of the attention sources in both.

Why a toolkit *view*: the CUDA 12 toolkit the kit can give a machine without one
(``overlay/cuda12.py``: NVIDIA's 12.4.1 compiler and runtime headers, no libraries beyond
``libcudart.so.12``) compiles objects but is not a toolkit CMake accepts. CMake's compiler
check links a test program with ``-lcudadevrt -lcudart_static``, and torch's
``Caffe2/public/cuda.cmake`` asks ``FindCUDAToolkit`` for ``CUDA::cuda_driver``, ``nvrtc``,
cuBLAS, cuFFT, cuRAND, cuSPARSE and cuSOLVER. The view is a directory of symlinks: the
toolkit's ``bin/`` and ``nvvm/`` (nvcc reads its profile next to the path it was started by),
its ``include/`` plus the headers of the environment's own ``nvidia-*-cu12`` wheels (what
torch's headers include), and ``lib64/`` with the environment's libraries (the ones its torch
loads). Three link-time stand-ins complete it, and they are only ever linked into CMake's
check programs, never into anything the smoke keeps: ``libcudart_static.a`` is a linker
script naming ``libcudart.so.12``, ``libcudadevrt.a`` an empty archive (nothing here uses
relocatable device code), and ``lib64/stubs/libcuda.so`` an empty library where a real
toolkit has its driver stub. ``--cuda-home`` may name a complete CUDA 12 toolkit instead; the
view is made all the same (its libraries and stubs then come first)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import BuildError, ConfigError
from ..hashing import sha256_file
from ..machine.cmake import CMAKE_FIX, find_cmake
from ..machine.toolchain import fmt_version
from ..machine.torch_probe import default_torch_python, probe_torch
from ..overlay.cuda12 import toolkit_dir
from ..overlay.toolkit import choose_toolkit
from ..reading import parse_json
from ..runner import open_log, run
from ..workspace import ownership
from ..workspace.confine import (
    check_target,
    ensure_dir,
    is_plain_file,
    read_file,
    remove_path,
    write_file,
)
from ..workspace.confine import copy_tree as confine_copy_tree
from ..workspace.workdir import Workdir

SMOKE_SOURCES = {"v1": "csrc/attention/paged_attention_v1.cu",
                 "v2": "csrc/attention/paged_attention_v2.cu"}
# What the objects are compiled from, recorded in the tree and in the copy configured.
ATTENTION_FILES = (*SMOKE_SOURCES.values(), "csrc/attention/attention_kernels.cuh")
# (wheel directory under site-packages/nvidia, library) for the view's lib64/: what torch's
# CMake config asks FindCUDAToolkit for. Sonames as torch 2.8.0's cu12 wheels ship them.
_WHEEL_LIBS = (("cublas", "libcublas.so.12"), ("cublas", "libcublasLt.so.12"),
               ("cufft", "libcufft.so.11"), ("curand", "libcurand.so.10"),
               ("cusparse", "libcusparse.so.12"), ("cusolver", "libcusolver.so.11"),
               ("cuda_nvrtc", "libnvrtc.so.12"), ("nvjitlink", "libnvJitLink.so.12"),
               ("cuda_cupti", "libcupti.so.12"), ("cufile", "libcufile.so.0"),
               ("cuda_runtime", "libcudart.so.12"))
_STUB_C = "void kvprefetch_driver_stand_in(void) {}\n"


@dataclass(frozen=True)
class SmokeInputs:
    """What the smoke configures with, resolved before anything runs."""

    torch_python: str
    torch_version: str
    torch_cuda: str
    site_packages: str
    cuda_home: str               # the toolkit the view is made of
    nvcc_version: str
    toolkit_why: str
    cmake: str
    cmake_version: str
    objects: tuple[str, ...]     # keys of SMOKE_SOURCES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_objects(spec: str | None) -> tuple[str, ...]:
    """``--smoke-objects v1,v2`` -> ("v1", "v2") (default: both); ``none``: configure only."""
    if not spec:
        return tuple(SMOKE_SOURCES)
    if spec.strip() == "none":
        return ()
    names = tuple(dict.fromkeys(s.strip() for s in spec.split(",") if s.strip()))
    bad = [n for n in names if n not in SMOKE_SOURCES]
    if bad or not names:
        raise ConfigError(f"--smoke-objects {spec!r} names {', '.join(bad) or 'nothing'}",
                          "use v1, v2, v1,v2 (paged_attention_v1.cu / v2.cu) or none "
                          "(configure only)")
    return names


def resolve_inputs(wd: Workdir, environ: dict[str, str], *, torch_from: str | None,
                   cuda_home_opt: str | None, objects: tuple[str, ...]) -> SmokeInputs:
    """The torch environment, the CUDA toolkit with torch's major version and cmake; a
    ConfigError naming what is missing and how to get it."""
    py = torch_from or default_torch_python(wd)
    if py is None:
        raise ConfigError("the full-mode smoke needs a Python environment with torch==2.8.0 "
                          "(CUDA 12.8), the torch vLLM 0.10.2 pins",
                          "give --torch-from PYTHON, or run `kvprefetch build --mode overlay` "
                          f"first (its {wd.overlay_env('baseline')} is used by default)")
    tinfo = probe_torch(py, environ)
    if not tinfo.torch_version.startswith("2.8.0"):
        raise ConfigError(f"{py} has torch {tinfo.torch_version}; vLLM 0.10.2 pins torch==2.8.0",
                          "give --torch-from an interpreter with torch==2.8.0 (e.g. an overlay "
                          "environment)")
    # include_paths[0] is <site-packages>/torch/include
    site = Path(tinfo.include_paths[0]).parent.parent if tinfo.include_paths else None
    if site is None or not (site / "torch").is_dir():
        raise ConfigError(f"cannot find the site-packages of {py}'s torch",
                          "give --torch-from an interpreter with a pip-installed torch==2.8.0")
    tk = choose_toolkit(str(tinfo.torch_cuda), environ, explicit=cuda_home_opt,
                        assembled=toolkit_dir(wd.root))
    cm = find_cmake(environ, [Path(py).parent])
    if cm is None:
        raise ConfigError("no cmake >= 3.26.1 on PATH or in the torch environment (vLLM 0.10.2 "
                          "requires it; Debian 12's is 3.25.1)", CMAKE_FIX)
    return SmokeInputs(py, tinfo.torch_version, str(tinfo.torch_cuda), str(site), tk.cuda_home,
                       fmt_version(tk.version), tk.why, cm[0], fmt_version(cm[1]), objects)


def smoke_dir(wd: Workdir, tree: str) -> Path:
    return wd.build_root(tree) / "full-smoke"


def object_target(source: str) -> str:
    """The ninja target of a ``_C`` source's object as CMake's Ninja generator names it."""
    return f"CMakeFiles/_C.dir/{source}.o"


def ninja_targets(ninja_text: str) -> set[str]:
    """The explicit outputs of a build.ninja's ``build`` statements (pure)."""
    out: set[str] = set()
    for line in ninja_text.splitlines():
        if line.startswith("build "):
            head = line[len("build "):].split(":", 1)[0]
            out.update(p for p in head.replace("$ ", "\0").split() if p != "|")
    return {p.replace("\0", " ") for p in out}


def generated_commands(cbuild: Path, env: dict[str, str], log: Path) -> dict[str, str]:
    """The compile command CMake generated for each attention object (``ninja -t commands``,
    its last line); a BuildError when build.ninja has no such target."""
    ninja = cbuild / "build.ninja"
    known = ninja_targets(ninja.read_text())
    out = {}
    for src in SMOKE_SOURCES.values():
        target = object_target(src)
        if target not in known:
            raise BuildError(f"vLLM's generated {ninja} has no target {target}",
                             "the CMake project no longer compiles that source into _C; check "
                             "the tree's CMakeLists.txt")
        res = run(["ninja", "-C", str(cbuild), "-t", "commands", target], env=env, log=log,
                  echo=False)
        out[target] = res.output.strip().splitlines()[-1]
    return out


def copy_tree(root: Path, src: Path, dest: Path, source_sha256: str) -> Path:
    """``dest`` as a copy of ``src``, kept (CMake's build stays incremental) while it was copied
    from the same recorded sources, else made again. Removed and copied relative to folders
    opened ``O_NOFOLLOW`` from the work directory ``root`` down (``confine``): a ``dest``, or a
    folder above it, planted or swapped as a link never has a folder outside emptied or
    written (issue 41, the thirteenth hostile pass: ``rmtree`` and ``copytree`` acted by
    path)."""
    stamp = dest / ".kvprefetch-copied-from"
    want = f"{src.resolve()} {source_sha256}"
    check_target(root, dest, what="copy the tree into", family=BuildError)
    if is_plain_file(stamp) and _stamp_text(root, stamp) == want:
        return dest
    remove_path(root, dest, family=BuildError)
    ensure_dir(dest.parent, root=root, family=BuildError)
    confine_copy_tree(root, src, dest, family=BuildError)
    write_file(stamp, want + "\n", root=root, family=BuildError)
    return dest


def _stamp_text(root: Path, stamp: Path) -> str | None:
    try:
        return read_file(root, stamp, limit=1 << 16, family=BuildError).decode(
            "utf-8", "replace").strip()
    except (OSError, BuildError):
        return None


def _link(target: Path, link: Path) -> None:
    if link.is_symlink() or link.exists():
        return
    link.symlink_to(target)


def make_toolkit_view(root: Path, view: Path, cuda_home: Path, site: Path,
                      cc: str = "gcc") -> Path:
    """Fill ``view`` (module docstring says what and why); idempotent, rebuilt from scratch
    when the toolkit it was made of changes. Made in a private folder (``ownership
    .private_dir``) and brought in by ``confine.copy_tree``; the old view is removed by
    ``confine.remove_path``: a ``view`` (or a folder above it inside the work directory
    ``root``) planted or swapped as a link never has a folder outside emptied or written
    (issue 41, the thirteenth hostile pass: ``rmtree``, ``mkdir`` and ``symlink_to`` acted by
    path)."""
    stamp = view / ".kvprefetch-view.json"
    want = {"cuda_home": str(cuda_home.resolve()), "site": str(site.resolve()), "format": 1}
    check_target(root, view, what="make the toolkit view at", family=BuildError)
    if is_plain_file(stamp):
        try:
            if parse_json(read_file(root, stamp, limit=1 << 16, family=BuildError),
                          stamp) == want:
                return view
        except (OSError, ValueError, BuildError):
            pass
    with ownership.private_dir("toolkit-view") as private:
        made = private / view.name
        _fill_view(made, view, cuda_home, site, cc)
        remove_path(root, view, family=BuildError)
        ensure_dir(view.parent, root=root, family=BuildError)
        confine_copy_tree(root, made, view, family=BuildError)
    # last: a view stopped mid-copy has no stamp, and is made again
    write_file(stamp, json.dumps(want, indent=1) + "\n", root=root, family=BuildError)
    return view


def _fill_view(made: Path, view: Path, cuda_home: Path, site: Path, cc: str) -> None:
    """The view's links and stand-ins, made in the private folder ``made``; what names a file
    of the view (the static runtime's linker script) names it at ``view``, where it is copied."""
    (made / "bin").mkdir(parents=True)
    for f in (cuda_home / "bin").iterdir():
        _link(f.resolve(), made / "bin" / f.name)
    _link((cuda_home / "nvvm").resolve(), made / "nvvm")
    inc = made / "include"
    inc.mkdir()
    for f in (cuda_home / "include").iterdir():
        _link(f.resolve(), inc / f.name)
    nvidia = site / "nvidia"
    if nvidia.is_dir():
        for d in sorted(nvidia.iterdir()):
            if (d / "include").is_dir():
                for f in (d / "include").iterdir():
                    if f.name != "__init__.py" and f.name != "__pycache__":
                        _link(f.resolve(), inc / f.name)
    lib = made / "lib64"
    (lib / "stubs").mkdir(parents=True)
    for sub in ("lib64", "lib64/stubs", "targets/x86_64-linux/lib"):
        d = cuda_home / sub
        if d.is_dir():
            for f in d.iterdir():
                if f.is_file() and (".so" in f.name or f.suffix == ".a"):
                    _link(f.resolve(), lib / ("stubs" if sub.endswith("stubs") else "") / f.name)
    for wheel, soname in _WHEEL_LIBS:
        f = nvidia / wheel / "lib" / soname
        if f.is_file():
            _link(f.resolve(), lib / soname)
            _link(Path(soname), lib / (soname.split(".so")[0] + ".so"))  # beside it: relative
    if not (lib / "libcudart.so.12").exists():
        raise BuildError(f"neither {cuda_home} nor {nvidia}/cuda_runtime has libcudart.so.12",
                         "give --torch-from an environment with torch==2.8.0's cu12 wheels")
    if not (lib / "libcudart_static.a").exists():
        write_file(lib / "libcudart_static.a",
                   f"INPUT({view / 'lib64' / 'libcudart.so.12'})\n", family=BuildError)
    if not (lib / "libcudadevrt.a").exists():
        write_file(lib / "libcudadevrt.a", b"!<arch>\n", family=BuildError)
    if not (lib / "stubs" / "libcuda.so").exists():
        c = made / "libcuda-stand-in.c"
        write_file(c, _STUB_C, family=BuildError)
        run([cc, "-shared", "-fPIC", "-o", str(lib / "stubs" / "libcuda.so"), str(c)], echo=False)


def check_objects(objects: dict[str, Path], variant: str | None, disasm_env: dict[str, str],
                  log: Path) -> dict[str, dict[str, Any]]:
    """``cuobjdump -sass`` each object; per object its sha256 and the UBLKPF verdict (zero in
    every kernel of a stock tree; K and V sites where the variant's rules put them)."""
    from ..kernels.policy import prefetches_in
    from ..machine.toolchain import find_cuobjdump
    from ..verify.sass import judge, parse_sass, summarise

    tools = find_cuobjdump(disasm_env)
    if tools is None:
        raise BuildError("no cuobjdump to read the objects' SASS with",
                         "install nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm (pip), or use "
                         "a toolkit that has them")
    patched = variant is not None and variant != "stock"
    out = {}
    for name, obj in objects.items():
        # the listing (about 250 MB per object) is parsed, not logged; the log gets the verdict
        text = run([str(tools.cuobjdump), "-sass", str(obj)], env=tools.environ(disasm_env),
                   echo=False).output
        kernels = parse_sass(text)
        verdict = judge(kernels, patched=patched, expects=lambda k: prefetches_in(
            variant, k.version, k.kv_cache, k.head_size, k.block_size, k.dtype))
        archs = sorted({k.arch for k in kernels})
        out[name] = {"path": str(obj), "sha256": sha256_file(obj), "bytes": obj.stat().st_size,
                     "sass_archs": archs, "kernels": verdict.kernels,
                     "with_ublkpf": verdict.with_prefetch,
                     "ublkpf_total": sum(k.ublkpf for k in kernels),
                     "ok": verdict.ok, "problems": list(verdict.problems[:10]),
                     "table": summarise(kernels)}
        with open_log(log) as f:  # appended: never through a link, hard or symbolic
            f.write(f"+ {tools.cuobjdump} -sass {obj}\n{len(text)} characters of SASS; "
                    f"{verdict.kernels} paged_attention kernels ({', '.join(archs)}), "
                    f"{verdict.with_prefetch} with UBLKPF; problems: "
                    f"{list(verdict.problems[:10]) or 'none'}\n")
    return out
