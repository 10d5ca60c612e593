"""The build's options as given (``BuildOptions``, what the CLI fills) and what a mode resolved
from them on this machine before planning (``ModeInputs``: the torch it probed, the overlay's
options, the smoke's inputs, the compiler cache). Both are frozen: the plan is made from them
and execution reads them, so nothing changes its mind half-way through a build."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..machine.torch_probe import TorchInfo
from ..overlay.install import OverlayOptions
from .full_smoke import SmokeInputs


@dataclass(frozen=True)
class BuildOptions:
    workdir: Path
    arch: str = "9.0a"
    mode: str = "auto"                     # auto | full | kernels-only | overlay
    trees: tuple[str, ...] = ()            # empty: default_trees
    env_backend: str | None = None         # None: uv for overlay where uv is found, else venv
    jobs: int | None = None                # None: sized from cores and memory
    nvcc_threads: int | None = None
    head_sizes: str | None = None
    block_sizes: str | None = None
    kv_dtypes: str | None = None
    torch_from: str | None = None
    editable: bool = True
    deps_dir: Path | None = None
    tree_defines: tuple[str, ...] = ()     # TREE:NAME=VALUE
    cuda_home: str | None = None
    allow_cuda_mismatch: bool = False
    skip_doctor: bool = False
    dry_run: bool = False
    smoke: bool = False                    # full mode: configure + the attention objects only
    smoke_objects: str | None = None       # "v1,v2" (default both)


@dataclass(frozen=True)
class ModeInputs:
    """What the chosen mode resolved before planning; each mode fills only its own fields and
    reads them again when it builds (``execute``)."""

    torch_from: str | None = None          # kernels-only: the interpreter the venvs inherit
    torch_info: TorchInfo | None = None    # kernels-only: that torch, probed (None: no nvcc)
    editable: bool = True                  # full: pip install -e . (else .)
    deps_dir: Path | None = None           # full and smoke: local FetchContent dependencies
    ccache: str | None = None              # full: ccache or sccache on PATH
    overlay: OverlayOptions | None = None  # overlay: toolkit choice, uv, the package index
    smoke: SmokeInputs | None = None       # smoke: torch, toolkit, cmake, objects
