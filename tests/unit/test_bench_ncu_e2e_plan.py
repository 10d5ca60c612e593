"""``bench ncu`` and ``bench e2e`` planned by the library from one frozen options object each
(bench/ncu_plan.py, bench/e2e_plan.py): the defaults the command line shows are the options',
the plan holds what a dry run prints, and a real run's refusals happen while planning."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprefetch.bench.e2e_plan import E2EBenchOptions, plan_e2e_bench
from kvprefetch.bench.ncu_plan import DEFAULT_SHAPES, NcuBenchOptions, plan_ncu_bench
from kvprefetch.cli.bench import bench
from kvprefetch.errors import BenchError, ConfigError, OptionError


@pytest.mark.parametrize("options", [NcuBenchOptions, E2EBenchOptions])
def test_options_are_frozen_and_keyword_only(options: type, tmp_path: Path) -> None:
    o = options(workdir=tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.workdir = tmp_path / "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        options(tmp_path)


@pytest.mark.parametrize(("command", "options"),
                         [("ncu", NcuBenchOptions), ("e2e", E2EBenchOptions)])
def test_every_option_is_a_field_with_the_default_the_help_shows(command: str,
                                                                 options: type) -> None:
    cmd = bench.commands[command]
    params = {p.name: p for p in cmd.params  # legacy_trees: --variant, merged into trees
              if p.name not in ("dry_run", "as_json", "legacy_trees")}
    fields = {f.name: f for f in dataclasses.fields(options)}
    assert set(params) == set(fields)
    for name, p in params.items():
        if name == "workdir" or getattr(p, "multiple", False):  # repeatable: empty is ()
            continue
        assert p.default == fields[name].default, name


def test_ncu_plan_defaults_and_commands(tmp_path: Path) -> None:
    plan = plan_ncu_bench(NcuBenchOptions(workdir=tmp_path), builds=())
    assert [s.label for s in plan.shapes] == [
        s.label for s in plan_ncu_bench(NcuBenchOptions(workdir=tmp_path, shapes=DEFAULT_SHAPES),
                                        builds=()).shapes]
    assert plan.out_dir == tmp_path / "bench" and plan.formats == ("json", "md", "png")
    assert plan.commands() == [] and plan.to_dict()["commands"] == []
    assert plan.recipe.launch_skip == 20 and plan.recipe.launch_count == 10


@pytest.mark.parametrize(("change", "error"), [
    ({"shapes": ("bogus",)}, ConfigError), ({"block_size": 7}, ConfigError),
    ({"formats": "json,xls"}, OptionError), ({"preset": "nonexistent"}, ConfigError)])
def test_ncu_plan_refuses_bad_options(tmp_path: Path, change: dict, error: type) -> None:
    with pytest.raises(error):
        plan_ncu_bench(NcuBenchOptions(workdir=tmp_path, **change), builds=())


def test_e2e_plan_dry_run_carries_the_refusal_a_real_run_raises(tmp_path: Path) -> None:
    o = E2EBenchOptions(workdir=tmp_path, envs=("baseline=/b/python", "patched=/p/python"),
                        max_num_seqs="8,64", repeats=2)
    plan = plan_e2e_bench(o, dry_run=True)
    assert plan.refusal and "no verify-kernel report" in plan.refusal
    assert len(plan.runs) == 2 * 2 * 2 and plan.runs[2].argv[0] == "/p/python"  # ABBA
    with pytest.raises(BenchError, match="no verify-kernel report"):
        plan_e2e_bench(o)
    with pytest.raises(BenchError, match="no environments given"):
        plan_e2e_bench(E2EBenchOptions(workdir=tmp_path, verify_report=_passed(tmp_path, {})))


def _passed(tmp_path: Path, envs: dict) -> Path:
    p = tmp_path / "report.json"
    p.write_text(json.dumps({"passed": True, "envs": envs}))
    return p


@pytest.mark.parametrize(("text", "needle"), [("not json", "cannot read the verify-kernel report"),
                                         ("[1, 2]", "is not a JSON object")])
def test_e2e_an_unreadable_verify_report_is_a_refusal_not_a_traceback(
        tmp_path: Path, text: str, needle: str) -> None:
    report = tmp_path / "bad.json"
    report.write_text(text)
    args = ["e2e", "--workdir", str(tmp_path), "--verify-report", str(report)]
    dry = CliRunner().invoke(bench, [*args, "--dry-run"])
    assert dry.exit_code == 0 and "would refuse" in dry.stderr and needle in dry.stderr
    real = CliRunner().invoke(bench, args)
    assert isinstance(real.exception, BenchError) and needle in str(real.exception)
