"""kvprefetch.bench.report and the `report` command: markdown tables and PNG plots from the
JSON documents bench kernel / ncu / e2e and the identity check write. The kernel document is
built from synthetic per-round samples through the same functions the GPU run uses; the ncu one
from the saved (hand-made, ncu-format) CSV samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprefetch.bench import documents, ncu, report
from kvprefetch.bench import kernel_results as kr
from kvprefetch.bench.matrix import BenchMatrix, shapes_from_specs
from kvprefetch.cli.report import report as report_cmd
from kvprefetch.errors import BenchError

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def kernel_doc() -> dict:
    shapes = BenchMatrix(batches=(1, 64), contexts=(512, 16384)).shapes()
    results = []
    for i, s in enumerate(shapes):
        base = [10.0 + i, 10.5 + i, 11.0 + i]
        fast = 1.3 if s.attn.num_seqs == 1 else 0.97   # a win at batch 1, a loss at 64
        samples = {"baseline": base, "patched": [b / fast for b in base],
                   "seed": [b / 1.01 for b in base]}
        plan = kr.LaunchPlan(layers=2, launches=8, replays=3, bytes_per_layer=1, est_launch_us=1)
        r = kr.build_results(s, "cold", plan, 2_000_000, ["baseline", "patched", "seed"],
                            samples, 4.3e12, {"patched": True, "seed": True},
                            {"baseline": True, "patched": True, "seed": True})
        results.append(r.to_dict())
    results.append(kr.ShapeResult(shapes[0], "hot", None, 0, (), None,
                                 "instantiation not in build(s): seed").to_dict())
    return {"kind": "kernel", "schema": 1,
            "meta": {"started": "2026-11-29T14:00:00Z", "seconds": 12.0,
                     "device": {"name": "NVIDIA H200", "sm_count": 132, "l2_bytes": 60_000_000,
                                "torch": "2.11.0", "cuda": "13.0"},
                     "copy_bw_bytes_per_s": 4.3e12, "baseline": "baseline",
                     "variants": [{"name": n, "namespace": f"kvprefetch_{n}", "so_sha256": "ab"}
                                  for n in ("baseline", "patched", "seed")],
                     "command": ["kvprefetch", "bench", "kernel"]},
            "results": results}


def ncu_doc() -> dict:
    base = ncu.aggregate(ncu.parse_ncu_csv((SAMPLES / "ncu_raw_baseline.csv").read_text()))
    pat = ncu.aggregate(ncu.parse_ncu_csv((SAMPLES / "ncu_raw_patched.csv").read_text()))
    s = shapes_from_specs(["1x4k"])[0]
    return {"kind": "ncu", "schema": 1,
            "meta": {"started": "x", "baseline": "baseline", "variants": ["baseline", "patched"],
                     "options": {"launch_skip": 20, "launch_count": 10, "kernel_regex":
                                 ncu.KERNEL_REGEX, "metrics": list(ncu.METRICS)}},
            "shapes": [{**s.to_dict(), "label": s.label, "csv": {},
                        "variants": {"baseline": [ncu.summary_dict(x) for x in base],
                                     "patched": [ncu.summary_dict(x) for x in pat]},
                        "deltas": {"patched": ncu.deltas(base, pat)}}]}


def test_kernel_summary_counts_wins_and_losses() -> None:
    summ = {(s["mode"], s["variant"]): s for s in report.kernel_summary(kernel_doc())}
    p = summ[("cold", "patched")]
    assert p["shapes"] == 4
    assert p["geomean_speedup"] == pytest.approx((1.3 * 1.3 * 0.97 * 0.97) ** 0.25)
    assert p["slower_median"] == 2 and p["slower_beyond_spread"] == 2
    assert p["worst"]["batch"] == 64 and p["best"]["batch"] == 1
    assert p["all_bitwise_equal"] is True
    assert summ[("cold", "seed")]["geomean_speedup"] == pytest.approx(1.01)
    assert ("hot", "patched") not in summ  # only a skipped row in hot mode


def test_kernel_markdown() -> None:
    md = report.render_markdown(kernel_doc())
    assert md.startswith("# bench kernel: patched, seed vs baseline")
    assert "4.30 TB/s" in md and "NVIDIA H200" in md
    assert "| 1 | 512 | v1 | 2 |" in md
    assert "1.300 [1.300-1.300]" in md and "0.970 [0.970-0.970]" in md
    assert "skipped: instantiation not in build(s): seed" in md
    assert "## llama-3.1-8b, float16, block 16, cold" in md


def test_kernel_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    p = report.render_png(kernel_doc(), tmp_path / "k.png")
    assert p is not None and p.read_bytes()[:8] == PNG_MAGIC


def test_ncu_markdown_and_png(tmp_path: Path) -> None:
    doc = ncu_doc()
    md = report.render_markdown(doc)
    assert "application replay, --cache-control all, --clock-control none" in md
    assert "paged_attention_v2_kernel | patched" in md
    assert "-20.7" in md  # long-scoreboard stall change in points (41.5 - 62.2)
    pytest.importorskip("matplotlib")
    assert report.render_png(doc, tmp_path / "n.png").read_bytes()[:8] == PNG_MAGIC


def test_e2e_markdown_and_identity_markdown(tmp_path: Path) -> None:
    from kvprefetch.bench import e2e

    envs = (e2e.E2EEnv("baseline", Path("/b")), e2e.E2EEnv("patched", Path("/p")))
    plan = e2e.E2EPlan(envs=envs, model_dir=tmp_path, out_dir=tmp_path, max_num_seqs=(8,),
                       repeats=1)
    sample = json.loads((SAMPLES / "vllm_throughput.json").read_text())
    res = [(r, dict(sample, tokens_per_second=sample["tokens_per_second"] *
                    (1.8 if r.env.name == "patched" else 1.0))) for r in e2e.plan_runs(plan)]
    doc = {"kind": "e2e", "meta": {"input_len": 512, "output_len": 512, "repeats": 1,
                                   "environment": e2e.E2E_ENV, "model_dir": "m",
                                   "dtype": "float16", "started": "x",
                                   "envs": [{"name": "baseline"}, {"name": "patched"}]},
           "rows": e2e.collect(res, plan)}
    md = report.render_markdown(doc)
    assert "VLLM_USE_V1=0" in md and "1.800 [1.800-1.800]" in md
    if __import__("importlib").util.find_spec("matplotlib"):
        assert report.render_png(doc, tmp_path / "e.png").read_bytes()[:8] == PNG_MAGIC
    from kvprefetch.verify.numerics import not_checked

    idoc = not_checked("no CUDA device").to_dict()
    imd = report.render_markdown(idoc)
    assert imd.startswith("# numerical identity: not checked") and "no CUDA device" in imd
    assert report.render_png(idoc, tmp_path / "i.png") is None


def test_load_document_rejects_other_json(tmp_path: Path) -> None:
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"hello": 1}))
    with pytest.raises(BenchError, match="not a kvprefetch result"):
        documents.load_document(p)
    p.write_text("{not json")
    with pytest.raises(BenchError, match="cannot read"):
        documents.load_document(p)


def test_report_command_writes_md_and_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    src = tmp_path / "kernel-cold.json"
    src.write_text(json.dumps(kernel_doc()))
    res = CliRunner().invoke(report_cmd, [str(src), "--out", str(tmp_path / "r"), "--json"])
    assert res.exit_code == 0, res.output
    written = json.loads(res.stdout)[str(src)]
    assert [Path(w).name for w in written] == ["kernel-cold.md", "kernel-cold.png"]
    assert (tmp_path / "r" / "kernel-cold.md").read_text().startswith("# bench kernel")
    bad = CliRunner().invoke(report_cmd, [str(src), "--formats", "pdf"])
    assert bad.exit_code != 0


def test_geomean() -> None:
    assert report.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert report.geomean([]) is None


def test_eager_rows_of_a_graph_run_get_their_own_summary_row() -> None:
    """In vLLM's call a graph-timed matrix holds eager rows too (a context past the capture
    length runs eagerly in vLLM): the summary keeps them apart ("cold eager"), and merging two
    shards that hold the same shape once per timing is not a duplicate."""
    from kvprefetch.bench.merge import merge_kernel_docs

    doc = kernel_doc()
    long = [r for r in doc["results"] if r["context"] == 16384 and r["mode"] == "cold"]
    assert long
    for r in long:
        r["timing"] = "eager"
    modes = {(s["mode"], s["variant"]): s["shapes"] for s in report.kernel_summary(doc)}
    assert modes[("cold", "patched")] == modes[("cold eager", "patched")] == len(long)
    graph_copy = {**doc, "results": [{**r, "timing": "graph"} for r in long]}
    merged = merge_kernel_docs([doc, graph_copy], ["a.json", "b.json"], force=True)
    assert len(merged["results"]) == len(doc["results"]) + len(long)
