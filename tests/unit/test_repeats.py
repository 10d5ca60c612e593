"""`report --repeats` (kvprefetch.bench.repeats) and the L2-resident bound of the kernel report.
The bench documents are built from synthetic per-round samples through the same functions the
GPU run uses (bench.kernel.build_results); no GPU is involved in combining or rendering. The command
in a child process is in tests/integration/test_repeats.py."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from kvprefetch.bench import kernel_results as kr
from kvprefetch.bench import report
from kvprefetch.bench.matrix import BenchMatrix
from kvprefetch.bench.repeats import combine
from kvprefetch.errors import BenchError

L2 = 60 * 2**20
NAMES = ("baseline", "patched", "control")


def run_doc(ratio: Callable[[str, int, int], float], modes: tuple[str, ...] = ("cold",),
            per_layer: Callable[[int, int], int] = lambda b, c: 1,
            hot_factor: float = 1.0) -> dict:
    """One bench kernel document over batch {1, 64} x context {512, 16k}; ``ratio(variant,
    batch, context)`` is the variant's speedup (stock time / variant time) in every round."""
    results = []
    for mode in modes:
        for s in BenchMatrix(batches=(1, 64), contexts=(512, 16384)).shapes():
            b, c = s.attn.num_seqs, s.attn.max_seq_len
            base = [t * (1.0 if mode == "cold" else hot_factor) for t in (20.0, 20.2, 20.4)]
            samples = {n: [t / (1.0 if n == "baseline" else ratio(n, b, c)) for t in base]
                       for n in NAMES}
            plan = kr.LaunchPlan(layers=1, launches=8, replays=3,
                                bytes_per_layer=per_layer(b, c), est_launch_us=1)
            r = kr.build_results(s, mode, plan, 1_000_000, list(NAMES), samples, 4e12,
                                {"patched": True, "control": True}, dict.fromkeys(NAMES, True))
            results.append(r.to_dict())
    return {"kind": "kernel", "schema": 1,
            "meta": {"started": "2026-11-29T18:00:00Z", "seconds": 3.0,
                     "device": {"name": "NVIDIA H200", "sm_count": 132, "l2_bytes": L2},
                     "copy_bw_bytes_per_s": 4e12, "baseline": "baseline",
                     "variants": [{"name": n} for n in NAMES], "command": ["bench", "kernel"]},
            "results": results}


def three_runs() -> list[dict]:
    """b1 512: patched 0.98 in every run, beyond the A/A band (a real loss);
    b64 512: patched 0.995 like the control there (the A/A band is 0.005: not beyond it);
    b1 16k: patched slower in one run only; b64 16k: a steady 1.2x win."""
    docs = []
    for run, jitter in enumerate((0.0, 0.002, -0.002)):
        def ratio(n: str, b: int, c: int, run: int = run, jitter: float = jitter) -> float:
            if n == "control":
                return 0.995 if (b, c) == (64, 512) else 1.0 + jitter
            return {(1, 512): 0.98, (64, 512): 0.995, (1, 16384): 0.999 if run == 1 else 1.01,
                    (64, 16384): 1.2 + jitter}[(b, c)]
        docs.append(run_doc(ratio))
    return docs


