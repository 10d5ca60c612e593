"""GPU smoke test of bench kernel and the identity check on the REAL compiled builds: two
shapes (one v1, one v2 by vLLM's rule), every variant in one process, bitwise equality asserted.
Needs kernels-only builds made on this machine (`kvprefetch build --kernels-only`); found through
the build manifests under $KVPREFETCH_WORKDIR (default kvprefetch-work)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

WORKDIR = Path(os.environ.get("KVPREFETCH_WORKDIR", "kvprefetch-work"))


@pytest.fixture(scope="module")
def loaded_ops():
    import torch

    from kvprefetch.kernels.ops import find_builds, load_build

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    builds = find_builds(WORKDIR)
    if len(builds) < 2 or builds[0].tree != "baseline":
        pytest.skip(f"needs kernels-only builds of the baseline and at least one variant under "
                    f"{WORKDIR / 'build'} (run `kvprefetch build --kernels-only` on this "
                    f"machine); found {[b.tree for b in builds] or 'none'}")
    return [load_build(b) for b in builds]


@pytest.mark.parametrize("spec", ["1x4k", "64x1k"])
def test_bench_shape_both_variants_bitwise_equal(loaded_ops, spec: str) -> None:
    from kvprefetch.bench.kernel import KernelBenchConfig, bench_shape, device_facts
    from kvprefetch.bench.matrix import shapes_from_specs

    shape = shapes_from_specs([spec])[0]
    a = shape.attn
    if not all(o.supports(a.head_size, a.block_size, a.kv_cache_dtype, a.dtype)
               for o in loaded_ops):
        pytest.skip(f"{shape.label} is not instantiated in every build")
    facts = device_facts()
    r = bench_shape(loaded_ops, shape, KernelBenchConfig(rounds=3, target_sample_ms=0.5),
                    facts["l2_bytes"], copy_bw=3e12)
    assert r.error == ""
    assert r.plan is not None and r.plan.layers * r.plan.bytes_per_layer >= 4 * facts["l2_bytes"]
    assert [v.name for v in r.variants] == [o.name for o in loaded_ops]
    for v in r.variants:
        assert v.nan_free, f"{v.name} left unwritten (NaN) outputs"
        assert v.time_us.median > 0
    assert r.bitwise_equal is True, [(v.name, v.equal_to_baseline) for v in r.variants]


def test_identity_on_a_few_cases(loaded_ops) -> None:
    from kvprefetch.verify.numerics import IdentityCase, check_identity

    cases = [IdentityCase(128, 16, "float16", "auto", 513),
             IdentityCase(128, 16, "bfloat16", "fp8", 8193),
             IdentityCase(128, 16, "float16", "auto", 1025, num_seqs=72)]
    rep = check_identity(loaded_ops, cases=cases)
    failed = [(r.case.label, r.kernel, r.problems) for r in rep.rows if r.status == "failed"]
    assert not failed
    assert rep.status in ("passed", "not checked")
