"""kvprefetch.bench.kernel: the pure parts (statistics, launch planning, result rows). The
timing itself needs CUDA graphs and events and runs on the H200 (tests/gpu/test_bench_smoke.py);
no test here depends on wall-clock time."""

from __future__ import annotations

import math
import statistics

import pytest

from kvprefetch.bench import kernel as k
from kvprefetch.bench.matrix import BenchMatrix
from kvprefetch.errors import BenchError
from kvprefetch.kvinputs import cache_bytes_per_layer, min_bytes_moved

L2 = 60 * 1000 * 1000
COPY_BW = 4.3e12


def test_summarize_agrees_with_statistics_module() -> None:
    data = [5.0, 1.0, 4.0, 2.0, 3.0, 10.0]
    s = k.summarize(data)
    q = statistics.quantiles(data, n=4, method="inclusive")
    assert s.median == statistics.median(data)
    assert (s.p25, s.p75) == pytest.approx((q[0], q[2]))
    assert (s.min, s.max, s.n) == (1.0, 10.0, 6)
    with pytest.raises(ValueError):
        k.summarize([])


def test_paired_speedups() -> None:
    assert k.paired_speedups([10.0, 12.0], [5.0, 12.0]) == [2.0, 1.0]
    with pytest.raises(ValueError):
        k.paired_speedups([1.0], [1.0, 2.0])


@pytest.mark.parametrize("shape", BenchMatrix().shapes(), ids=lambda s: s.label)
def test_cold_plan_exceeds_l2_and_fills_the_sample(shape) -> None:
    cfg = k.KernelBenchConfig(mode="cold")
    moved = min_bytes_moved(shape.attn)
    per_layer = cache_bytes_per_layer(shape.attn)
    plan = k.plan_launches(moved, per_layer, L2, COPY_BW, cfg)
    assert plan.layers * per_layer >= cfg.l2_factor * L2
    assert plan.launches >= plan.layers          # every layer is visited each replay
    est = plan.est_launch_us * 1e-6
    assert plan.replays * plan.launches * est >= cfg.target_sample_ms * 1e-3 * 0.999
    # the sample is not padded far beyond its target (keeps the default run within budget)
    assert (plan.replays - 1) * plan.launches * est < cfg.target_sample_ms * 1e-3


def test_hot_plan_uses_one_layer() -> None:
    s = BenchMatrix().shapes()[0]
    plan = k.plan_launches(min_bytes_moved(s.attn), cache_bytes_per_layer(s.attn), L2, COPY_BW,
                           k.KernelBenchConfig(mode="hot"))
    assert plan.layers == 1 and plan.launches >= 1


def test_plan_refuses_too_many_layers() -> None:
    with pytest.raises(BenchError, match="layers"):
        k.plan_launches(1000, 1000, L2, COPY_BW, k.KernelBenchConfig(max_layers=10))


def test_config_validation() -> None:
    with pytest.raises(BenchError):
        k.KernelBenchConfig(mode="warm")
    with pytest.raises(BenchError):
        k.KernelBenchConfig(rounds=2)


def test_default_matrix_fits_the_device_budget() -> None:
    """Timed work of the default run (25 shapes x 3 variants, cold), from the plans: the brief
    asks for the whole bench in ~4 minutes on the H200; the timed part must be a small share."""
    cfg = k.KernelBenchConfig()
    total = 0.0
    for s in BenchMatrix().shapes():
        plan = k.plan_launches(min_bytes_moved(s.attn), cache_bytes_per_layer(s.attn), L2,
                               COPY_BW, cfg)
        per_sample = plan.replays * plan.launches * plan.est_launch_us * 1e-6
        total += 3 * (cfg.rounds + 2) * per_sample
    assert total < 60.0