def test_combine_flags_a_loss_in_every_run_and_beyond_the_aa_band() -> None:
    doc = combine(three_runs())
    assert doc["kind"] == "repeats" and doc["meta"]["runs"] == 3
    assert doc["meta"]["control"] == "control"
    assert doc["meta"]["aa_band"] == pytest.approx(0.005)
    rows = {(r["batch"], r["context"]): r["variants"]["patched"] for r in doc["results"]}
    assert rows[(1, 512)]["slower_every_run"] and rows[(1, 512)]["loss_beyond_aa"]
    assert rows[(64, 512)]["slower_every_run"]
    assert not rows[(64, 512)]["loss_beyond_aa"]   # no more than the A/A measures
    assert not rows[(1, 16384)]["slower_every_run"]          # slower in one run of three
    assert rows[(64, 16384)]["median"] == pytest.approx(1.2)
    assert rows[(64, 16384)]["min"] == pytest.approx(1.198)
    s = {x["variant"]: x for x in doc["summary"]}
    assert s["patched"]["slower_every_run"] == 2 and s["patched"]["loss_beyond_aa"] == 1
    assert s["control"]["loss_beyond_aa"] is None
    assert s["patched"]["worst"] == {"batch": 1, "context": 512, "median": pytest.approx(0.98)}
    assert len(s["patched"]["geomean_per_run"]) == 3
    md = report.render_markdown(doc)
    assert "# bench kernel, 3 runs: patched, control vs baseline" in md
    assert "0.980 0.980 0.980 [0.980-0.980] **slower every run** **loss beyond A/A**" in md
    assert "**A/A band** ±0.005" in md


def test_combine_refuses_what_cannot_be_compared() -> None:
    one = three_runs()[0]
    with pytest.raises(BenchError, match="at least two"):
        combine([one])
    other = json.loads(json.dumps(one))
    other["meta"]["variants"] = [{"name": n} for n in ("baseline", "patched")]
    with pytest.raises(BenchError, match="same variants"):
        combine([one, other])
    with pytest.raises(BenchError, match="bench kernel documents only"):
        combine([one, {"kind": "ncu", "meta": {}}])
    moved = json.loads(json.dumps(one))
    for r in moved["results"]:
        r["batch"] += 1
    with pytest.raises(BenchError, match="no measured shape in common"):
        combine([one, moved])


def test_l2_bound_only_where_one_layer_fits_the_l2() -> None:
    """Hot mode 1.5x faster for stock; patched 1.1x faster than stock when hot. Only the
    shapes whose per-layer KV fits the 60 MiB L2 (context 512 here) get a bound."""
    doc = run_doc(lambda n, b, c: 1.1 if n == "patched" else 1.0, modes=("cold", "hot"),
                  per_layer=lambda b, c: (4 if c == 512 else 256) * 2**20, hot_factor=1 / 1.5)
    rows = report.l2_ceiling(doc)
    assert [(r["batch"], r["context"]) for r in rows] == [(1, 512), (64, 512)]
    assert rows[0]["bound"] == pytest.approx(1.5)
    assert rows[0]["variant_bound"]["patched"] == pytest.approx(1.65)
    md = report.render_markdown(doc)
    assert "## L2-resident bound" in md and "| hot | 20.2 | 13.5 | 1.500x | 1.650x |" in md
    assert "| hot | 2 | 1.500x | 1.650x | 1.500x |" in md  # geomean over the two shapes
    # a cold-only document has no such section
    assert "L2-resident bound" not in report.render_markdown(run_doc(lambda n, b, c: 1.0))


def test_aliased_bound_at_every_shape_and_after_hot() -> None:
    """Aliased mode gives a bound at every shape, whatever its size; hot rows come first and
    only where one layer fits. Each resident mode gets its own geometric mean."""
    doc = run_doc(lambda n, b, c: 1.1 if n == "patched" else 1.0,
                  modes=("cold", "hot", "aliased"),
                  per_layer=lambda b, c: (4 if c == 512 else 256) * 2**20, hot_factor=1 / 1.25)
    rows = report.l2_ceiling(doc)
    assert [(r["resident"], r["batch"], r["context"]) for r in rows] == [
        ("hot", 1, 512), ("hot", 64, 512), ("aliased", 1, 512), ("aliased", 1, 16384),
        ("aliased", 64, 512), ("aliased", 64, 16384)]
    assert all(r["bound"] == pytest.approx(1.25) for r in rows)
    md = report.render_markdown(doc)
    assert "| aliased | 4 | 1.250x | 1.375x | 1.250x |" in md
