"""The GPU tests' way to the kernels-only builds of baseline and patched made on this machine:
found through the build manifests under $KVPREFETCH_WORKDIR (default kvprefetch-work), loaded,
or the test skipped with what is missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

WORKDIR = Path(os.environ.get("KVPREFETCH_WORKDIR", "kvprefetch-work"))


def load_stock_and_patched():
    """(baseline ops, patched ops), or a skip naming what this machine lacks."""
    import torch

    from kvprefetch.kernels.ops import find_builds, load_build

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    builds = {b.tree: b for b in find_builds(WORKDIR, ["baseline", "patched"])}
    if set(builds) != {"baseline", "patched"}:
        pytest.skip(f"needs kernels-only builds of baseline and patched under "
                    f"{WORKDIR / 'build'}; found {sorted(builds) or 'none'}")
    return load_build(builds["baseline"]), load_build(builds["patched"])
