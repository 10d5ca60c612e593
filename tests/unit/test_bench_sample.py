"""The sampled benchmark (``bench kernel --sample``, issue 29): the distribution's draw
(bench/sample.py), which steps are timed once, the report's statistics on synthetic numbers
computed here independently (bench/sample_stats.py, sample_rules.py, sample_report.py), and the
CLI's refusals. Ragged steps reaching the kernel's inputs need torch and are in
tests/integration/test_bench_sample.py. No GPU, no wall-clock dependence."""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprefetch.bench import kernel as k
from kvprefetch.bench import kernel_results as kr
from kvprefetch.bench import sample as sm
from kvprefetch.bench import sample_report as rep
from kvprefetch.bench import sample_rules as rules
from kvprefetch.bench import sample_stats as stats
from kvprefetch.bench.matrix import BenchShape
from kvprefetch.cli.bench import bench
from kvprefetch.errors import ConfigError
from kvprefetch.kernels.kvinputs import AttnShape, kv_bytes_read
from kvprefetch.kernels.ops import BuiltOps, choose_kernel

FULL = sm.Instantiations.full()


def _spec(n: int = 300, seed: int = 1, inst: sm.Instantiations = FULL,
          max_kv: int = sm.DEFAULT_MAX_KV_BYTES) -> sm.SampleSpec:
    return sm.SampleSpec(n=n, seed=seed, instantiations=inst, max_kv_bytes=max_kv)


# ----------------------------------------------------------------------------- the draw


def test_same_seed_same_steps_other_seed_other_steps() -> None:
    a, b = sm.draw_sample(_spec(seed=7)), sm.draw_sample(_spec(seed=7))
    assert [s.to_dict() for s in a] == [s.to_dict() for s in b]
    c = sm.draw_sample(_spec(seed=8))
    assert [s.to_dict() for s in a] != [s.to_dict() for s in c]


