"""What the twenty-second hostile pass of issue 41 left open and a later session closed (the
runner's timeout has its own file, test_runner_timeout.py). Each test fails without its fix."""

from __future__ import annotations

from pathlib import Path

from tests.integration.helpers import kvprefetch_cli_split


def test_a_newline_in_a_name_forges_no_line_of_cleans_listing(fetched_workdir: Path) -> None:
    """A file of the user's in ``build/`` named ``x\\nremoved important`` was listed as "kept
    .../build/x", then a line of its own, "removed important: not created by kvprefetch": a
    deletion that never happened. Each entry is now one line, its newline shown as ``\\n``."""
    build = fetched_workdir / "build"
    build.mkdir(exist_ok=True)
    forged = build / "x\nremoved important"
    forged.write_text("mine\n")
    for extra in ((), ("--dry-run",)):
        res = kvprefetch_cli_split("clean", "--workdir", str(fetched_workdir), *extra)
        assert res.returncode == 0, res.stderr
        lines = (res.stdout + res.stderr).splitlines()
        assert not [ln for ln in lines if ln.startswith("removed important")], lines
        assert any(ln.startswith("kept ") and "x\\nremoved important" in ln for ln in lines), lines
    assert forged.read_text() == "mine\n"


def test_a_source_in_the_campaign_is_refused_at_plan_and_when_read_back(tmp_path: Path
                                                                         ) -> None:
    """``slurm plan --source CAMP/src`` was planned, and only a job found it wrong; a clone
    there is one whoever can write the campaign may change after the prepare job's check. Now
    plan refuses it (by path, through a link), and so does every command that reads a
    campaign.json naming one."""
    import json

    camp, elsewhere = tmp_path / "camp", tmp_path / "elsewhere"
    elsewhere.mkdir()
    res = kvprefetch_cli_split("slurm", "plan", str(camp), "--stand-in")
    assert res.returncode == 0, res.stderr
    (camp / "src").mkdir()
    (elsewhere / "link").symlink_to(camp / "src")
    before = (camp / "campaign.json").read_bytes()
    for source in (camp / "src", elsewhere / "link", camp / "src" / ".." / "src"):
        # planned again into the campaign (plan replaces its own campaign's files)
        res = kvprefetch_cli_split("slurm", "plan", str(camp), "--source", str(source),
                                   "--stand-in")
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert "is in the campaign" in res.stderr and "To fix:" in res.stderr, res.stderr
        assert (camp / "campaign.json").read_bytes() == before
    other = tmp_path / "other"
    res = kvprefetch_cli_split("slurm", "plan", str(other), "--source", str(elsewhere),
                               "--stand-in")
    assert res.returncode == 0, res.stderr
    rec = json.loads((other / "campaign.json").read_text())
    (other / "clone").mkdir()
    rec["plan"]["source"] = str(other / "clone")
    (other / "campaign.json").write_text(json.dumps(rec))
    res = kvprefetch_cli_split("slurm", "submit", str(other), "--dry-run")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "is in the campaign" in res.stderr, res.stderr


def test_a_submission_of_a_job_the_plan_does_not_hold_makes_the_record_corrupt(
        tmp_path: Path) -> None:
    """A campaign.json whose ``submitted`` (or ``sending``) names a job of nobody's was read as
    sent: ``status`` printed an empty table, exit 0, and ``submit`` took the campaign as
    started. Now every command that reads it says which name is no job of the plan."""
    import json

    camp = tmp_path / "camp"
    assert kvprefetch_cli_split("slurm", "plan", str(camp), "--stand-in").returncode == 0
    rec = json.loads((camp / "campaign.json").read_text())
    for forged in ({"submitted": {"nobody": [{"id": "123", "task": None}]}},
                   {"sending": {"job": "nobody", "task": None, "at": "2026-12-06T00:00:00"}}):
        (camp / "campaign.json").write_text(json.dumps({**rec, **forged}))
        for cmd in (("status",), ("submit", "--dry-run")):
            res = kvprefetch_cli_split("slurm", *cmd, str(camp))
            assert res.returncode == 2 and "Traceback" not in res.stderr, (cmd, res.stderr)
            assert "'nobody', which is no job of its plan" in res.stderr, (cmd, res.stderr)


def test_submit_runs_sbatch_without_the_shells_sbatch_variables(tmp_path: Path) -> None:
    """sbatch reads ``SBATCH_*`` as options: an ``SBATCH_ERROR`` in the campaign, through a
    link planted there, would have Slurm write the job's stderr where the link leads, and an
    ``SBATCH_CONTAINER`` names a bundle the job runs in (found by the twenty-third pass's tester
    d, not shown on a real Slurm). The sbatch here is a stand-in recording its environment."""
    from tests.integration.test_hostile_pass21_b import _submit_with

    seen = tmp_path / "sbatch-env"
    res, calls = _submit_with(tmp_path, {"SBATCH_ERROR": "{camp}/logs/err",
                                         "SBATCH_CONTAINER": "{camp}/bundle",
                                         "SBATCH_ACCOUNT": "other"}, record_env=seen)
    assert res.returncode == 0, res.stderr
    assert calls.read_text().count("\n") == 6  # every job sent
    assert "SBATCH_" not in seen.read_text()
