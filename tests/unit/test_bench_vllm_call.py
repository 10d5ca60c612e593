"""bench/vllm_call.py, the one model of vLLM 0.10.2's call of the decode kernel, against the facts
its docstring cites from vLLM's source; the launch it makes of a sampled step under both calls;
the CLI options that reach it and the record they leave; old results (no ``meta.call``) reading
as the exact call. Pure Python, no GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprefetch.bench import kernel as k
from kvprefetch.bench import sample as sm
from kvprefetch.bench import vllm_call as vc
from kvprefetch.bench.documents import load_document
from kvprefetch.bench.report import render_markdown
from kvprefetch.cli.bench import bench
from kvprefetch.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_capture_sizes_are_v0s() -> None:
    """V0 captures 1, 2, 4 and multiples of 8 up to the first size holding max_num_seqs (256
    by default); a batch is padded to the next size: 20 runs as 24, 257 has none (eager)."""
    sizes = vc.capture_sizes()
    assert sizes == (1, 2, 4, *range(8, 257, 8))
    assert vc.capture_sizes(20) == (1, 2, 4, 8, 16, 24)
    assert [vc.graph_bucket(b, sizes) for b in (1, 3, 5, 9, 20, 127, 256, 257)] == [
        1, 4, 8, 16, 24, 128, 256, None]
    assert vc.VllmCall().buckets[-1] == 256


def test_capture_length_and_eager_conditions() -> None:
    """The capture length is min(max_seq_len_to_capture, max_model_len); a step is eager above
    it, above the largest bucket, or under enforce_eager."""
    assert vc.VllmCall().capture_len == 8192
    assert vc.VllmCall(max_model_len=2048).capture_len == 2048
    assert vc.VllmCall(max_model_len=131072).capture_len == 8192
    assert vc.VllmCall(max_seq_len_to_capture=4096, max_model_len=32768).capture_len == 4096
    call = vc.VllmCall()
    assert call.eager_reason(256, 8192) == ""
    assert "8193 > capture length 8192" in call.eager_reason(8, 8193)
    assert "batch 257 > largest capture size 256" in call.eager_reason(257, 100)
    assert "enforce_eager" in vc.VllmCall(enforce_eager=True).eager_reason(1, 10)
    with pytest.raises(ConfigError, match="unknown call"):
        vc.VllmCall(call="fast")


def test_graph_launch_pads_with_length_one_rows_at_the_capture_length() -> None:
    lens = (300, 5000, 7) + (100,) * 17  # a batch of 20
    la = vc.launch_for(lens, num_heads=32, block_size=16, call=vc.VllmCall(), timing="graph")
    assert la.graph and la.num_seqs == 24 and la.pad_rows == 4 and la.real_batch == 20
    assert la.seq_lens == (*lens, 1, 1, 1, 1)
    assert la.max_seq_len == 8192 and la.table_width == 512
    # vLLM's v1/v2 rule on the launch: 24 x 32 > 512 at 8192 -> v1 (the batch-20 band)
    assert la.kernel == "v1"
    eager = vc.launch_for(lens, num_heads=32, block_size=16, call=vc.VllmCall(), timing="eager")
    assert not eager.graph and eager.num_seqs == 20 and eager.max_seq_len == 5000
    assert eager.table_width == 313 and eager.seq_lens == lens and eager.kernel == "v1"
    small = vc.launch_for((100,) * 8, num_heads=32, block_size=16, call=vc.VllmCall(),
                          timing="graph")
    assert small.kernel == "v2"  # 8 x 32 <= 512 at 16 partitions: v2, where exact runs v1
    exact = vc.launch_for((100,) * 8, num_heads=32, block_size=16, call=vc.EXACT,
                          timing="graph")
    assert exact.graph and exact.max_seq_len == 100 and exact.kernel == "v1"
    with pytest.raises(ConfigError, match="does not fit max_model_len"):
        vc.launch_for((5000,), num_heads=8, block_size=16,
                      call=vc.VllmCall(max_model_len=4096), timing="graph")


def test_a_sampled_step_gets_its_launch_under_both_calls() -> None:
    """Each sampled step carries the max_model_len it was drawn for; every sequence fits it;
    under the vLLM call its graph launch is at min(8192, max_model_len) and padded to the
    bucket (eager where longer), under the exact call the step itself."""
    steps = sm.draw_sample(sm.SampleSpec(n=300, seed=7, instantiations=sm.Instantiations.full()))
    assert {s.max_model_len for s in steps} == set(sm.MODEL_LENS)
    assert all(max(s.lens) <= min(sm.MAX_LEN, s.max_model_len or 0) for s in steps)
    between = 0
    for s in steps:
        graph = k.step_launch(s, k.KernelBenchConfig())
        exact = k.step_launch(s, k.KernelBenchConfig(call=vc.EXACT))
        assert exact.num_seqs == s.attn.num_seqs and exact.max_seq_len == s.attn.max_seq_len
        capture = min(8192, s.max_model_len or 0)
        if s.attn.max_seq_len > capture:
            assert not graph.graph and graph.max_seq_len == s.attn.max_seq_len
        else:
            assert graph.graph and graph.max_seq_len == capture
            assert graph.num_seqs == vc.graph_bucket(s.attn.num_seqs, vc.capture_sizes())
            between += graph.pad_rows > 0
    assert between > 50  # batches between buckets are common
    again = sm.draw_sample(sm.SampleSpec(n=300, seed=7,
                                         instantiations=sm.Instantiations.full()))
    assert again == steps
    assert sm.SampleSpec(n=1, seed=0, instantiations=sm.Instantiations.full()).to_dict()[
        "distribution"]["version"] == 2


def test_cli_options_reach_the_plan_and_the_record(tmp_path: Path) -> None:
    res = CliRunner().invoke(bench, [
        "kernel", "--workdir", str(tmp_path), "--batch", "20", "--context", "4k",
        "--max-model-len", "4096", "--max-seq-len-to-capture", "2048", "--timing",
        "graph,eager", "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert plan["call"]["call"] == "vllm" and plan["call"]["capture_len"] == 2048
    assert plan["call"]["max_model_len"] == 4096 and plan["call"]["buckets"][-1] == 256
    res = CliRunner().invoke(bench, ["kernel", "--workdir", str(tmp_path), "--call", "exact",
                                     "--eager", "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert plan["call"]["call"] == "exact" and plan["call"]["enforce_eager"] is True
    res = CliRunner().invoke(bench, ["kernel", "--workdir", str(tmp_path), "--sample", "3",
                                     "--max-model-len", "4096", "--dry-run"])
    assert isinstance(res.exception, ConfigError)
    assert "draws max_model_len per step" in str(res.exception)
    configs = k.kernel_configs(("cold",), ("graph", "eager"), vc.VllmCall(max_model_len=4096),
                               rounds=3)
    meta = k.run_call(configs, per_step_model_len=False)
    assert meta["call"] == "vllm" and meta["capture_len"] == 4096


def test_old_results_render_as_the_exact_call() -> None:
    """A committed result made before meta.call existed reads and renders as the exact call,
    its rows' launches being the steps themselves."""
    path = ROOT / "docs/results/2026-12-01-h200-sample-fresh/sample-12011758.json.gz"
    doc = load_document(path)
    assert "call" not in doc["meta"] and vc.doc_call(doc) == {"call": "exact"}
    md = render_markdown(doc)
    assert "- call: exact" in md
    r = next(r for r in doc["results"] if r["status"] == "measured")
    launch = vc.row_launch(r)
    assert launch["num_seqs"] == r["batch"] and launch["max_seq_len"] == r["context"]
    new = {**doc, "meta": {**doc["meta"], "call": {**vc.VllmCall().to_dict(),
                                                   "per_step_max_model_len": True}}}
    assert "vLLM 0.10.2 V0's" in render_markdown(new)
