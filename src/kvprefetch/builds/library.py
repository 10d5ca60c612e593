"""The kernels library a kernels-only or overlay build makes of one tree: the tree's REAL
``paged_attention_v1.cu`` / ``v2.cu`` plus our ``csrc/kvprefetch_ops.cpp`` compiled into one
shared library (``<namespace>_C.so``) whose ops live in the torch namespace
``kvprefetch_<tree>``, then installed into that tree's environment as the package
``kvprefetch_kernels``. Both modes write its build.ninja, install it and record it the same
way; the overlay adds its route source, its link against the environment's CUDA runtime and
its own manifest entries (``modes/overlay.py``).

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
import platform
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import upstream
from ..errors import BuildError, ConfigError
from ..hashing import sha256_file
from ..kernels.selection import Selection, narrow_source
from ..machine.torch_probe import TorchInfo
from ..workspace.confine import write_file
from ..workspace.workdir import write_json_atomic
from .plan import BuildPlan, TreePlan

_DROP_FLAGS = {"-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
               "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"}
PACKAGE = "kvprefetch_kernels"


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
    library, e.g. the overlay's csrc/kvprefetch_route.cpp). Objects and the library are written to a
    temp name and renamed, so an interrupted build never leaves a truncated output that looks up to
    date."""
    lines = [
        "ninja_required_version = 1.3",
        # a path, quoted for the shell ninja runs (a toolkit under "/opt/cuda 12.8" split
        # into "/opt/cuda"); $cxx stays a shell fragment, as make reads CXX ("ccache g++")
        f"nvcc = {_ninja_list([str(nvcc)])}",
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
        ("  command = $cxx -MMD -MF $out.d $cxx_flags -c $in -o $out.$$$$.tmp"
         " && mv -f $out.$$$$.tmp $out"),
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
    for version, s in zip((1, 2), srcs, strict=True):
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
'''  # noqa: E501


def install_into_env(site_packages: Path, so: Path, build_json: dict[str, object], *,
                     root: Path) -> Path:
    """Copy the library into ``<site-packages>/kvprefetch_kernels/`` (atomically): a new folder
    beside it, then two renames. Every act goes through ``confine`` from ``root`` (the work
    directory, which holds the environment) down: the environment is in the work directory,
    and its ``site-packages`` (or a folder above it) swapped for a link to a folder outside
    while the build compiled had the library, its record and the renames land in that folder,
    the user's own ``kvprefetch_kernels/`` there moved aside and deleted (issue 41, the
    eleventh hostile pass: a swap after the torch probe, minutes before the install)."""
    import shutil

    from ..workspace import confine

    pkg = site_packages / PACKAGE
    tmp = site_packages / f".{PACKAGE}.tmp-{os.getpid()}"
    old = site_packages / f".{PACKAGE}.old-{os.getpid()}"
    for p in (pkg, tmp, old):
        confine.check_target(root, p, what="install the library into", family=BuildError)
    for p in (tmp, old):  # this pid's leftovers of an install killed part-way
        if os.path.lexists(p):
            confine.remove_path(root, p, family=BuildError)
    confine.ensure_dir(tmp, root=root, family=BuildError)
    with open(so, "rb") as src, confine.open_new(
            tmp / "_C.so", root=root, mode=confine.kept_mode(so), exact=True,
            family=BuildError) as f:
        shutil.copyfileobj(src, f, 1 << 20)
    write_file(tmp / "__init__.py", INIT_TEMPLATE, root=root, family=BuildError)
    write_json_atomic(tmp / "build.json", build_json, root=root)
    if os.path.lexists(pkg):
        confine.rename_path(root, pkg, old.name, family=BuildError)
    confine.rename_path(root, tmp, PACKAGE, family=BuildError)
    if os.path.lexists(old):
        confine.remove_path(root, old, family=BuildError)
    return pkg / "_C.so"


@dataclass(frozen=True)
class LibraryBuild:
    """What the tree's build.ninja compiles: the launcher sources, the library and the flags."""

    sources: list[Path]
    so: Path
    nvcc_flags: list[str]
    link_flags: list[str]


def write_library_ninja(tp: TreePlan, plan: BuildPlan, tinfo: TorchInfo, cuda_home: Path,
                        nvcc: Path, *, link: Callable[[list[str]], list[str]] | None = None,
                        extra_cpp_sources: tuple[Path, ...] = ()) -> LibraryBuild:
    """The tree's narrowed launcher sources and build.ninja (rewritten only when it changed, so
    ninja resumes). ``link`` adjusts the link flags (the overlay links against the
    environment's CUDA runtime)."""
    sel = Selection(tuple(plan.selection["head_sizes"]), tuple(plan.selection["block_sizes"]),
                    tuple(plan.selection["kv_dtypes"]))
    build_info = json.dumps({"tree": tp.tree, "variant": tp.variant,
                             "patch_sha256": tp.patch_sha256, "key": tp.key})
    nvcc_flags, cxx_flags, link_flags = compile_flags(
        tinfo, cuda_home, list(plan.gencode), tp.namespace, Path(tp.source_tree) / "csrc",
        build_info, tp.defines)
    if link is not None:
        link_flags = link(link_flags)
    bdir = Path(tp.build_dir)
    srcs = kernel_sources(Path(tp.source_tree), sel, bdir)
    so = bdir / f"{tp.namespace}_C.so"
    write_if_changed(bdir / "build.ninja", ninja_text(
        nvcc=nvcc, cxx=os.environ.get("CXX", "g++"), cu_sources=srcs,
        cpp_source=upstream.kit_source("kvprefetch_ops.cpp"), nvcc_flags=nvcc_flags,
        cxx_flags=cxx_flags, link_flags=link_flags, output=so,
        extra_cpp_sources=extra_cpp_sources))
    return LibraryBuild(srcs, so, nvcc_flags, link_flags)


def install_library(tp: TreePlan, plan: BuildPlan, lib: LibraryBuild, site: Path,
                    mode: str | None = None) -> tuple[Path, str]:
    """Copy the built library into the environment's site-packages with its build record;
    returns the installed path and the built library's sha256."""
    so_sha = sha256_file(lib.so)
    build_json = {"tree": tp.tree, "variant": tp.variant or "stock", "namespace": tp.namespace,
                  "key": tp.key, "so_sha256": so_sha, "build_so": str(lib.so),
                  "patch_sha256": tp.patch_sha256, **({"mode": mode} if mode else {}),
                  **plan.selection}
    return install_into_env(site, lib.so, build_json, root=Path(plan.workdir)), so_sha


def library_manifest(core: dict[str, Any], tp: TreePlan, plan: BuildPlan, lib: LibraryBuild, *,
                     installed: Path, so_sha: str, tinfo: TorchInfo, env_python: str,
                     started: float, toolchain: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest of a library build: ``core`` (``sequence.manifest_core``) with the inputs
    that make its key, the toolchain (plus ``toolchain``'s entries), the environment and both
    copies of the library with their hashes."""
    return {
        **core, "namespace": tp.namespace,
        "so_path": str(installed), "so_sha256": sha256_file(installed),
        "build_so_path": str(lib.so),
        "head_sizes": plan.selection["head_sizes"], "block_sizes": plan.selection["block_sizes"],
        "kv_dtypes": plan.selection["kv_dtypes"], "selection": plan.selection,
        "inputs": {**core["inputs"], "gencode": list(plan.gencode),
                   "sources": {str(s): sha256_file(s) for s in lib.sources},
                   "defines": list(tp.defines), "nvcc_flags": lib.nvcc_flags,
                   "link_flags": lib.link_flags},
        "toolchain": {**plan.toolchain, **(toolchain or {}), "torch": tinfo.torch_version,
                      "torch_cuda": tinfo.torch_cuda, "cxx_std": tinfo.cxx_std,
                      "env_python": tinfo.python, "platform": platform.platform()},
        "env": {"backend": tp.env_backend, "path": tp.env_path, "python": env_python},
        "outputs": [{"path": str(lib.so), "sha256": so_sha},
                    {"path": str(installed), "sha256": sha256_file(installed)}],
        "seconds": round(time.monotonic() - started, 1),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
