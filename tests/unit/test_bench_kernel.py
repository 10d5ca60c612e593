"""kvprefetch.bench.kernel's pure parts: statistics (bench.stats), launch planning and result
rows (bench.kernel_results). The per-shape procedure on the CPU needs torch and is in
tests/integration/test_bench_kernel.py; the timing itself needs CUDA graphs and events and runs
on the H200 (tests/gpu/test_bench_smoke.py); no test here depends on wall-clock time."""

from __future__ import annotations

import math
import statistics

import pytest

from kvprefetch.bench import kernel as k
from kvprefetch.bench import kernel_results as kr
from kvprefetch.bench.matrix import BenchMatrix
from kvprefetch.bench.stats import paired_speedups, quantile, summarize
from kvprefetch.errors import BenchError
from kvprefetch.kernels.kvinputs import cache_bytes_per_layer, min_bytes_moved

L2 = 60 * 1000 * 1000
COPY_BW = 4.3e12


def test_summarize_agrees_with_statistics_module() -> None:
    data = [5.0, 1.0, 4.0, 2.0, 3.0, 10.0]
    s = summarize(data)
    q = statistics.quantiles(data, n=4, method="inclusive")
    assert s.median == statistics.median(data)
    assert (s.p25, s.p75) == pytest.approx((q[0], q[2]))
    assert (s.min, s.max, s.n) == (1.0, 10.0, 6)
    with pytest.raises(ValueError, match="no samples"):
        summarize([])


def test_paired_speedups() -> None:
    assert paired_speedups([10.0, 12.0], [5.0, 12.0]) == [2.0, 1.0]
    with pytest.raises(ValueError, match="must be paired round by round"):
        paired_speedups([1.0], [1.0, 2.0])


@pytest.mark.parametrize("shape", BenchMatrix().shapes(), ids=lambda s: s.label)
def test_cold_plan_exceeds_l2_and_fills_the_sample(shape) -> None:
    cfg = k.KernelBenchConfig(mode="cold")
    moved = min_bytes_moved(shape.attn)
    per_layer = cache_bytes_per_layer(shape.attn)
    plan = k.plan_launches(moved, per_layer, L2, COPY_BW, cfg)
    assert plan.layers * per_layer >= cfg.l2_factor * L2
    assert plan.launches >= plan.layers          # every layer is visited each replay
    assert plan.launches % plan.layers == 0      # ... equally often, no early wrap-around
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
    plan = kr.LaunchPlan(layers=4, launches=8, replays=2, bytes_per_layer=1, est_launch_us=5.0)
    samples = {"baseline": [10.0, 11.0, 12.0], "patched": [5.0, 11.0, 6.0],
               "seed": [10.0, 11.0, 12.0]}
    r = kr.build_results(s, "cold", plan, 4_300_000, ["baseline", "patched", "seed"], samples,
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
    r2 = kr.build_results(s, "cold", plan, 1, ["baseline", "patched"],
                         {"baseline": [1.0] * 3, "patched": [1.0] * 3}, COPY_BW,
                         {"patched": False}, {"baseline": True, "patched": True})
    assert r2.bitwise_equal is False and "OUTPUTS DIFFER" in k.progress_line(1, 1, r2, 0.1)
    skipped = kr.ShapeResult(s, "cold", None, 0, (), None, "instantiation not in build(s): seed")
    assert skipped.status == "skipped" and r.status == "measured"
    assert "skipped (instantiation" in k.progress_line(1, 1, skipped, 0.0)
    assert skipped.to_dict()["status"] == "skipped"
    assert math.isclose(quantile([1.0, 3.0], 0.5), 2.0)


def test_launches_are_whole_passes_over_the_layers() -> None:
    """3 layers and a short call: 8 calls would visit layer 0 and 1 three times and layer 2 twice,
    and the replay boundary would put layer 0 one call after layer 1 (under the L2 factor)."""
    per_layer = math.ceil(4 * L2 / 3)
    plan = k.plan_launches(1000, per_layer, L2, COPY_BW, k.KernelBenchConfig(mode="cold"))
    assert plan.layers == 3 and plan.launches == 9


def test_shape_result_status_rules() -> None:
    s = BenchMatrix().shapes()[0]
    assert kr.ShapeResult(s, "cold", None, 0, (), None, "boom", "failed").status == "failed"
    with pytest.raises(ValueError, match="needs its reason"):
        kr.ShapeResult(s, "cold", None, 0, (), None, "", "skipped")  # a skip needs its reason
    with pytest.raises(ValueError, match="a measured shape has no error"):
        kr.ShapeResult(s, "cold", None, 0, (), None, "x", "measured")
    with pytest.raises(ValueError, match="status must be one of"):
        kr.ShapeResult(s, "cold", None, 0, (), None, "x", "lost")


def _results_loop(fail_at: int, problem: str):
    from kvprefetch.bench.matrix import shapes_from_specs

    shapes = shapes_from_specs(["1x1k", "8x1k", "32x1k", "64x1k"])
    released: list[str] = []
    lines: list[str] = []

    def measure(shape, config):
        if shape is shapes[fail_at]:
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")
        plan = kr.LaunchPlan(1, 8, 1, 1, 1.0)
        return kr.build_results(shape, config.mode, plan, 1000, ["baseline", "patched"],
                               {"baseline": [2.0] * 3, "patched": [1.0] * 3}, COPY_BW,
                               {"patched": True}, {"baseline": True, "patched": True})

    results, aborted = k.run_shapes(shapes, [k.KernelBenchConfig()], measure, lambda: problem,
                                    lambda: released.append("x"), lines.append)
    return shapes, results, aborted, released, lines


def test_run_stops_after_an_error_that_kills_the_context() -> None:
    shapes, results, aborted, released, lines = _results_loop(1, "illegal memory access")
    assert [r.status for r in results] == ["measured", "failed", "not run", "not run"]
    assert results[1].error == "error: CUDA error: an illegal memory access was encountered"
    assert aborted == f"{shapes[1].label} cold: illegal memory access"
    assert "earlier error" in results[2].error and aborted in results[3].error
    assert len(released) == 2                     # nothing more touches the dead context
    assert len(lines) == 4 and lines[3].startswith("[4/4]") and "not run" in lines[3]
    nm = k.not_measured(results)
    assert [(d["label"], d["status"]) for d in nm] == [(shapes[1].label, "failed"),
                                                       (shapes[2].label, "not run"),
                                                       (shapes[3].label, "not run")]


def test_run_continues_after_an_error_the_context_survives() -> None:
    _, results, aborted, released, _ = _results_loop(1, "")
    assert [r.status for r in results] == ["measured", "failed", "measured", "measured"]
    assert aborted == "" and len(released) == 4
