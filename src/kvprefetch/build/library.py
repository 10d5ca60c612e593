"""The kernels library a kernels-only or overlay build makes of one tree (``<namespace>_C.so``):
its build.ninja, its install into the tree's environment, and the core of its manifest. Both
modes write these the same way; the overlay adds its own entries to the manifest
(``overlay_mode``)."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from ..hashing import sha256_file
from ..kernels.selection import Selection
from .kernels_only import (
    TorchInfo,
    compile_flags,
    install_into_env,
    kernel_sources,
    ninja_text,
    write_if_changed,
)
from .plan import BuildPlan, TreePlan


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
    from ..upstream import kit_root

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
        cpp_source=kit_root() / "csrc" / "kvprefetch_ops.cpp", nvcc_flags=nvcc_flags,
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
    return install_into_env(site, lib.so, build_json), so_sha


def library_manifest(tp: TreePlan, plan: BuildPlan, lib: LibraryBuild, *, mode: str,
                     installed: Path, so_sha: str, tinfo: TorchInfo, env_python: str,
                     started: float, toolchain: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest of a library build: the inputs that make its key, the toolchain (plus
    ``toolchain``'s entries), the environment and both copies of the library with their
    hashes."""
    return {
        "kvprefetch": __version__, "mode": mode, "tree": tp.tree,
        "variant": tp.variant or "stock", "namespace": tp.namespace, "key": tp.key,
        "so_path": str(installed), "so_sha256": sha256_file(installed),
        "build_so_path": str(lib.so),
        "head_sizes": plan.selection["head_sizes"], "block_sizes": plan.selection["block_sizes"],
        "kv_dtypes": plan.selection["kv_dtypes"], "selection": plan.selection,
        "inputs": {"source_tree": tp.source_tree, "source_sha256": tp.source_sha256,
                   "patch_sha256": tp.patch_sha256, "arch_list": plan.arch_list,
                   "gencode": list(plan.gencode),
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
