"""Items of the thirty-sixth and thirty-seventh hostile passes' left-open lists, closed by the
lead (issue 41). Each test failed before its fix:

- ``export-header -o -`` wrote a file named ``-`` where a user reads standard output;
- ``report --readme F --check`` on a file holding no block said "every report block matches
  its JSON": a pass for a CI pointed at the wrong file;
- a work directory whose path holds a newline was refused by the build only after it made its
  environment (build.ninja cannot carry one); the preflight names it now;
- a new work directory or campaign in a folder another user owns (``/tmp/theirs/work``) was
  taken without a word, though that user can rename it away and put their own in its place;
- a ``slurm plan`` stopped before its record, then rerun with other options, was told only
  "not empty / plan into a new or empty folder", with no word of the stopped plan;
- (found by the lead in pass 38) a user's ``scripts/00-prepare.sbatch`` of more than 1 MiB in
  a folder given to ``slurm plan`` was a ValueError traceback;
- ``doctor`` on a work directory mounted ``nosymfollow`` passed its disk check, and the build
  named the mount only once its first environment could not run.

Nothing is mocked: the CLI runs as a user runs it; the ``nosymfollow`` case mounts a real tmpfs
(root only, skipped elsewhere with its reason)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_reliability import cli, refused


def test_export_header_dash_is_not_a_file_named_dash(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "export-header", "-o", "-"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "not read as standard output" in res.stderr and "./-" in res.stderr, res.stderr
    assert not (tmp_path / "-").exists()


def test_readme_check_on_a_file_with_no_block_fails(tmp_path: Path) -> None:
    target = tmp_path / "NOTES.md"
    target.write_text("# notes\n\nno report block here\n")
    res = cli("report", "--readme", str(target), "--check", timeout=60)
    refused(res, 7, "holds no report, timings or commands block", "point --readme at")
    res = cli("report", "--readme", str(target), timeout=60)
    assert res.returncode == 0 and "nothing to regenerate" in res.stderr, res.stderr
    assert target.read_text() == "# notes\n\nno report block here\n"


def test_doctor_names_a_nosymfollow_work_directory(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (a tmpfs mounted nosymfollow)")
    mnt = tmp_path / "nosymfollow"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1g,nosymfollow", "tmpfs", str(mnt)],
                      capture_output=True, check=False).returncode:
        pytest.skip("cannot mount a tmpfs with nosymfollow here (Linux 5.10 or later, root)")
    try:
        res = cli("doctor", "--mode", "kernels-only", "--workdir", str(mnt / "work"), "--json",
                  timeout=300)
        assert "Traceback" not in res.stderr, res.stderr
        disk = next(c for c in json.loads(res.stdout)["checks"] if c["name"] == "disk")
        assert disk["status"] == "fail", disk
        assert "nosymfollow" in disk["detail"] and "remount,symfollow" in disk["fix"], disk
        assert res.returncode != 0
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_build_refuses_a_newline_in_the_work_directory_before_making_an_env(
        fetched_workdir: Path, tmp_path: Path) -> None:
    wd = tmp_path / "a\nb"
    shutil.copytree(fetched_workdir, wd, symlinks=True)
    res = cli("build", "--yes", "--workdir", str(wd), "--mode", "kernels-only", "--trees",
              "baseline", "--head-sizes", "128", "--block-sizes", "16", "--kv-dtypes", "fp16",
              timeout=300)
    refused(res, 2, "holds a control character", "rename the folder")
    assert not (wd / "envs").exists() and not (wd / "build").exists()


def test_a_folder_another_user_owns_above_a_new_work_directory_is_refused(
        tmp_path: Path) -> None:
    """That user could rename the kit's folder away and put their own in its place."""
    try:
        nobody = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no user 'nobody' to own the folder")
    if os.geteuid() != 0:
        pytest.skip("only root can make a folder another user owns here")
    theirs = tmp_path / "theirs"
    (theirs / "deeper").mkdir(parents=True)
    os.chown(theirs, nobody, -1)
    for wd in (theirs / "work", theirs / "deeper" / "work", theirs / "new" / "work"):
        for args in (["fetch", "--workdir", str(wd), "--dry-run"],
                     ["fetch", "--workdir", str(wd), "--source", "sdist"],
                     ["slurm", "plan", str(wd.parent / "camp"), "--stand-in", "--no-gpu"]):
            refused(cli(*args, timeout=120), 2, f"would lie in {theirs}",
                    "belongs to nobody", "only you or root own")
    assert sorted(p.name for p in theirs.iterdir()) == ["deeper"]
    assert not any((theirs / "deeper").iterdir())
    res = cli("slurm", "plan", str(tmp_path / "mine" / "camp"), "--stand-in", "--no-gpu",
              timeout=120)  # folders of root's and the user's own are taken as before
    assert res.returncode == 0, res.stderr


def test_a_plan_stopped_before_its_record_is_named_to_a_plan_of_other_options(
        tmp_path: Path) -> None:
    """What a `slurm plan` stopped before campaign.json leaves (its folders, its scripts) is
    made here by a real plan whose record is then taken away: the kill's window is a few
    milliseconds wide."""
    camp = tmp_path / "camp"
    plan = ["slurm", "plan", str(camp), "--stand-in", "--no-gpu"]
    assert cli(*plan, timeout=120).returncode == 0
    (camp / "campaign.json").unlink()
    res = cli(*plan, "--partition", "other", timeout=120)
    refused(res, 2, "job scripts of a `slurm plan` stopped before it wrote campaign.json",
            "rerun that plan with its own options")
    assert not (camp / "campaign.json").exists()
    (camp / "scripts" / "notes.txt").write_text("mine\n")  # a file of the user's: not a plan's
    refused(cli(*plan, "--partition", "other", timeout=120), 2, "is not empty")
    (camp / "scripts" / "notes.txt").unlink()
    res = cli(*plan, timeout=120)  # the same plan again completes it, as before
    assert res.returncode == 0 and (camp / "campaign.json").is_file(), res.stderr


def test_a_large_file_named_as_a_job_script_is_not_a_traceback(tmp_path: Path) -> None:
    """Found by the lead in pass 38: a user's 2 MiB scripts/00-prepare.sbatch in the folder
    was read whole by the killed-plan check, a ValueError traceback."""
    camp = tmp_path / "camp"
    (camp / "scripts").mkdir(parents=True)
    with open(camp / "scripts" / "00-prepare.sbatch", "wb") as f:
        f.truncate(2 << 20)
    refused(cli("slurm", "plan", str(camp), "--stand-in", "--no-gpu", timeout=120), 2,
            "is not empty")
    assert sorted(p.name for p in (camp / "scripts").iterdir()) == ["00-prepare.sbatch"]


def test_a_large_file_in_place_of_a_planned_campaigns_script_is_not_a_traceback(
        tmp_path: Path) -> None:
    """The same read, in the rerun of a planned campaign whose script the user replaced."""
    camp = tmp_path / "camp"
    plan = ["slurm", "plan", str(camp), "--stand-in", "--no-gpu"]
    assert cli(*plan, timeout=120).returncode == 0
    script = camp / "scripts" / "00-prepare.sbatch"
    with open(script, "r+b") as f:
        f.truncate(2 << 20)
    refused(cli(*plan, timeout=120), 2, "was not written by `kvprefetch slurm plan`")
    assert script.stat().st_size == 2 << 20
