"""The kernels-only build: one tree's REAL ``paged_attention_v1.cu`` / ``v2.cu`` plus our
``csrc/kvprefetch_ops.cpp`` compiled into one shared library whose ops live in the torch
namespace ``kvprefetch_<tree>``, then installed into that tree's environment as the package
``kvprefetch_kernels``.

The compile flags mirror what vLLM 0.10.2's CMake gives these translation units: torch's
COMMON_NVCC_FLAGS minus the four ``__CUDA_NO_HALF*`` defines (cmake/utils.cmake L101-110),
``-DENABLE_FP8``, the gencode of ``vllm_c_archs`` (9.0a -> sm_90), ``-O2 -DNDEBUG``
(RelWithDebInfo without host debug info). The C++ standard is 17 as in vLLM, or 20 where the
torch headers require it (torch >= 2.10).

We write build.ninja ourselves rather than call torch.utils.cpp_extension.load so that the
flags are exactly these, the plan can print every command, and an interrupted build resumes:
each object is written to ``$out.tmp`` and renamed, so a killed compile never leaves a
plausible-looking half object behind."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .. import upstream
from ..errors import BuildError, ConfigError
from ..kernels.selection import Selection, narrow_source
from ..runner import run
from ..workspace.confine import write_file
from ..workspace.workdir import write_json_atomic

_DROP_FLAGS = {"-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
               "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"}
PACKAGE = "kvprefetch_kernels"


@dataclass(frozen=True)
class TorchInfo:
    python: str
    prefix: str
    torch_version: str
    torch_cuda: str | None
    include_paths: tuple[str, ...]
    library_paths: tuple[str, ...]
    cxx11_abi: bool
    common_nvcc_flags: tuple[str, ...]
    nvidia_include_paths: tuple[str, ...]

    @property
    def cxx_std(self) -> str:
        m = re.match(r"(\d+)\.(\d+)", self.torch_version)
        major_minor = (int(m.group(1)), int(m.group(2))) if m else (2, 10)
        return "c++20" if major_minor >= (2, 10) else "c++17"


def probe_script(name: str) -> Path:
    return Path(__file__).resolve().parent.parent / "probe" / name


def probe_torch(python: str, env: dict[str, str], log: Path | None = None) -> TorchInfo:
    res = run([python, str(probe_script("torch_info.py"))], env=env, log=log, echo=False,
              check=False, cwd="/")
    if res.returncode != 0:
        raise BuildError(f"{python} cannot import torch (needed to compile against it):\n"
                         + res.output.strip()[-800:],
                         "install a CUDA build of torch in that environment, or build with "
                         "--torch-from PYTHON naming an interpreter that has one")
    line = [ln for ln in res.output.splitlines() if ln.startswith("{")][-1]
    d = json.loads(line)
    if not d.get("torch_cuda"):
        raise BuildError(f"the torch in {python} ({d['torch_version']}) is a CPU-only build",
                         "install a CUDA build of torch (e.g. pip install torch==2.14.1 from an "
                         "index that serves CUDA wheels)")
    return TorchInfo(d["python"], d["prefix"], d["torch_version"], d["torch_cuda"],
                     tuple(d["include_paths"]), tuple(d["library_paths"]), d["cxx11_abi"],
                     tuple(d["common_nvcc_flags"]), tuple(d.get("nvidia_include_paths", ())))


def namespace_for(tree: str) -> str:
    ns = "kvprefetch_" + re.sub(r"[^0-9A-Za-z_]", "_", tree)
    return ns


def compile_flags(info: TorchInfo, cuda_home: Path, gencode: list[str], namespace: str,
                  tree_csrc: Path, build_info: str, defines: tuple[str, ...] = ()
                  ) -> tuple[list[str], list[str], list[str]]:
    """(nvcc flags, c++ flags, link flags). ``defines`` (``NAME=VALUE``) are this tree's own
    extra -D settings, e.g. the prefetch helper's tuning macros."""
    includes = [f"-I{tree_csrc / 'attention'}", f"-I{tree_csrc}"]
    includes += [f"-I{p}" for p in info.include_paths if p not in ("/usr/local/include",)]
    if not (cuda_home / "include" / "cublas_v2.h").is_file():
        includes += [f"-I{p}" for p in info.nvidia_include_paths]
    defs = [f"-DKVPREFETCH_NAMESPACE={namespace}", f"-DTORCH_EXTENSION_NAME={namespace}",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(info.cxx11_abi)}", *(f"-D{d}" for d in defines)]
    common = [f for f in info.common_nvcc_flags if f not in _DROP_FLAGS]
    nvcc = (["-std=" + info.cxx_std, "-O2", "-DNDEBUG", "-DENABLE_FP8", *common, *gencode,
             "-Xcompiler=-fPIC", *defs, *includes])
    cxx = ["-std=" + info.cxx_std, "-O2", "-DNDEBUG", "-fPIC", *defs,
           f"-DKVPREFETCH_BUILD_INFO={json.dumps(build_info)}", *includes,
           f"-I{cuda_home / 'include'}"]
    libdirs = [*info.library_paths, str(cuda_home / "lib64")]
    link = ["-shared", "-Wl,-Bsymbolic", *[f"-L{d}" for d in libdirs],
            "-lc10", "-lc10_cuda", "-ltorch", "-ltorch_cpu", "-ltorch_cuda", "-lcudart",
            *[f"-Wl,-rpath,{d}" for d in info.library_paths]]
    return nvcc, cxx, link


