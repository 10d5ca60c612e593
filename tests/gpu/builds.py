"""The GPU tests' way to the kernels-only builds of baseline and patched made on this machine:
found through the build manifests under $KVPREFETCH_WORKDIR (default kvprefetch-work), loaded,
or the test skipped with what is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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


# KVPREFETCH_GQA is read once per process: a forced twin runs in its own interpreter, which
# loads both builds, calls `<module>.<func>(stock, patched, *step)` per step and prints the
# results as JSON.
_FORCED_PROBE = """
import importlib, json, sys, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from kvprefetch.kernels.ops import find_builds, load_build
run = getattr(importlib.import_module(sys.argv[3]), sys.argv[4])
stock = load_build(find_builds(Path(sys.argv[2]), ["baseline"])[0])
patched = load_build(find_builds(Path(sys.argv[2]), ["patched"])[0])
print(json.dumps([run(stock, patched, *s) for s in json.loads(sys.argv[5])]))
"""


def run_forced(twin: str, module: str, func: str, steps: list[Any]) -> list[Any]:
    """What ``module.func(stock, patched, *step)`` returns for each of ``steps``, run in a fresh
    interpreter with KVPREFETCH_GQA=``twin``; the test fails with the probe's stderr if it
    does."""
    env = {**os.environ, "KVPREFETCH_GQA": twin}
    repo = str(Path(__file__).resolve().parents[2])  # the probe imports tests.gpu.<module>
    res = subprocess.run([sys.executable, "-c", _FORCED_PROBE, repo, str(WORKDIR), module, func,
                          json.dumps(steps)], env=env, capture_output=True, text=True,
                         check=False, timeout=400)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])
