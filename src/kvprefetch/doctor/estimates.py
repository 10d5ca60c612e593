"""How much disk each build mode needs on the work directory's disk: the measured sizes, the
overlay's (one install per environment, or one shared by uv's hard links) and the smoke's.
``DoctorProbes.disk_estimate_gb`` defaults to ``DISK_ESTIMATE_GB``; ``host.check_disk`` compares
the estimate with the free space."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ..machine.uvconfig import uv_config_args
from ..runner import NEUTRAL_CWD, run

GIB = 2**30

# Disk estimates. Full: two unpacked trees with their CMake build dirs and FetchContent deps
# (~12 GB each with CUTLASS/FA/FlashMLA objects), two envs with torch 2.8.0 + CUDA wheels
# (~6 GB each) and a shared ccache (~5 GB). Kernels-only: per tree its unpacked sources (40 MB),
# its objects and library (~26 MB) and a small env that inherits torch (~12 MB), plus the
# pristine sources and the sdist (~51 MB) and verify-kernel's cache: the four trees main.sh
# builds took 0.36 GB (issue 42; the estimate was 3 GB). 0.5 GB leaves room for more trees.
# Overlay: see overlay_disk_gb.
DISK_ESTIMATE_GB: dict[str, float] = {"full": 40.0, "kernels-only": 0.5}
# One released vLLM 0.10.2 install (vllm, torch 2.8.0, xformers, triton and the CUDA 12 wheels
# they pull) unpacks to 9.3 GiB (measured: uv's cache after one cold install); the work
# directory's own part (trees, the assembled CUDA 12 toolkit, the two libraries) about 0.5 GiB.
OVERLAY_INSTALL_GB = 10.0
OVERLAY_OWN_GB = 1.0

# build --mode full --smoke: the unpacked deps, two tree copies, CMake's binary dirs and the
# four attention objects (measured: about 0.4 GiB).
SMOKE_DISK_GB = 2.0


def existing(path: Path) -> Path:
    """``path``, or its nearest parent that exists (a work directory not made yet)."""
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def shares_one_install(backend: str, workdir: Path,
                       environ: Mapping[str, str]) -> tuple[bool, str]:
    """(shared, why): whether the environments' installs hard-link from one copy on the work
    directory's disk. uv links from its cache by default on Linux (``UV_LINK_MODE`` unset or
    ``hardlink``), but only within one file system: elsewhere it copies. pip and conda unpack
    a copy into every environment."""
    if backend != "uv":
        return False, f"{backend} unpacks a copy into each environment"
    mode = environ.get("UV_LINK_MODE") or "hardlink"
    if mode not in ("hardlink", "symlink"):
        return False, f"UV_LINK_MODE={mode}: uv copies into each environment"
    from ..overlay.install import find_uv

    uv = find_uv()
    done = run([uv, *uv_config_args(environ), "cache", "dir"], env=dict(environ), echo=False,
               check=False, timeout=30, cwd=NEUTRAL_CWD) if uv else None
    if done is None or done.returncode != 0 or not done.output.strip():
        return False, "uv's cache directory is unknown (`uv cache dir` failed)"
    cache = Path(done.output.strip().splitlines()[-1])
    try:
        same = existing(cache).stat().st_dev == existing(workdir).stat().st_dev
    except OSError as exc:  # UV_CACHE_DIR 5,000 characters long: "doctor failed: ... File name
        # too long / check the path", naming no variable (issue 41, ninth hostile pass)
        return False, (f"uv's cache directory (UV_CACHE_DIR or uv's default: `uv cache dir`) "
                       f"cannot be examined: {exc.strerror or exc}; uv copies into each "
                       "environment, if it runs at all")
    if not same:
        return False, (f"uv's cache {cache} is on another file system: uv copies into each "
                       "environment")
    return True, f"uv hard-links every environment from its cache {cache} on this disk"


def overlay_disk_gb(envs: int, shared: bool) -> float:
    """What an overlay build of ``envs`` environments needs on the work directory's disk: one
    install when the environments hard-link from one cache there, else one per environment."""
    return OVERLAY_OWN_GB + OVERLAY_INSTALL_GB * (1 if shared else max(1, envs))
