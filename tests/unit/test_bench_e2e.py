"""kvprefetch.bench.e2e: the model folder, the vllm bench throughput command lines, the ABBA
sweep, the verify-report gate and the collected table (the sweep run with stand-in
environments is in tests/integration/test_bench_e2e.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvprefetch.bench import e2e
from kvprefetch.errors import BenchError

SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def _plan(tmp_path: Path, **kw) -> e2e.E2EPlan:
    envs = (e2e.E2EEnv("baseline", tmp_path / "b" / "python"),
            e2e.E2EEnv("patched", tmp_path / "p" / "python"))
    return e2e.E2EPlan(envs=envs, model_dir=tmp_path / "model", out_dir=tmp_path / "out", **kw)


def test_model_dir_is_llama_31_8b_shaped(tmp_path: Path) -> None:
    d = e2e.write_model_dir(tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["hidden_size"] // cfg["num_attention_heads"]) == (32, 8, 128)
    tok = json.loads((d / "tokenizer.json").read_text())
    assert len(tok["model"]["vocab"]) == cfg["vocab_size"]
    assert tok["model"]["vocab"]["<|begin_of_text|>"] == cfg["bos_token_id"]
    tc = json.loads((d / "tokenizer_config.json").read_text())
    assert tc["tokenizer_class"] == "PreTrainedTokenizerFast"
    mtime = (d / "tokenizer.json").stat().st_mtime_ns
    e2e.write_model_dir(tmp_path / "m")  # unchanged content is not rewritten
    assert (d / "tokenizer.json").stat().st_mtime_ns == mtime


def test_tokenizer_round_trips_random_ids(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    cfg = dict(e2e.LLAMA_31_8B_CONFIG, vocab_size=1000, bos_token_id=None, eos_token_id=None)
    d = e2e.write_model_dir(tmp_path / "m", cfg)
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    # what vLLM's RandomDataset does: decode a run of ids, encode the text again
    ids = [(17 + 3 + i) % 1000 for i in range(512)]
    text = tok.decode(ids)
    assert tok.encode(text, add_special_tokens=False).ids == ids


def test_throughput_argv_and_environment(tmp_path: Path) -> None:
    plan = _plan(tmp_path, max_model_len=2048, extra_args=("--enforce-eager",))
    argv = e2e.throughput_argv(plan, plan.envs[1], 32, tmp_path / "o.json")
    assert argv[:6] == [str(plan.envs[1].python), "-I", "-m", "vllm.entrypoints.cli.main",
                        "bench", "throughput"]
    a = dict(zip(argv[6:-1:2], argv[7:-1:2], strict=True))  # the last is a bare flag (below)
    assert a["--load-format"] == "dummy" and a["--dataset-name"] == "random"
    assert a["--input-len"] == "512" and a["--output-len"] == "512"
    assert a["--max-num-seqs"] == "32" and a["--num-prompts"] == "64"
    assert a["--max-model-len"] == "2048" and a["--output-json"] == str(tmp_path / "o.json")
    assert argv[-1] == "--enforce-eager"
    env = e2e.e2e_environ({"PYTHONPATH": "/x", "VLLM_USE_PRECOMPILED": "1", "HOME": "/h",
                           "VLLM_USE_V1": "1"})
    assert env == {"HOME": "/h", "VLLM_USE_V1": "0", "VLLM_ATTENTION_BACKEND": "XFORMERS"}


def test_plan_runs_alternates_envs(tmp_path: Path) -> None:
    runs = e2e.plan_runs(_plan(tmp_path, max_num_seqs=(8, 32), repeats=3))
    assert len(runs) == 2 * 3 * 2
    order = [(r.max_num_seqs, r.repeat, r.env.name) for r in runs[:6]]
    assert order == [(8, 0, "baseline"), (8, 0, "patched"), (8, 1, "patched"),
                     (8, 1, "baseline"), (8, 2, "baseline"), (8, 2, "patched")]
    assert len({r.json_path for r in runs}) == len(runs)


@pytest.mark.parametrize("envs", [["baseline", "patched"],
                                  {"baseline": {"executable": "/b"},
                                   "patched": {"executable": "/p"},
                                   "warning": "without VLLM_USE_V1=0 ..."},
                                  {"baseline": {"python": "/b"}, "patched": {"python": "/p"}},
                                  [{"name": "baseline"}, {"tree": "patched"}]])
def test_require_verified_accepts_report_shapes(tmp_path: Path, envs) -> None:
    p = tmp_path / "report.json"
    p.write_text(json.dumps({"passed": True, "envs": envs}))
    covered = e2e.require_verified(p, ["baseline", "patched"])
    assert set(covered) == {"baseline", "patched"}
    if isinstance(envs, dict):
        assert covered == {"baseline": "/b", "patched": "/p"}


@pytest.mark.parametrize(("report", "match"), [
    (None, "no verify-kernel report"),
    ({"passed": False, "envs": ["baseline", "patched"]}, "does not say passed"),
    ({"passed": "yes", "envs": ["baseline", "patched"]}, "does not say passed"),
    ({"passed": True, "envs": ["baseline"]}, "did not check environment"),
])
def test_require_verified_refuses(tmp_path: Path, report, match: str) -> None:
    p = tmp_path / "report.json"
    if report is not None:
        p.write_text(json.dumps(report))
    with pytest.raises(BenchError, match=match):
        e2e.require_verified(p, ["baseline", "patched"])


def test_parse_env_specs(tmp_path: Path) -> None:
    envs = e2e.parse_env_specs(["baseline=/b/python", "patched=/p/python"], {})
    assert [(e.name, str(e.python)) for e in envs] == [("baseline", "/b/python"),
                                                        ("patched", "/p/python")]
    from_report = e2e.parse_env_specs([], {"baseline": "/b", "patched": "/p"})
    assert [e.name for e in from_report] == ["baseline", "patched"]
    with pytest.raises(BenchError):
        e2e.parse_env_specs(["baseline"], {})
    with pytest.raises(BenchError, match="two environments"):
        e2e.parse_env_specs([], {"baseline": "/b", "patched": None})


def test_collect_pairs_repeats(tmp_path: Path) -> None:
    plan = _plan(tmp_path, max_num_seqs=(8,), repeats=2)
    sample = json.loads((SAMPLES / "vllm_throughput.json").read_text())
    results = []
    for r in e2e.plan_runs(plan):
        scale = 1.5 if r.env.name == "patched" else 1.0
        results.append((r, dict(sample, tokens_per_second=sample["tokens_per_second"] * scale
                                * (1 + 0.1 * r.repeat))))
    rows = e2e.collect(results, plan)
    assert len(rows) == 1 and rows[0]["max_num_seqs"] == 8
    p = rows[0]["envs"]["patched"]
    assert p["speedup"]["median"] == pytest.approx(1.5)
    assert rows[0]["envs"]["baseline"]["tokens_per_second"]["n"] == 2
    out = rows[0]["envs"]["baseline"]["output_tokens_per_second"]["median"]
    assert out == pytest.approx(64 * 512 / 41.27)