def test_build_results_and_progress_line() -> None:
    s = BenchMatrix().shapes()[0]
    plan = k.LaunchPlan(layers=4, launches=8, replays=2, bytes_per_layer=1, est_launch_us=5.0)
    samples = {"baseline": [10.0, 11.0, 12.0], "patched": [5.0, 11.0, 6.0],
               "seed": [10.0, 11.0, 12.0]}
    r = k.build_results(s, "cold", plan, 4_300_000, ["baseline", "patched", "seed"], samples,
                        COPY_BW, {"patched": True, "seed": True},
                        {"baseline": True, "patched": True, "seed": True})
    base, pat, seed = r.variants
    assert base.speedup is None and base.equal_to_baseline is None
    assert base.time_us.median == 11.0
    assert base.bw_fraction == pytest.approx(4_300_000 / 11e-6 / COPY_BW)
    assert pat.speedup.median == 2.0 and pat.speedup.min == 1.0 and pat.speedup.max == 2.0
    assert seed.speedup.median == 1.0
    assert r.bitwise_equal is True
    d = r.to_dict()
    assert d["variants"]["patched"]["speedup"]["median"] == 2.0
    assert d["plan"]["layers"] == 4 and d["batch"] == 1 and d["kernel"] == s.kernel
    line = k.progress_line(3, 25, r, 1.25)
    assert line.startswith("[3/25] ") and "patched 2.000x [1.000-2.000]" in line
    assert "bitwise equal" in line
    r2 = k.build_results(s, "cold", plan, 1, ["baseline", "patched"],
                         {"baseline": [1.0] * 3, "patched": [1.0] * 3}, COPY_BW,
                         {"patched": False}, {"baseline": True, "patched": True})
    assert r2.bitwise_equal is False and "OUTPUTS DIFFER" in k.progress_line(1, 1, r2, 0.1)
    skipped = k.ShapeResult(s, "cold", None, 0, (), None, "instantiation not in build(s): seed")
    assert "skipped" in k.progress_line(1, 1, skipped, 0.0)
    assert math.isclose(k.quantile([1.0, 3.0], 0.5), 2.0)


def test_run_kernel_bench_refuses_without_gpu() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(BenchError, match="needs a CUDA GPU"):
        k.run_kernel_bench([], BenchMatrix(), [k.KernelBenchConfig()])


_REF: dict[str, object] = {}


def _reference_ops(namespace: str, name: str, transform=None):
    """Stand-in builds (no GPU here): in-process ops that write the float64 reference."""
    from kvprefetch import ops
    from kvprefetch.reference import register_reference_ops

    if namespace not in _REF:
        _REF[namespace] = register_reference_ops(namespace, transform)
    return ops.ops_from_namespace(namespace, name=name)


@pytest.mark.parametrize("mode", ["cold", "hot"])
def test_bench_shape_control_flow_on_cpu(mode: str) -> None:
    """The whole per-shape procedure (inputs, per-variant replays, rotated rounds, poisoning,
    bitwise comparison, result row) with eager calls instead of CUDA graphs."""
    from kvprefetch.bench.matrix import shapes_from_specs

    shape = shapes_from_specs(["2x600"], preset="tinyllama-1.1b")[0]
    variants = [_reference_ops("kvp_bk_a", "baseline"), _reference_ops("kvp_bk_b", "patched")]
    cfg = k.KernelBenchConfig(mode=mode, rounds=3, target_sample_ms=0.0, min_launches=2)
    r = k.bench_shape(variants, shape, cfg, l2_bytes=2 * 2**20, copy_bw=COPY_BW, device="cpu")
    assert r.error == "" and r.plan is not None
    expected_layers = 1 if mode == "hot" else math.ceil(4 * 2 * 2**20 / r.plan.bytes_per_layer)
    assert r.plan.layers == expected_layers
    assert r.plan.launches >= r.plan.layers
    assert [v.name for v in r.variants] == ["baseline", "patched"]
    assert all(v.time_us.n == 3 for v in r.variants)
    assert r.bitwise_equal is True and all(v.nan_free for v in r.variants)


def test_bench_shape_catches_a_variant_that_differs_on_cpu() -> None:
    import torch

    from kvprefetch.bench.matrix import shapes_from_specs

    def bump(out: torch.Tensor) -> None:
        out.view(-1)[0] += 1

    shape = shapes_from_specs(["1x100"], preset="tinyllama-1.1b")[0]
    variants = [_reference_ops("kvp_bk_a", "baseline"), _reference_ops("kvp_bk_bad", "bad", bump)]
    r = k.bench_shape(variants, shape, k.KernelBenchConfig(rounds=3, target_sample_ms=0.0),
                      l2_bytes=2**20, copy_bw=COPY_BW, device="cpu")
    assert r.bitwise_equal is False and r.variants[1].equal_to_baseline is False


def test_bench_shape_skips_missing_instantiations(tmp_path) -> None:
    from kvprefetch.bench.matrix import shapes_from_specs
    from kvprefetch.ops import BuiltOps, PagedOps

    base = _reference_ops("kvp_bk_a", "baseline")
    no64 = BuiltOps(tree="seed", variant="seed", namespace="x", so_path=tmp_path, so_sha256="",
                    head_sizes=(128,), block_sizes=(16,), kv_dtypes=("fp16",),
                    manifest_path=tmp_path)
    seed = PagedOps(name="seed", namespace="x", v1=base.v1, v2=base.v2, build=no64)
    shape = shapes_from_specs(["1x100"], preset="tinyllama-1.1b")[0]
    r = k.bench_shape([base, seed], shape, k.KernelBenchConfig(), 2**20, COPY_BW, device="cpu")
    assert r.error == "instantiation not in build(s): seed" and r.variants == ()