def test_every_axis_of_the_distribution_is_drawn() -> None:
    steps = sm.draw_sample(_spec(n=600))
    groups = Counter(s.attn.num_heads // s.attn.num_kv_heads for s in steps)
    assert set(groups) == set(sm.GROUP_SIZES)
    assert {s.attn.head_size for s in steps} == set(sm.HEAD_SIZES)
    assert {s.attn.block_size for s in steps} == set(sm.BLOCK_SIZES)
    assert {sm.cache_kind(s.attn.kv_cache_dtype, s.attn.dtype) for s in steps} == {
        "fp16", "bf16", "fp8"}
    assert {s.attn.dtype for s in steps if s.attn.kv_cache_dtype == "fp8"} == {
        "float16", "bfloat16"}
    assert set(Counter(s.family for s in steps)) == set(sm.FAMILIES)
    assert {s.kernel for s in steps} == {"v1", "v2"}
    batches = [s.attn.num_seqs for s in steps]
    assert min(batches) == 1 and max(batches) > 128 and max(batches) <= sm.MAX_BATCH
    assert max(s.attn.max_seq_len for s in steps) > 16384
    for s in steps:
        a = s.attn
        g = a.num_heads // a.num_kv_heads
        assert a.num_kv_heads in (sm.KV_HEADS_MHA if g == 1 else sm.KV_HEADS_GQA)
        assert s.seq_lens is not None and len(s.seq_lens) == a.num_seqs
        assert a.max_seq_len == max(s.seq_lens) <= sm.MAX_LEN and min(s.seq_lens) >= 1
        # vLLM's own v1/v2 choice, made on the longest sequence (its max_seq_len)
        assert s.kernel == choose_kernel(max(s.seq_lens), a.num_seqs, a.num_heads)


def test_length_families_follow_their_rules() -> None:
    steps = sm.draw_sample(_spec(n=600, seed=3))
    by = {f: [s for s in steps if s.family == f] for f in sm.FAMILIES}
    for s in by["uniform"]:
        assert len(set(s.seq_lens)) == 1 and sm.MIN_LEN <= s.seq_lens[0] <= sm.MAX_LEN
    assert any(len(set(s.seq_lens)) > 1 for s in by["ragged"])
    for s in by["longtail"]:
        lens = s.seq_lens
        longest = max(lens)
        n_long = lens.count(longest)
        rest = [n for n in lens if n != longest]
        assert len(lens) >= 2 and rest
        assert 1 <= n_long <= max(1, min(sm.MAX_TAIL_SEQS, len(lens) // 8))
        # the few long ones are 10-100x longer than the rest (rounding aside)
        # (the rest reach down to floor(S / 2): at S = 17, 8 tokens, 2.125 F below S x F)
        assert 9.9 <= longest / max(rest) <= 200.5 and longest / min(rest) <= 213
    # a tail is not always at the end of the batch: it was shuffled in
    assert any(s.seq_lens[-1] != max(s.seq_lens) for s in by["longtail"])


def test_the_build_constrains_what_is_drawn(tmp_path: Path) -> None:
    def built(heads, blocks, kv):
        return BuiltOps(tree="t", variant="v", namespace="n", so_path=tmp_path, so_sha256="",
                        head_sizes=heads, block_sizes=blocks, kv_dtypes=kv,
                        manifest_path=tmp_path)

    inst = sm.Instantiations.common_to([built((64, 128), (16, 32), ("fp16", "fp8")),
                                        built((128, 256), (16,), ("fp16", "bf16", "fp8"))])
    assert inst.to_dict()["head_sizes"] == [128] and inst.to_dict()["block_sizes"] == [16]
    # the first build's fp8 cache is compiled for fp16 queries only (compiled_combos)
    assert {(c[2], c[3]) for c in inst.combos} == {("float16", "auto"), ("float16", "fp8")}
    steps = sm.draw_sample(_spec(n=200, inst=inst))
    assert {(s.attn.head_size, s.attn.block_size, s.attn.dtype, s.attn.kv_cache_dtype)
            for s in steps} == {(128, 16, "float16", "auto"), (128, 16, "float16", "fp8")}
    narrow = FULL.narrowed(head_sizes=(256,), block_sizes=(32,), caches=("bf16",))
    assert narrow.combos == {(256, 32, "bfloat16", "auto")}
    with pytest.raises(ConfigError, match="share no instantiation") as exc:
        inst.narrowed(head_sizes=(64,))
    assert "narrow the sample" in exc.value.fix


def test_memory_cap_holds_and_binds() -> None:
    cap = 64 << 20
    capped = sm.draw_sample(_spec(n=300, seed=5, max_kv=cap))
    assert all(kv_bytes_read(s.attn, s.seq_lens) <= cap for s in capped)
    loose = sm.draw_sample(_spec(n=300, seed=5))
    assert any(kv_bytes_read(s.attn, s.seq_lens) > cap for s in loose)  # the cap did something
    assert all(kv_bytes_read(s.attn, s.seq_lens) <= sm.DEFAULT_MAX_KV_BYTES for s in loose)
    with pytest.raises(ConfigError, match="64 MiB"):
        _spec(max_kv=1 << 20)


def test_parse_bytes() -> None:
    assert sm.parse_bytes("4g") == 4 << 30 and sm.parse_bytes("512MiB") == 512 << 20
    assert sm.parse_bytes("1.5k") == 1536 and sm.parse_bytes("100") == 100
    for bad in ("lots", "-1g", "0"):
        with pytest.raises(ConfigError):
            sm.parse_bytes(bad)


# ----------------------------------------------------------------------------- ragged inputs
# What a ragged step hands the kernel (torch tensors) is in tests/integration/test_bench_sample.py.


def test_a_step_vllm_runs_eagerly_is_timed_once_under_graph_and_eager() -> None:
    """A step longer than the capture length is eager in vLLM: asked for graph and eager timing
    it runs once, as the eager row. That it is timed eagerly when asked for graph is
    test_a_step_vllm_runs_eagerly_is_timed_eagerly_once in
    tests/integration/test_bench_sample.py."""
    attn = AttnShape(num_seqs=2, num_heads=8, num_kv_heads=2, head_size=64, block_size=16,
                     max_seq_len=9000)
    shape = BenchShape("G4/kv2/d64", attn, "v2", seq_lens=(9000, 3), family="ragged")
    graph = k.KernelBenchConfig(mode="hot", rounds=3, target_sample_ms=0.0, min_launches=1)
    eager = k.KernelBenchConfig(mode="hot", rounds=3, target_sample_ms=0.0, timing="eager")
    wanted = k.timed_once([graph, eager])
    short = BenchShape("x", AttnShape(num_seqs=2, num_heads=8, num_kv_heads=2, head_size=64,
                                      block_size=16, max_seq_len=100), "v1")
    assert not wanted(shape, graph) and wanted(shape, eager)
    assert wanted(short, graph) and wanted(short, eager)
    assert k.timed_once([graph])(shape, graph)  # no eager config: the graph one times it


def test_time_limit_leaves_the_rest_not_run() -> None:
    attn = AttnShape(num_seqs=1, num_heads=8, num_kv_heads=2, head_size=64, block_size=16,
                     max_seq_len=100)
    shapes = [BenchShape(f"s{i}", attn, "v1") for i in range(4)]
    ticks = iter([0.0, 0.0, 5.0, 11.0, 12.0])
    measured: list[str] = []

    def measure(shape, config):
        measured.append(shape.preset)
        return kr.ShapeResult(shape, config.mode, None, 0, (), None, "fake", "skipped",
                             timing=config.timing)

    results, aborted = k.run_shapes(shapes, [k.KernelBenchConfig(timing="eager")], measure,
                                    lambda: "", lambda: None, lambda m: None, time_limit_s=10,
                                    clock=lambda: next(ticks))
    assert measured == ["s0", "s1"] and aborted == ""
    assert [r.status for r in results] == ["skipped", "skipped", "not run", "not run"]
    assert "time limit of 10 s" in results[2].error and results[3].timing == "eager"


def test_a_sample_runs_each_steps_timings_side_by_side() -> None:
    attn = AttnShape(num_seqs=1, num_heads=8, num_kv_heads=2, head_size=64, block_size=16,
                     max_seq_len=100)
    shapes = [BenchShape(f"s{i}", attn, "v1") for i in range(2)]
    configs = [k.KernelBenchConfig(timing="graph"), k.KernelBenchConfig(timing="eager")]
    seen: list[tuple[str, str]] = []

    def measure(shape, config):
        seen.append((shape.preset, config.timing))
        return kr.ShapeResult(shape, config.mode, None, 0, (), None, "fake", "skipped",
                             timing=config.timing)

    for major, want in ((True, [("s0", "graph"), ("s0", "eager"), ("s1", "graph"),
                                ("s1", "eager")]),
                        (False, [("s0", "graph"), ("s1", "graph"), ("s0", "eager"),
                                 ("s1", "eager")])):
        seen.clear()
        k.run_shapes(shapes, configs, measure, lambda: "", lambda: None, lambda m: None,
                     shape_major=major)
        assert seen == want


# ----------------------------------------------------------------------------- the report


RATIOS = {  # per variant, per step: the ratio stock/variant
    "launch": [1.02, 1.00, 0.97, 1.05, 1.01, 0.99, 1.10, 1.00, 1.03, 0.98, 1.00, 1.04],
    "gqa_off": [1.20, 1.15, 1.00, 1.40, 1.10, 0.95, 1.30, 1.05, 1.22, 1.01, 1.12, 1.25],
    "patched": [1.50, 1.30, 0.90, 1.80, 1.20, 0.97, 1.60, 1.10, 1.45, 1.05, 1.19, 1.70],
    "control": [1.00, 1.01, 0.99, 1.00, 1.02, 0.98, 1.00, 1.00, 0.995, 1.005, 1.01, 0.99],
}
KV = [1 << 20, 300 << 20, 10 << 20, 1 << 30, 2 << 20, 5 << 20, 256 << 20, 3 << 20, 4 << 20,
      255 << 20, 6 << 20, 7 << 20]


def _stock_us(timing: str, step: int) -> float:
    """Stock's time per call: 10 us under graph replay; eagerly 20 us on even steps (the host
    paces them) and 11 us on odd ones (the GPU does)."""
    if timing == "graph":
        return 10.0
    return 20.0 if step % 2 == 0 else 11.0


def _doc(timings=("graph", "eager")) -> dict:
    names = ["baseline", *RATIOS]
    results = []
    for t in timings:
        for i, kv in enumerate(KV):
            stock_us = _stock_us(t, i)
            variants = {"baseline": {"speedup": None, "bw_fraction": 0.4,
                                     "time_us": {"median": stock_us}}}
            for n, rs in RATIOS.items():
                x = rs[i] * (0.9 if t == "eager" else 1.0)
                variants[n] = {"speedup": {"median": x, "min": x - 0.01, "max": x + 0.01},
                               "bw_fraction": 0.4 * x, "time_us": {"median": stock_us / x}}
            results.append({"timing": t, "status": "measured", "label": f"step{i}",
                            "preset": "G4/kv2/d128", "batch": 3, "context": 100 + i,
                            "seq_lens": [100 + i, 50, 7], "family": "ragged", "kernel": "v1",
                            "kv_bytes": kv, "variants": variants, "bitwise_equal": True,
                            "mode": "cold"})
        results.append({"timing": t, "status": "skipped", "label": "big", "variants": {},
                        "kv_bytes": 1 << 34, "error": "needs memory"})
    return {"kind": "sample", "results": results, "meta": {
        "baseline": "baseline", "variants": [{"name": n} for n in names],
        "sample": {"n": 13, "seed": 5, "max_kv_bytes": 4 << 30,
                   "instantiations": {"head_sizes": [128], "block_sizes": [16],
                                      "caches": ["fp16"]}},
        "device": {"name": "H200", "l2_bytes": 60 << 20}, "copy_bw_bytes_per_s": 4e12,
        "started": "now", "configs": [{"mode": "cold"}],
        "not_measured": [{"timing": t, "label": "big", "status": "skipped",
                          "reason": "needs memory"} for t in timings]}}


def test_distribution_statistics_are_right() -> None:
    doc = _doc()
    dist = stats.distribution(doc, "graph")
    for n, rs in RATIOS.items():
        d = dist[n]
        assert d["n"] == len(rs)
        assert d["min"] == min(rs) and d["max"] == max(rs)
        assert d["median"] == pytest.approx(statistics.median(rs))
        # p5 by linear interpolation between closest ranks: statistics' "inclusive" method
        assert d["p5"] == pytest.approx(statistics.quantiles(rs, n=20, method="inclusive")[0])
        assert d["geomean"] == pytest.approx(statistics.geometric_mean(rs))
        assert d["below_1"] == sum(1 for x in rs if x < 1)
        assert d["below_target"] == sum(1 for x in rs if x < 0.99)
    eager = stats.distribution(doc, "eager")["patched"]
    assert eager["geomean"] == pytest.approx(0.9 * statistics.geometric_mean(RATIOS["patched"]))


def test_worst_steps_band_large_steps_and_attribution() -> None:
    doc = _doc()
    worst = stats.worst_steps(doc, "graph", "patched")
    order = sorted(range(len(KV)), key=lambda i: RATIOS["patched"][i])
    assert [w["step"] for w in worst] == order[:10]
    assert worst[0]["ratio"] == 0.90 and worst[0]["control"] == RATIOS["control"][2]
    assert worst[0]["kv_bytes"] == KV[2] and worst[0]["mean_len"] == pytest.approx(159 / 3)

    band = stats.aa_band(doc, "graph")
    ctl = RATIOS["control"]
    assert band is not None and band["min"] == min(ctl) and band["max"] == max(ctl)
    q = statistics.quantiles(ctl, n=20, method="inclusive")
    assert (band["p5"], band["p95"]) == pytest.approx((q[0], q[-1]))

    large = stats.large_steps(doc, "graph")
    assert [s["step"] for s in large] == [i for i, kv in enumerate(KV) if kv >= 256 << 20]
    assert large[0]["bw"]["patched"] == pytest.approx(0.4 * RATIOS["patched"][1])

    attr = stats.attribution(doc, "graph")
    assert [(a["from"], a["to"]) for a in attr] == [
        ("baseline", "launch"), ("launch", "gqa_off"), ("gqa_off", "patched"),
        ("baseline", "control")]
    chain = [[1.0] * len(KV), RATIOS["launch"], RATIOS["gqa_off"], RATIOS["patched"]]
    # strict=False: the chain's three steps are attr's first three; the fourth (control) is
    # not a step of the chain
    for a, prev, nxt in zip(attr, chain, chain[1:], strict=False):
        assert a["geomean"] == pytest.approx(
            statistics.geometric_mean([y / x for x, y in zip(prev, nxt, strict=True)]))
        assert a["worse"] == sum(1 for x, y in zip(prev, nxt, strict=True) if y < x)
    # the chain's steps multiply to the last tree's geomean
    assert math.prod(a["geomean"] for a in attr[:3]) == pytest.approx(
        statistics.geometric_mean(RATIOS["patched"]))
    assert attr[3]["geomean"] == pytest.approx(statistics.geometric_mean(ctl))


def test_attribution_needs_the_ablation_trees_and_band_needs_control() -> None:
    doc = _doc(("graph",))
    doc["meta"]["variants"] = [{"name": "baseline"}, {"name": "patched"}]
    for r in doc["results"]:
        for n in ("launch", "gqa_off", "control"):
            r["variants"].pop(n, None)
    attr = stats.attribution(doc, "graph")
    assert [(a["from"], a["to"]) for a in attr] == [("baseline", "patched")]
    assert stats.aa_band(doc, "graph") is None
    assert "No A/A band" in rep.sample_markdown(doc)


def test_markdown_and_png(tmp_path: Path) -> None:
    from kvprefetch.bench.report import render_markdown, write_outputs

    doc = _doc()
    md = render_markdown(doc)
    assert "## graph (CUDA-graph replay)" in md and "## eager" in md
    assert f"{statistics.geometric_mean(RATIOS['patched']):.3f}x" in md
    assert "Worst 10 steps of patched" in md and "A/A band (control vs stock, 12 steps)" in md
    assert "Steps with KV >= 256 MiB: fraction of copy bandwidth (3 steps)" in md
    not_measured = md.split("## Not measured")[1]
    assert "| graph | big | skipped | needs memory |" in not_measured
    assert "big" not in md.split("## Every step")[1].split("## Not measured")[0]
    paths = write_outputs(doc, tmp_path, "s", ("json", "md", "png"))
    assert [p.name for p in paths] == ["s.json", "s.md", "s.png"]
    assert paths[2].stat().st_size > 1000


# ----------------------------------------------------------------------------- the CLI


def _invoke(args: list[str]):
    return CliRunner().invoke(bench, args, catch_exceptions=True)


def _fake_builds(workdir: Path, heads=(128,), blocks=(16,), kv=("fp16",)) -> None:
    for tree in ("baseline", "patched", "control"):
        d = workdir / "build" / tree / "k1"
        d.mkdir(parents=True)
        (d / f"kvprefetch_{tree}_C.so").write_bytes(b"x")
        (d / "manifest.json").write_text(json.dumps({
            "tree": tree, "variant": tree, "namespace": f"kvprefetch_{tree}",
            "so_path": f"kvprefetch_{tree}_C.so", "so_sha256": "0", "head_sizes": list(heads),
            "block_sizes": list(blocks), "kv_dtypes": list(kv)}))


def test_cli_samples_within_the_builds(tmp_path: Path) -> None:
    _fake_builds(tmp_path, heads=(128, 256), blocks=(16,), kv=("fp16", "bf16"))
    res = _invoke(["kernel", "--workdir", str(tmp_path), "--dry-run", "--json", "--sample", "40",
                   "--sample-seed", "9", "--timing", "graph,eager"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert plan["shapes"] == 80 and plan["timings"] == ["graph", "eager"]
    assert plan["sample"]["seed"] == 9 and plan["matrix"] is None
    assert {(s["head_size"], s["block_size"], s["kv_cache_dtype"]) for s in plan["shape_list"]} \
        <= {(128, 16, "auto"), (256, 16, "auto")}
    again = json.loads(_invoke(["kernel", "--workdir", str(tmp_path), "--dry-run", "--json",
                                "--sample", "40", "--sample-seed", "9"]).stdout)
    assert again["shape_list"] == plan["shape_list"]
    res = _invoke(["kernel", "--workdir", str(tmp_path), "--dry-run", "--sample", "3",
                   "--sample-caches", "bf16"])
    assert res.exit_code == 0 and "bfloat16" in res.stdout
    assert not re.search(r"(?<!b)float16", res.stdout)


@pytest.mark.parametrize(("args", "cause", "fix"), [
    (["--sample", "0"], "at least one step", "--sample N"),
    (["--sample", "5", "--batch", "8"], "--batch cannot be given", "drop them"),
    (["--sample", "5", "--matrix", "issue6"], "--matrix", "drop them"),
    (["--sample-seed", "3"], "only apply to a sampled run", "add --sample N"),
    (["--sample", "5", "--sample-max-kv", "1m"], "below 64 MiB", "64m or more"),
    (["--sample", "5", "--sample-max-kv", "big"], "not a size", "4g"),
    (["--sample", "5", "--sample-head-sizes", "80"], "share no instantiation", "narrow"),
    (["--sample", "5", "--sample-caches", "fp4"], "unknown cache kind", "subset of fp16,bf16,fp8"),
    (["--sample", "5", "--sample-block-sizes", "a"], "not a comma-separated", "64,128"),
    (["--timing", "warp"], "unknown warp", "--timing graph,eager"),
])
def test_cli_refuses_bad_sample_options(tmp_path: Path, args: list[str], cause: str,
                                        fix: str) -> None:
    res = _invoke(["kernel", "--workdir", str(tmp_path), "--dry-run", *args])
    assert isinstance(res.exception, ConfigError), res.output
    assert cause in res.exception.cause and fix in res.exception.fix


def test_host_overhead_reads_host_bound_steps_only() -> None:
    """A variant's extra eager time per call over stock's, on the steps where stock's eager
    time is at least HOST_BOUND times its graph time (the even steps here), and only where both
    timings ran."""
    doc = _doc()
    got = stats.host_overhead(doc)
    assert set(got) == set(RATIOS)
    for n, rs in RATIOS.items():
        want = [20.0 / (rs[i] * 0.9) - 20.0 for i in range(0, len(KV), 2)]
        assert got[n] == pytest.approx(want)
    assert stats.host_overhead(_doc(timings=("graph",))) == {}
    table = rep.host_table([doc])
    assert len(table) == 2 + len(RATIOS) and table[2].startswith("| 5 | launch | 6 |")


def test_twin_steps_follow_the_runs_own_rule_for_partial_groups() -> None:
    """A step of 7 query heads per kv head had no twin in a run made before the twins took
    partial groups (no ``meta.twin_partial_groups``) and has the mirror's twin in a run that
    records it: the report classifies each run's steps by that run's rule."""
    doc = _doc(("graph",))
    row = doc["results"][0]
    row.update({"dtype": "float16", "kernel": "v1", "kv_cache_dtype": "auto", "head_size": 128,
                "block_size": 16, "num_heads": 28, "num_kv_heads": 4, "batch": 96,
                "context": 1024})
    doc["meta"]["twin_at"] = [[128, 16, True]]
    assert rules.twin_steps(doc, "graph")[0]["twin"] == "none"
    doc["meta"]["twin_partial_groups"] = True
    step = rules.twin_steps(doc, "graph")[0]
    assert step["twin"] == "2x2" and step["row"] == "2x2, last group partial"
    assert "| graph | 2x2, last group partial | 1 |" in "\n".join(rep.twins_table([doc]))


def test_twin_steps_follow_the_runs_own_guard_for_short_ctas() -> None:
    """v1 b98 of a 64-head, 4-kv-head model at head 64 / block 32 (bf16), longest sequence
    1625 tokens: a run made before `auto` guarded against short CTAs (no
    ``meta.twin_least_guard``) ran the 2x2 twin there; a run that records the guard ran vLLM's
    kernel. The report classifies each run's step by that run's rule."""
    doc = _doc(("graph",))
    row = doc["results"][0]
    row.update({"dtype": "bfloat16", "kernel": "v1", "kv_cache_dtype": "auto", "head_size": 64,
                "block_size": 32, "num_heads": 64, "num_kv_heads": 4, "batch": 98,
                "context": 1625})
    doc["meta"].update({"twin_at": [[64, 32, True]], "twin_partial_groups": True})
    assert rules.twin_steps(doc, "graph")[0]["twin"] == "2x2"
    doc["meta"]["twin_least_guard"] = True
    step = rules.twin_steps(doc, "graph")[0]
    assert step["twin"] == "none" and step["row"] == "none: the short-CTA guard declined a twin"
    assert ("| graph | none: the short-CTA guard declined a twin | 1 |"
            in "\n".join(rep.twins_table([doc])))
