"""The `bench` click group: options, plans (--dry-run/--json) and refusals. Nothing here needs a
GPU: --dry-run never loads a library, and the refusals happen before any GPU work. The CLI in a
fresh interpreter is in tests/integration/test_bench_cli.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprefetch.bench import device
from kvprefetch.bench.matrix import build_matrix
from kvprefetch.cli.bench import bench
from kvprefetch.errors import BenchError, ConfigError


def _invoke(args: list[str]):
    return CliRunner().invoke(bench, args, catch_exceptions=True)


def _fake_builds(workdir: Path) -> None:
    for tree in ("baseline", "patched", "paper"):
        d = workdir / "build" / tree / "k1"
        d.mkdir(parents=True)
        (d / f"kvprefetch_{tree}_C.so").write_bytes(b"x")
        (d / "manifest.json").write_text(json.dumps({
            "tree": tree, "variant": tree, "namespace": f"kvprefetch_{tree}",
            "so_path": f"kvprefetch_{tree}_C.so", "so_sha256": "0", "head_sizes": [128],
            "block_sizes": [16], "kv_dtypes": ["fp16"]}))


@pytest.mark.parametrize("sub", [[], ["kernel"], ["ncu"], ["e2e"]])
def test_help(sub: list[str]) -> None:
    res = _invoke([*sub, "--help"])
    assert res.exit_code == 0 and "Usage" in res.output


def test_kernel_dry_run_json_default_matrix(tmp_path: Path) -> None:
    _fake_builds(tmp_path)
    res = _invoke(["kernel", "--workdir", str(tmp_path), "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert plan["shapes"] == len(build_matrix().shapes()) and plan["modes"] == ["cold"]
    assert [v["tree"] for v in plan["variants"]] == ["baseline", "patched", "paper"]
    assert plan["outputs"][0].endswith("bench/kernel.json")
    assert {s["batch"] for s in plan["shape_list"]} == {1, 8, 16, 32, 64, 96, 128, 256}


def test_kernel_dry_run_options(tmp_path: Path) -> None:
    res = _invoke(["kernel", "--workdir", str(tmp_path), "--dry-run", "--json",
                   "--preset", "gemma-2b", "--batch", "1,8", "--context", "1k", "--dtype", "bf16",
                   "--kv-cache-dtype", "fp8", "--force-kernel", "v2", "--mode", "cold",
                   "--mode", "hot", "--tree", "baseline"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert plan["shapes"] == 4 and plan["modes"] == ["cold", "hot"]
    s = plan["shape_list"][0]
    assert (s["num_heads"], s["num_kv_heads"], s["head_size"]) == (8, 1, 256)
    assert s["kernel"] == "v2" and s["kernel_forced"] and s["dtype"] == "bfloat16"
    assert plan["variants"] == []


def test_kernel_aliased_mode_and_its_pool_fraction(tmp_path: Path) -> None:
    res = _invoke(["kernel", "--workdir", str(tmp_path), "--dry-run", "--json", "--mode", "cold",
                   "--mode", "aliased", "--alias-l2-fraction", "0.5", "--batch", "1",
                   "--context", "512"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["modes"] == ["cold", "aliased"]
    res = _invoke(["kernel", "--workdir", str(tmp_path), "--dry-run", "--mode", "aliased",
                   "--alias-l2-fraction", "0"])
    assert isinstance(res.exception, BenchError) and "alias_l2_fraction" in str(res.exception)
    assert "fraction of the L2" in res.exception.fix


def test_kernel_text_dry_run_lists_shapes(tmp_path: Path) -> None:
    res = _invoke(["kernel", "--workdir", str(tmp_path), "--dry-run", "--batch", "1",
                   "--context", "512"])
    assert res.exit_code == 0, res.output
    assert "no builds found" in res.stderr and "llama-3.1-8b" in res.stdout


def test_kernel_bad_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusals of a run (no builds, baseline not first) that follow the torch check. The
    unit layer has no torch (docs/building.md), so that check is stood in for by a recorder
    that passes: the one stub here. Its own refusal is test_require_torch_names_torch_and_the_fix
    below and, through the CLI, tests/integration/test_hostile_bench.py."""
    asked: list[str] = []
    monkeypatch.setattr(device, "require_torch", asked.append)
    res = _invoke(["kernel", "--workdir", str(tmp_path), "--dry-run", "--batch", "1m"])
    assert isinstance(res.exception, ConfigError)
    res = _invoke(["kernel", "--workdir", str(tmp_path), "--dry-run", "--formats", "json,pdf"])
    assert res.exit_code == 2 and "unknown format" in res.output
    assert asked == []  # --dry-run plans without asking for torch
    res = _invoke(["kernel", "--workdir", str(tmp_path)])
    assert asked == ["kernel"]
    assert isinstance(res.exception, BenchError) and "no kernels-only builds" in str(res.exception)
    _fake_builds(tmp_path)
    res = _invoke(["kernel", "--workdir", str(tmp_path), "--tree", "patched", "--tree",
                   "paper"])
    assert isinstance(res.exception, BenchError) and "baseline" in str(res.exception)


def test_require_torch_names_torch_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """A python that cannot import torch is refused up front, naming torch, this python and
    scripts/setup-venv.sh (``sys.modules["torch"] = None`` makes ``import torch`` fail, as it
    does where torch is missing, whether or not this venv has it)."""
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(BenchError, match="needs torch") as exc:
        device.require_torch("decode")
    assert "`kvprefetch bench decode`" in str(exc.value) and sys.executable in str(exc.value)
    fix = exc.value.fix or ""
    assert "scripts/setup-venv.sh" in fix and "--dry-run" in fix


