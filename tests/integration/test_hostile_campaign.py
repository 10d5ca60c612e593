"""Issue 41, the Slurm steps: nothing outside the campaign folder, whatever a campaign folder
holds (a symlinked work/, build/, envs/, logs/, results/ or cache/) and whatever the job's
environment says ($SLURM_JOB_ID). Each case was found by a hostile pass on the campaign's job
commands (S1-S6, S17, S18, S20, S21) and fails on the code as it was before its fix.

Every case checks: the family's exit code with "To fix" and no traceback (``refused``), and
that the folders outside the campaign are byte-identical afterwards (the autouse ``outside``
fixture, and a ``victim`` folder of its own where a case needs one)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from kvprefetch import upstream
from kvprefetch.errors import BenchError, ConfigError, FetchError, SlurmError
from tests.integration.helpers import kvprefetch_cli_split, tree_bytes
from tests.integration.test_reliability import cli, outside, refused
from tests.unit.test_slurm import _fake_scratch_build

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


def _cli_env(*args: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "KVPREFETCH_WORKDIR"}
    full.update(env)
    return kvprefetch_cli_split(*args, env=full, timeout=300)


def _plan(camp: Path, *args: str) -> Path:
    res = cli("slurm", "plan", str(camp), *args)
    assert res.returncode == 0, res.stderr
    return camp.resolve()


def _link(path: Path, target: Path) -> Path:
    """``path`` (an empty folder plan made, or nothing) becomes a symlink to ``target``."""
    if path.is_dir() and not path.is_symlink():
        path.rmdir()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target, target_is_directory=True)
    return path


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim" / "dir"
    (victim / "sub").mkdir(parents=True)
    (victim / "data.txt").write_text("precious\n")
    (victim / "sub" / "more.txt").write_text("also precious\n")
    return victim


# ---------------------------------------------------------------- S1-S3: publish into work/


@pytest.mark.parametrize("linked", ["build", "envs", "build/patched"],
                         ids=["S1-work-build", "S2-work-envs", "S3-work-build-tree"])
def test_publish_never_writes_renames_or_deletes_through_a_symlinked_work_folder(
        tmp_path: Path, outside: Path, linked: str) -> None:
    camp = _plan(tmp_path / "camp", "--source", "sdist")
    scratch = tmp_path / "scratch"
    _fake_scratch_build(scratch, "patched")
    # outside/patched/deep/thesis.tex is where work/envs/patched or work/build/patched/... lands
    link = _link(camp / "work" / linked, outside)
    res = cli("slurm", "publish", str(camp), "--tree", "patched", "--scratch", str(scratch))
    refused(res, SlurmError.exit_code, "is a symlink", str(link))
    assert link.is_symlink()
    # a real folder in its place: the same publication succeeds
    link.unlink()
    res = cli("slurm", "publish", str(camp), "--tree", "patched", "--scratch", str(scratch))
    assert res.returncode == 0, res.stderr
    assert (camp / "work" / "build" / "patched" / "k1" / "manifest.json").is_file()


def test_publish_refuses_a_symlinked_work_folder(tmp_path: Path, outside: Path) -> None:
    camp = _plan(tmp_path / "camp", "--source", "sdist")
    scratch = tmp_path / "scratch"
    _fake_scratch_build(scratch, "patched")
    _link(camp / "work", outside)
    res = cli("slurm", "publish", str(camp), "--tree", "patched", "--scratch", str(scratch))
    refused(res, SlurmError.exit_code, "is a symlink", str(camp / "work"))


# ---------------------------------------------------------------- S4-S5: publish --logs-only


@pytest.mark.parametrize("job_id", ["../../../victim/dir", "7/../../../victim/dir", "7 8", "",
                                    "12_x", "abc"],
                         ids=["dotdot", "digits-then-dotdot", "space", "empty-falls-back-to-pid",
                              "array-not-digits", "letters"])
def test_logs_only_takes_only_a_slurm_job_id_as_its_label(tmp_path: Path, job_id: str) -> None:
    camp = _plan(tmp_path / "camp", "--source", "sdist")
    scratch = tmp_path / "scratch"
    _fake_scratch_build(scratch, "patched")
    victim = _victim(tmp_path)
    before = tree_bytes(victim)
    for _ in range(2):  # a rerun deleted what the first run copied into the victim
        res = _cli_env("slurm", "publish", str(camp), "--tree", "patched", "--scratch",
                       str(scratch), "--logs-only", SLURM_JOB_ID=job_id)
        if job_id == "":  # unset: the pid labels the folder
            assert res.returncode == 0, res.stderr
            for kept in (camp / "logs").iterdir():  # one per run: build-patched-<pid>
                assert kept.name.startswith("build-patched-") and kept.name[14:].isdigit()
                assert (kept / "k1" / "logs" / "01-compile.log").is_file()
            continue
        refused(res, SlurmError.exit_code, "SLURM_JOB_ID", repr(job_id))
    assert tree_bytes(victim) == before
    assert list(victim.parent.iterdir()) == [victim]


@pytest.mark.parametrize("job_id", ["123", "123_4"], ids=["job", "array-task"])
def test_logs_only_accepts_job_and_array_task_ids(tmp_path: Path, job_id: str) -> None:
    camp = _plan(tmp_path / "camp", "--source", "sdist")
    scratch = tmp_path / "scratch"
    _fake_scratch_build(scratch, "patched")
    res = _cli_env("slurm", "publish", str(camp), "--tree", "patched", "--scratch",
                   str(scratch), "--logs-only", SLURM_JOB_ID=job_id)
    assert res.returncode == 0, res.stderr
    assert (camp / "logs" / f"build-patched-{job_id}" / "k1" / "logs").is_dir()


def test_logs_only_never_copies_into_a_symlinked_logs_folder(tmp_path: Path,
                                                              outside: Path) -> None:
    camp = _plan(tmp_path / "camp", "--source", "sdist")
    scratch = tmp_path / "scratch"
    _fake_scratch_build(scratch, "patched")
    _link(camp / "logs", outside)
    for _ in range(2):
        res = _cli_env("slurm", "publish", str(camp), "--tree", "patched", "--scratch",
                       str(scratch), "--logs-only", SLURM_JOB_ID="7")
        refused(res, SlurmError.exit_code, "is a symlink", str(camp / "logs"))


# ---------------------------------------------------------------- S6: stand-in shard


def test_stand_in_never_writes_through_a_symlinked_results_folder(tmp_path: Path,
                                                                  outside: Path) -> None:
    camp = _plan(tmp_path / "camp", "--source", "sdist", "--stand-in", "--batch", "1")
    for tree in ("baseline", "patched"):
        _fake_scratch_build(camp / "work", tree)  # the work dir's layout is a scratch's
    _link(camp / "results", outside)
    res = cli("slurm", "stand-in", str(camp), "--task", "0")
    refused(res, BenchError.exit_code, "is a symlink", str(camp / "results"))
    assert not (outside / "bench-0.json").exists()
    # a real folder: the shard is written
    (camp / "results").unlink()
    res = cli("slurm", "stand-in", str(camp), "--task", "0")
    assert res.returncode == 0, res.stderr
    assert json.loads((camp / "results" / "bench-0.json").read_text())["kind"] == "kernel"


# ---------------------------------------------------------------- S18, S20, S21: prepare


def test_prepare_never_deletes_or_chmods_in_a_symlinked_cache(tmp_path: Path) -> None:
    camp = _plan(tmp_path / "camp", "--source", "sdist")
    mine = tmp_path / "mine"
    mine.mkdir()
    user_file = mine / upstream.SDIST_NAME
    user_file.write_bytes(b"my own tarball, not the pinned sdist")
    os.chmod(user_file, 0o644)
    _link(camp / "cache", mine)
    res = cli("slurm", "prepare", str(camp))
    refused(res, FetchError.exit_code, "is a symlink", str(camp / "cache"))
    assert user_file.read_bytes() == b"my own tarball, not the pinned sdist"
    assert user_file.stat().st_mode & 0o777 == 0o644


def test_prepare_never_deletes_a_cached_file_it_did_not_write(tmp_path: Path) -> None:
    camp = _plan(tmp_path / "camp", "--source", "sdist")
    (camp / "cache").mkdir(exist_ok=True)
    theirs = camp / "cache" / upstream.SDIST_NAME
    theirs.write_bytes(b"someone's file")
    res = cli("slurm", "prepare", str(camp))
    refused(res, FetchError.exit_code, "did not download it", str(theirs))
    assert theirs.read_bytes() == b"someone's file"


def test_prepare_names_a_symlinked_work_folder(tmp_path: Path, outside: Path) -> None:
    clone = tmp_path / "clone"
    clone.mkdir()
    camp = _plan(tmp_path / "camp", "--source", str(clone))
    _link(camp / "work", outside)
    res = cli("slurm", "prepare", str(camp))
    refused(res, ConfigError.exit_code, f"{camp / 'work'} is a symlink", "remove the symlink")
    assert "--adopt" not in res.stderr and "--workdir" not in res.stderr


# ---------------------------------------------------------------- S17: submission records


@pytest.mark.parametrize("submitted", [
    {"prepare": [{"id": {"a": 1}, "task": None}]},
    {"prepare": [{"id": "1 --wrap=touch PWNED", "task": None}]},
    {"prepare": [{"id": 7, "task": None}]},
    {"prepare": [["1"]]},
    {"prepare": {"id": "1"}},
    {"prepare": [{"id": "1", "task": "0; x"}]},
], ids=["dict-id", "words-id", "int-id", "list-entry", "mapping-not-list", "text-task"])
def test_a_submission_record_that_is_not_a_job_id_makes_the_campaign_corrupt(
        tmp_path: Path, submitted: dict) -> None:
    camp = _plan(tmp_path / "camp", "--source", "sdist")
    rec = json.loads((camp / "campaign.json").read_text())
    rec["submitted"] = submitted
    (camp / "campaign.json").write_text(json.dumps(rec))
    res = cli("slurm", "resubmit", str(camp), "build-patched", "--dry-run")
    refused(res, ConfigError.exit_code, "is corrupt", "campaign.json")
    assert "afterok" not in res.stdout
    # a well-formed record still resubmits
    rec["submitted"] = {"prepare": [{"id": "123", "task": None}]}
    (camp / "campaign.json").write_text(json.dumps(rec))
    res = cli("slurm", "resubmit", str(camp), "build-patched", "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    assert "--dependency=afterok:123" in json.loads(res.stdout)["argv"]
