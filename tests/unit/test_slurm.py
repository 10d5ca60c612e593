"""`kvprefetch slurm`: the campaign's scripts, its dependency chain, replanning refusals, and the
scontrol/sacct parsers behind `status`, all pure (a real one-node Slurm runs a campaign in
tests/integration/test_slurm.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvprefetch.errors import ConfigError, SlurmError
from kvprefetch.slurm.campaign import (
    BenchSpec,
    SlurmOptions,
    campaign_from_dict,
    make_campaign,
    render_script,
    write_campaign,
)
from kvprefetch.slurm.cluster import (
    JobState,
    parse_parsable,
    parse_sacct,
    parse_scontrol,
    status,
    submit,
)


def _campaign(root: Path, **slurm: object):  # type: ignore[no-untyped-def]
    return make_campaign(
        root, python="/opt/py/bin/python", kit_root="/opt/kit/src", kit_commit="abc123",
        kit_version="0.1.0", path="/usr/bin:/bin", source="/cache/vllm-0.10.2.tar.gz",
        trees=("baseline", "patched"), arch="9.0a", build_args=("--head-sizes", "128"),
        no_gpu=False, bench=BenchSpec((1, 8, 32)),
        slurm=SlurmOptions(**slurm))  # type: ignore[arg-type]


def test_scripts_are_self_contained_and_pass_options_only_when_given(tmp_path: Path) -> None:
    c = _campaign(tmp_path / "camp", partition="gpu", gres="gpu:1", cpus_per_build=4)
    write_campaign(c)
    root = Path(c.root)
    scripts = {j.name: (root / j.script).read_text() for j in c.jobs}
    assert sorted(scripts) == ["bench", "build-baseline", "build-patched", "merge", "prepare",
                               "verify"]
    for name, text in scripts.items():
        assert text.startswith("#!/bin/bash\n")
        assert "set -euo pipefail" in text
        assert "export PYTHONPATH=/opt/kit/src" in text and "export PATH=/usr/bin:/bin" in text
        assert "/opt/py/bin/python -m kvprefetch" in text
        assert f"#SBATCH --output={root}/logs/{name}-" in text
        assert "#SBATCH --partition=gpu" in text
        assert "--account" not in text and "--time" not in text  # never given: never passed
        # the GPU is asked for only by the jobs that use one
        assert ("#SBATCH --gres=gpu:1" in text) == (name in ("verify", "bench"))
        assert ("#SBATCH --cpus-per-task=4" in text) == name.startswith("build-")
    assert f"build --workdir {root}/work --kernels-only --trees patched --arch 9.0a --jobs 4 " \
           "--head-sizes 128" in scripts["build-patched"]
    assert "#SBATCH --array=0-2" in scripts["bench"]
    assert "BATCHES=(1 8 32)" in scripts["bench"]
    assert '--batch "${BATCHES[$SLURM_ARRAY_TASK_ID]}"' in scripts["bench"]
    assert f"fetch --workdir {root}/work --source /cache/vllm-0.10.2.tar.gz" in scripts["prepare"]
    assert f"report --merge {root}/results/bench-0.json {root}/results/bench-1.json " \
           f"{root}/results/bench-2.json" in scripts["merge"]
    plan = json.loads((root / "campaign.json").read_text())
    assert campaign_from_dict(plan["plan"]) == c
    assert plan["submitted"] == {}


def test_no_gpu_and_stand_in_ask_for_no_gpu(tmp_path: Path) -> None:
    c = make_campaign(tmp_path, python="/p", kit_root="/k", kit_commit=None, kit_version="0",
                      path="/bin", source="sdist", trees=("baseline", "patched"), arch="9.0a",
                      build_args=(), no_gpu=True, bench=BenchSpec((1, 8), stand_in=True),
                      slurm=SlurmOptions(gres="gpu:1"))
    for j in c.jobs:
        assert "--gres" not in render_script(c, j)
    bench = render_script(c, c.job("bench"))
    assert 'slurm stand-in' in bench and "bench kernel" not in bench
    assert "--no-gpu" in render_script(c, c.job("verify"))


def test_dependency_chain_is_afterok_on_the_previous_stage(tmp_path: Path) -> None:
    c = _campaign(tmp_path / "camp")
    write_campaign(c)
    rows = {r["job"]: r["argv"] for r in submit(Path(c.root), dry_run=True)}
    assert list(rows) == ["prepare", "build-baseline", "build-patched", "verify", "bench",
                          "merge"]
    assert rows["prepare"][:2] == ["sbatch", "--parsable"]
    assert not any(a.startswith("--dependency") for a in rows["prepare"])
    assert "--dependency=afterok:<prepare>" in rows["build-baseline"]
    assert "--dependency=afterok:<prepare>" in rows["build-patched"]
    assert "--dependency=afterok:<build-baseline>:<build-patched>" in rows["verify"]
    assert "--dependency=afterok:<verify>" in rows["bench"]
    assert "--dependency=afterok:<bench>" in rows["merge"]
    assert rows["merge"][-1] == f"{c.root}/scripts/40-merge.sbatch"


def test_a_campaign_builds_baseline_and_patched(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="builds the trees baseline, patched, not patched"):
        make_campaign(tmp_path, python="/p", kit_root="/k", kit_commit=None, kit_version="0",
                      path="/bin", source="sdist", trees=("patched",), arch="9.0a",
                      build_args=(), no_gpu=True, bench=BenchSpec(), slurm=SlurmOptions())


def test_replanning_a_submitted_campaign_differently_is_refused(tmp_path: Path) -> None:
    c = _campaign(tmp_path / "camp")
    write_campaign(c)
    rec = json.loads((Path(c.root) / "campaign.json").read_text())
    rec["submitted"] = {"prepare": [{"id": "7", "task": None}]}
    (Path(c.root) / "campaign.json").write_text(json.dumps(rec))
    write_campaign(c)  # the same plan again: fine, the ids are kept
    assert json.loads((Path(c.root) / "campaign.json").read_text())["submitted"]["prepare"]
    with pytest.raises(ConfigError, match="already submitted"):
        write_campaign(_campaign(tmp_path / "camp", partition="other"))


# Lines as Slurm 22.05 prints them (taken from the real cluster of the test below).
SCONTROL = (
    "JobId=12 ArrayJobId=12 ArrayTaskId=1 ArrayTaskThrottle=0 JobName=kvp-c-bench UserId=root(0) "
    "JobState=COMPLETED Reason=None Dependency=(null) ExitCode=0:0\n"
    "JobId=13 ArrayJobId=12 ArrayTaskId=0 JobName=kvp-c-bench UserId=root(0) "
    "JobState=FAILED Reason=NonZeroExitCode Dependency=(null) ExitCode=1:0\n")


def test_parsers() -> None:
    assert parse_parsable("42\n") == "42" and parse_parsable("42;cluster\n") == "42"
    with pytest.raises(SlurmError):
        parse_parsable("sbatch: error: Batch job submission failed\n")
    recs = parse_scontrol(SCONTROL)
    assert [(r["ArrayJobId"], r["ArrayTaskId"], r["JobState"]) for r in recs] == \
        [("12", "1", "COMPLETED"), ("12", "0", "FAILED")]
    assert parse_sacct("12_0|FAILED|1:0\n12_1|COMPLETED|0:0\n13|CANCELLED by 0|0:0\n") == [
        {"JobID": "12_0", "State": "FAILED", "ExitCode": "1:0"},
        {"JobID": "12_1", "State": "COMPLETED", "ExitCode": "0:0"},
        {"JobID": "13", "State": "CANCELLED", "ExitCode": "0:0"}]


def test_status_shows_a_resubmitted_task_in_place_of_the_failed_one(tmp_path: Path) -> None:
    # the state source is passed in: this checks the bookkeeping, the real cluster test below
    # checks the same thing against real scontrol output
    c = _campaign(tmp_path / "camp")
    write_campaign(c)
    rec = json.loads((Path(c.root) / "campaign.json").read_text())
    rec["submitted"] = {"bench": [{"id": "12", "task": None}, {"id": "20", "task": 0}]}
    (Path(c.root) / "campaign.json").write_text(json.dumps(rec))
    states = {"12": [JobState("bench", "12_0", "FAILED", "1:0", "", "t"),
                     JobState("bench", "12_1", "COMPLETED", "0:0", "", "t")],
              "20": [JobState("bench", "20_0", "COMPLETED", "0:0", "", "t")]}
    got = status(Path(c.root), lambda job, jid: states[jid])
    assert [(s.id, s.state) for s in got] == [("20_0", "COMPLETED"), ("12_1", "COMPLETED")]