def test_trees_are_named_with_tree_and_the_old_spellings_still_work(tmp_path: Path) -> None:
    """`--tree NAME` picks builds; `--variant NAME`, its old spelling, still does, with a note
    on stderr; `seed`, the paper's tree's old name, finds the `paper` build."""
    _fake_builds(tmp_path)
    res = _invoke(["kernel", "--workdir", str(tmp_path), "--dry-run", "--json",
                   "--tree", "baseline", "--tree", "paper"])
    assert res.exit_code == 0, res.output
    assert [v["tree"] for v in json.loads(res.stdout)["variants"]] == ["baseline", "paper"]
    assert "deprecated" not in res.stderr
    res = _invoke(["kernel", "--workdir", str(tmp_path), "--dry-run", "--json",
                   "--variant", "baseline", "--variant", "seed"])
    assert res.exit_code == 0, res.output
    assert [v["tree"] for v in json.loads(res.stdout)["variants"]] == ["baseline", "paper"]
    assert "--variant NAME (a tree) is deprecated" in res.stderr and "--tree NAME" in res.stderr
    assert "--variant" not in _invoke(["kernel", "--help"]).output


def test_list_presets() -> None:
    res = _invoke(["kernel", "--list-presets"])
    assert res.exit_code == 0 and "tinyllama-1.1b" in res.output


def test_ncu_dry_run_commands(tmp_path: Path) -> None:
    _fake_builds(tmp_path)
    res = _invoke(["ncu", "--workdir", str(tmp_path), "--dry-run", "--json", "--variant",
                   "baseline", "--variant", "patched", "--shape", "1x4k", "--launch-skip",
                   "200", "--launch-count", "40"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert len(doc["commands"]) == 2
    cmd = doc["commands"][1]
    assert cmd[0] == "ncu" and "kvprefetch_patched" in cmd
    assert cmd[cmd.index("--launch-skip") + 1] == "200"
    assert cmd[cmd.index("--replay-mode") + 1] == "application"
    res = _invoke(["ncu", "--workdir", str(tmp_path), "--variant", "baseline"])
    assert isinstance(res.exception, BenchError)


def test_e2e_refuses_without_a_passed_verify_report(tmp_path: Path) -> None:
    res = _invoke(["e2e", "--workdir", str(tmp_path), "--env", "baseline=/b/python",
                   "--env", "patched=/p/python"])
    assert isinstance(res.exception, BenchError)
    assert "no verify-kernel report" in str(res.exception)
    (tmp_path / "verify").mkdir()
    (tmp_path / "verify" / "report.json").write_text(json.dumps({"passed": False, "envs": []}))
    res = _invoke(["e2e", "--workdir", str(tmp_path), "--env", "baseline=/b/python",
                   "--env", "patched=/p/python"])
    assert "does not say passed" in str(res.exception)


def test_e2e_dry_run(tmp_path: Path) -> None:
    (tmp_path / "verify").mkdir()
    # the work directory's own environments: a report's pythons must be there (issue 41)
    b, p = f"{tmp_path}/envs/baseline/bin/python", f"{tmp_path}/envs/patched/bin/python"
    (tmp_path / "verify" / "report.json").write_text(json.dumps(
        {"passed": True, "envs": {"baseline": {"python": b}, "patched": {"python": p}}}))
    res = _invoke(["e2e", "--workdir", str(tmp_path), "--dry-run", "--json",
                   "--max-num-seqs", "8,64", "--repeats", "2"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["refusal"] is None and len(doc["runs"]) == 2 * 2 * 2
    assert doc["environment"] == {"VLLM_USE_V1": "0", "VLLM_ATTENTION_BACKEND": "XFORMERS"}
    assert doc["runs"][0][0] == b and doc["runs"][2][0] == p  # ABBA
    res = _invoke(["e2e", "--workdir", str(tmp_path / "none"), "--dry-run", "--env",
                   "baseline=/b", "--env", "patched=/p"])
    assert res.exit_code == 0 and "would refuse" in res.stderr


def test_lazy_cli_wiring(monkeypatch: pytest.MonkeyPatch) -> None:
    """The entries the lead adds to cli.COMMANDS resolve and run --help."""
    from kvprefetch import cli

    monkeypatch.setitem(cli.COMMANDS, "bench", "kvprefetch.cli.bench:bench")
    monkeypatch.setitem(cli.COMMANDS, "report", "kvprefetch.cli.report:report")
    for args in (["bench", "--help"], ["bench", "kernel", "--help"], ["report", "--help"]):
        res = CliRunner().invoke(cli.main, args)
        assert res.exit_code == 0, res.output


def test_kernel_matrix_issue6_and_context_help(tmp_path: Path) -> None:
    res = _invoke(["kernel", "--workdir", str(tmp_path), "--dry-run", "--json", "--matrix",
                   "issue6"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert plan["shapes"] == 20 and plan["matrix"]["name"] == "issue6"
    assert {s["context"] for s in plan["shape_list"]} == {512, 1024, 4096, 16384}
    helptext = " ".join(_invoke(["kernel", "--help"]).output.split())
    assert "512,1k,4k,16k,32k for --matrix default" in helptext
    assert "512,1k,4k,16k for --matrix issue6" in helptext
    assert _invoke(["kernel", "--workdir", str(tmp_path), "--dry-run", "--matrix", "x"]) \
        .exit_code != 0