def _one_line(s: str) -> str:
    """``s`` when it holds no control character: ninja has no escape for a newline (and
    shlex.quote leaves one as it is), so a newline in a flag or path would start a new line of
    build.ninja, e.g. a rule of someone else's (options are checked earlier; this is the last
    line of defence for paths and values from the environment)."""
    if any(ord(c) < 0x20 or ord(c) == 0x7f for c in s):
        raise ConfigError(f"{s!r} holds a control character (a newline, tab, escape, ...) and "
                          "cannot be written into build.ninja",
                          "remove it from the option, path or environment variable it came "
                          "from, then rerun")
    return s


def _esc(s: str) -> str:
    return _one_line(s).replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def _ninja_list(flags: list[str]) -> str:
    # ninja passes the command to /bin/sh; quote each flag for the shell.
    import shlex
    return " ".join(shlex.quote(_one_line(f)).replace("$", "$$") for f in flags)


def ninja_text(*, nvcc: Path, cxx: str, cu_sources: list[Path], cpp_source: Path,
               nvcc_flags: list[str], cxx_flags: list[str], link_flags: list[str],
               output: Path, extra_cpp_sources: tuple[Path, ...] = ()) -> str:
    """The build.ninja for one tree (``extra_cpp_sources``: more host sources for the
    library, e.g. the overlay's csrc/kvprefetch_route.cpp). Objects and the library are written to a temp name and
    renamed, so an interrupted build never leaves a truncated output that looks up to date."""
    lines = [
        "ninja_required_version = 1.3",
        f"nvcc = {_esc(str(nvcc))}",
        f"cxx = {_esc(cxx)}",
        f"nvcc_flags = {_ninja_list(nvcc_flags)}",
        f"cxx_flags = {_ninja_list(cxx_flags)}",
        f"link_flags = {_ninja_list(link_flags)}",
        "",
        "rule nvcc",
        # $$$$ is the shell's pid: a compile left running by a killed build can never write
        # the temp file of the rerun that replaces it.
        ("  command = $nvcc --generate-dependencies-with-compile --dependency-output $out.d "
         "$nvcc_flags -c $in -o $out.$$$$.tmp && mv -f $out.$$$$.tmp $out"),
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = nvcc $in",
        "",
        "rule cxx",
        "  command = $cxx -MMD -MF $out.d $cxx_flags -c $in -o $out.$$$$.tmp && mv -f $out.$$$$.tmp $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = c++ $in",
        "",
        "rule link",
        "  command = $cxx $in $link_flags -o $out.$$$$.tmp && mv -f $out.$$$$.tmp $out",
        "  description = link $out",
        "",
    ]
    objs = []
    for src in cu_sources:
        obj = f"{src.stem}.cuda.o"
        objs.append(obj)
        lines.append(f"build {obj}: nvcc {_esc(str(src))}")
    for cpp in (cpp_source, *extra_cpp_sources):
        lines.append(f"build {cpp.stem}.o: cxx {_esc(str(cpp))}")
        objs.append(f"{cpp.stem}.o")
    lines.append(f"build {_esc(output.name)}: link {' '.join(objs)}")
    lines.append(f"default {_esc(output.name)}")
    return "\n".join(lines) + "\n"


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` unless it holds it already (confine.write_if_changed: never
    through a symlink)."""
    from ..workspace.confine import write_if_changed as write

    return write(path, text, family=BuildError)


def kernel_sources(tree: Path, sel: Selection, build_dir: Path) -> list[Path]:
    """The launcher sources to compile: the tree's own files for the full set, or narrowed
    copies (generated in the build dir, including the tree's headers via -I) otherwise."""
    srcs = [tree / p for p in upstream.PAGED_ATTENTION_SOURCES]
    for s in srcs:
        if not s.is_file():
            raise BuildError(f"{s} is missing", "run `kvprefetch fetch` to restore the tree")
    if sel.full:
        return srcs
    out = []
    for version, s in zip((1, 2), srcs):
        dest = build_dir / "src" / s.name
        header = (f"// Generated by kvprefetch from {s} (narrowed: "
                  f"{json.dumps(sel.to_dict())}). Do not edit.\n")
        write_if_changed(dest, header + narrow_source(s.read_text(), version, sel))
        out.append(dest)
    return out


INIT_TEMPLATE = '''"""kvprefetch kernels-only build of vLLM v0.10.2 paged attention (generated; do not edit).

Loads this environment's own compiled kernels and returns the torch op namespace."""

import json
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(_HERE, "build.json")) as _f:
    BUILD = json.load(_f)
NAMESPACE = BUILD["namespace"]
SO_PATH = os.path.join(_HERE, "_C.so")


def load():
    import torch

    torch.ops.load_library(SO_PATH)
    return getattr(torch.ops, NAMESPACE)
'''


def install_into_env(site_packages: Path, so: Path, build_json: dict[str, object]) -> Path:
    """Copy the library into ``<site-packages>/kvprefetch_kernels/`` (atomically)."""
    import shutil

    pkg = site_packages / PACKAGE
    tmp = site_packages / f".{PACKAGE}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copy2(so, tmp / "_C.so")
    write_file(tmp / "__init__.py", INIT_TEMPLATE, family=BuildError)
    write_json_atomic(tmp / "build.json", build_json)
    old = site_packages / f".{PACKAGE}.old-{os.getpid()}"
    if pkg.exists():
        os.rename(pkg, old)
    os.rename(tmp, pkg)
    shutil.rmtree(old, ignore_errors=True)
    return pkg / "_C.so"
