"""``vmm bench --paged-workdir`` on the H200: the copy figure from bench's device, and one shape
against kernels-only builds made on the GPU machine (the logic runs on the CPU in
tests/unit/test_vmm_paged.py and tests/integration/test_vmm_paged.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvprefetch.kernels import ops
from kvprefetch.vmm import paged as P
from kvprefetch.vmm.bench import DecodeConfig


# ---- GPU (the H200) ------------------------------------------------------------------------
@pytest.mark.gpu
def test_copy_figure_comes_from_bench_device() -> None:
    from kvprefetch.vmm.timing import measure_copy_bandwidth

    c = measure_copy_bandwidth(1 << 28, iters=5)
    assert c["gbps"] == pytest.approx(2 * c["bytes"] / (c["median_ms"] * 1e-3) / 1e9)
    assert c["gbps"] > 100 and c["read_gbps"] > 100 and c["read_spread"] >= 0


@pytest.mark.gpu
def test_one_shape_against_the_builds_on_this_machine() -> None:
    """Needs kernels-only builds made on this GPU machine: KVPREFETCH_PAGED_WORKDIR=DIR."""
    workdir = os.environ.get("KVPREFETCH_PAGED_WORKDIR")
    if not workdir:
        pytest.skip("set KVPREFETCH_PAGED_WORKDIR to a workdir with kernels-only builds")
    from kvprefetch.vmm.bench import plan_shapes, run_decode_shape
    from kvprefetch.vmm.timing import measure_copy_bandwidth

    builds = P.load_paged_ops(Path(workdir))
    cfg = DecodeConfig(batches=(8,), contexts=(1024,), rounds=3)
    plan = plan_shapes(cfg, 50 << 20, None)[0][0]
    copy = measure_copy_bandwidth(1 << 28, iters=5)
    hook = P.make_paged_decode(builds, cfg, 50 << 20, copy["gbps"] * 1e9)
    r = run_decode_shape(cfg, plan, copy["gbps"], hook, copy["read_gbps"])
    assert r.paged_status == "measured", r.paged_error
    # vLLM's own choice: b8 x 32 heads = 256 <= 512 and two 512-token partitions -> v2
    assert (r.paged_bitwise_equal is True
            and r.paged_kernel == ops.choose_kernel(1024, 8, 32) == "v2")
    assert next(iter(r.paged_builds)) == "baseline" and r.paged_ms and r.vmm_over_paged
