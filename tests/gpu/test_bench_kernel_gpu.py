"""kvprefetch.bench.kernel on the H200: the shape that once crashed there (b32 ctx32k, v2, three
variants with a 16 MiB workspace each), against kernels-only builds under $KVPREFETCH_WORKDIR."""

from __future__ import annotations

import pytest

from kvprefetch.bench import kernel as k


@pytest.mark.gpu
def test_three_variants_v2_with_a_large_workspace_on_the_gpu() -> None:
    """The shape that crashed on the H200 (b32 ctx32k, v2: a 16 MiB tmp_out per variant, which the
    caching allocator gives its own segment, so a freed one is unmapped by the next capture).
    Needs kernels-only builds under $KVPREFETCH_WORKDIR (default kvprefetch-work)."""
    import os
    from pathlib import Path

    from kvprefetch.bench.matrix import shapes_from_specs
    from kvprefetch.kernels.ops import find_builds, load_build

    builds = find_builds(Path(os.environ.get("KVPREFETCH_WORKDIR", "kvprefetch-work")))
    if len(builds) < 2 or builds[0].tree != "baseline":
        pytest.skip(f"needs the baseline and a variant built; found {[b.tree for b in builds]}")
    ops = [load_build(b) for b in builds]
    shape = shapes_from_specs(["32x32k"])[0]
    facts = k.device_facts()
    r = k.bench_shape(ops, shape, k.KernelBenchConfig(rounds=3, target_sample_ms=0.5),
                      facts["l2_bytes"], copy_bw=4e12)
    assert shape.kernel == "v2" and r.status == "measured", r.error
    assert r.bitwise_equal is True
