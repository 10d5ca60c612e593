"""Issue 41, the twentieth hostile pass (tester b: campaigns from the command line, reports and
outputs). Each test fails without its fix (checked by reverting ``src`` and running it):

- The nineteenth pass made the command line refuse a campaign's ``work`` link (the verify job
  runs ``verify-kernel --workdir <campaign>/work``, and the command line follows a
  ``--workdir`` link once, a location the user names being trusted). It knew a campaign's
  ``work`` by the ``campaign.json`` beside it. Whoever writes the campaign can move that file
  away as well: with ``campaign.json`` renamed and ``work/`` a link to a folder outside (the
  user's other work directory, with its builds), the verify job followed the link and wrote
  ``verify/report.json`` and ``report.txt`` there, exit 6 (1 run of 1; a dangling
  ``campaign.json`` link the same). Now every job's script exports ``KVPREFETCH_CAMPAIGN``
  (``slurm.campaign.JOB_ENV``), and a job's ``--workdir`` that is a link is refused whatever
  else the campaign holds (exit 2, with a fix).
- The nineteenth pass also made ``confine`` open a root's own last part ``O_NOFOLLOW`` (a
  root the command line resolved cannot be a link unless one was swapped in). A campaign is a
  root, and its argument was not resolved: ``slurm submit LINK`` and ``resubmit LINK``, with
  ``LINK`` the user's own link to the campaign, said a folder "became a symlink ... another
  process is changing the work directory", a race nobody ran, and sent nothing (exit 2; 2 runs
  of 2). Now the campaign argument is followed once at the command line, as ``--workdir`` is.
- The eighteenth and nineteenth passes bounded the hash of a cached sdist and of a built
  library; a ``--source FILE`` was still hashed whole, by ``slurm prepare`` (the prepare job)
  and by ``fetch --source``, which each build job runs on the campaign's source: a sparse 15 TB
  file there (a careless ``--source``, or a plan forged by whoever writes the campaign) kept
  the job hashing zeros for hours (a hang; 2 runs of 2, killed at 20 s). Now a file of another
  size than the sdist's is named, never read (exit 3, with a fix). The same with a ``--source``
  folder (a clone or an unpacked sdist on a shared filesystem): its full-source check hashed
  every file, a sparse 15 TB file in it included, at the attention header or added (2 runs of
  2, killed at 15 s). Now a file past 64 MiB (the sdist's largest has 991,484 bytes) makes the
  source differ unread (``hashing.source_manifest(limit=)``).
- A ``--scratch`` naming a variable (``$SLURM_TMPDIR/k``, allowed since the nineteenth pass's
  ``$NAME`` rule) on a node that leaves it unset: the build job, under ``set -u``, ended with
  bash's "SLURM_TMPDIR: unbound variable" alone, exit 1, no fix (1 run of 1); an empty one
  would have built in the folder above. Now the job names the variable and the way out, exit 2.
- ``slurm status`` asks Slurm about every submission a campaign records (a job's afterok
  dependants still wait on the id of a submission it replaced). A ``campaign.json`` forged with
  200,000 submissions (of the bench tasks, or of prepare) ran one scontrol after another for
  hours (still running after 60 s; 2 runs of 2). Now a campaign records at most 2,500
  submissions: more is a corrupt record (exit 2, with a fix), and ``submit``/``resubmit`` at
  that count send nothing and say to plan a new campaign.
- ``--task`` of ``slurm stand-in`` and ``slurm resubmit`` was click's int, which takes Python's
  spellings: ``0_1`` (Slurm's JOB_TASK form), `` 1``, ``+1``, ``01`` all read as task 1, so
  stand-in wrote task 1's shard and resubmit sent task 1 (4 runs of 4; the seventeenth pass
  left ``0_1`` open). Now a task id is digits only, without a leading zero (a usage error).
- A path that is a link to itself: ``slurm plan LOOP`` and ``doctor --workdir LOOP`` ended in
  pathlib's ``RuntimeError: Symlink loop`` traceback (``Path.resolve``; 1 run each). Now plan
  names the loop (a usage error) and doctor's temp-folder check resolves with ``realpath``.
  ``build --dry-run --workdir LOOP`` and ``slurm publish --scratch LOOP`` the same (1 run
  each): the command line now reports that RuntimeError as the ELOOP OSError it stands for.

Slurm is absent: the job scripts are run by bash as Slurm runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass19_b import _published_campaign, _run
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_SRC = Path(__file__).resolve().parents[2] / "src"


def _tree(folder: Path) -> dict[str, bytes | str]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() and not p.is_symlink()
                                         else "link" if p.is_symlink() else "dir")
            for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("record", ["moved away", "a dangling link"])
def test_the_verify_job_follows_no_work_link_when_campaign_json_is_gone(
        tmp_path: Path, outside: Path, record: str) -> None:
    """The verify job with the campaign's published work/ moved out, a link to it in its place,
    and campaign.json moved away (or a dangling link): nothing is written behind the link, and
    the job names it with a fix."""
    camp = _published_campaign(tmp_path)
    victim = tmp_path / "victim-work"
    (camp / "work").rename(victim)
    (camp / "work").symlink_to(victim, target_is_directory=True)
    (camp / "campaign.json").rename(tmp_path / "campaign.json.aside")
    if record == "a dangling link":
        (camp / "campaign.json").symlink_to(tmp_path / "nowhere")
    before = _tree(victim)
    res = _run(tmp_path, camp, "20-verify.sbatch")
    assert _tree(victim) == before, "the verify job wrote into the folder the link named"
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{camp / 'work'} is a symlink" in res.stderr, res.stderr
    assert "To fix: remove the symlink" in res.stderr
    assert "Traceback" not in res.stdout + res.stderr


def _fake_slurm(tmp_path: Path) -> Path:
    """A folder with an ``sbatch`` that answers increasing job ids and an ``scontrol`` that
    calls every job pending (no Slurm here)."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        "#!/bin/bash\nf=\"$(dirname \"$0\")/.n\"; n=$(cat \"$f\" 2>/dev/null || echo 100)\n"
        "n=$((n + 1)); echo \"$n\" > \"$f\"; echo \"$n\"\n")
    (bin_dir / "scontrol").write_text(
        "#!/bin/bash\necho \"JobId=$4 JobState=PENDING Reason=None ExitCode=0:0\"\n")
    for p in bin_dir.iterdir():
        p.chmod(0o755)
    return bin_dir


def _kit(tmp_path: Path, *args: str, path: str = "/usr/bin:/bin", timeout: float = 120
         ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path), HOME=str(tmp_path), PATH=path)
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False, cwd="/")


def test_a_campaign_named_through_the_users_link_is_submitted(tmp_path: Path,
                                                               outside: Path) -> None:
    """``slurm submit`` and ``resubmit`` of a campaign named through the user's own link to
    it: the link is followed once, as a ``--workdir`` link is, and the jobs are sent (was: "a
    folder on the way became a symlink ... another process is changing the work directory",
    exit 2, nothing sent)."""
    camp, link = tmp_path / "camp", tmp_path / "mine"
    bin_dir = _fake_slurm(tmp_path)
    res = _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in", "--batch", "1",
               "--python", sys.executable)
    assert res.returncode == 0, res.stdout + res.stderr
    link.symlink_to(camp, target_is_directory=True)
    path = f"{bin_dir}:/usr/bin:/bin"
    res = _kit(tmp_path, "slurm", "submit", str(link), "--json", path=path)
    assert res.returncode == 0, res.stdout + res.stderr
    rec = json.loads((camp / "campaign.json").read_text())
    assert sorted(rec["submitted"]) == ["bench", "build-baseline", "build-patched", "merge",
                                        "prepare", "verify"]
    res = _kit(tmp_path, "slurm", "resubmit", str(link), "merge", path=path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(json.loads((camp / "campaign.json").read_text())["submitted"]["merge"]) == 2
    assert "Traceback" not in res.stdout + res.stderr


@pytest.mark.parametrize("command", ["slurm prepare", "fetch"])
def test_a_huge_sparse_source_file_is_refused_not_hashed_for_hours(tmp_path: Path,
                                                                   command: str) -> None:
    """A campaign planned with ``--source`` a sparse 15 TB file: its prepare job, and the
    ``fetch --source`` each build job runs, refuse it at once by its size (was: sha256 of 15 TB
    of zeros, still running after 20 s)."""
    huge = tmp_path / "vllm-0.10.2.tar.gz"
    with open(huge, "wb") as f:
        f.truncate(15 << 40)
    if command == "slurm prepare":
        camp = tmp_path / "camp"
        res = _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in", "--batch", "1",
                   "--source", str(huge), "--python", sys.executable)
        assert res.returncode == 0, res.stdout + res.stderr
        argv = ["slurm", "prepare", str(camp)]
    else:
        argv = ["fetch", "--workdir", str(tmp_path / "wd"), "--source", str(huge)]
    try:
        res = _kit(tmp_path, *argv, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{command} was still hashing the sparse file after 20 s")
    assert res.returncode == 3, res.stdout + res.stderr
    assert str(huge) in res.stderr and "To fix:" in res.stderr, res.stderr
    assert "Traceback" not in res.stdout + res.stderr


@pytest.mark.parametrize("where", ["the attention header", "a file of its own"])
def test_a_huge_sparse_file_in_a_source_folder_is_refused_not_hashed_for_hours(
        tmp_path: Path, vllm_sdist: Path, where: str) -> None:
    """``fetch --source DIR`` (a campaign's build jobs run it on a ``--source`` clone or
    unpacked sdist) with a sparse 15 TB file in DIR, at the attention header or added: the
    folder is not the pinned source, said at once (was: hashed for hours)."""
    import tarfile

    with tarfile.open(vllm_sdist) as tar:
        tar.extractall(tmp_path / "src", filter="data")
    top = tmp_path / "src" / "vllm-0.10.2"
    huge = (top / "csrc" / "attention" / "attention_kernels.cuh" if where.startswith("the")
            else top / "zz-huge.bin")
    huge.unlink(missing_ok=True)
    with open(huge, "wb") as f:
        f.truncate(15 << 40)
    try:
        res = _kit(tmp_path, "fetch", "--workdir", str(tmp_path / "wd"), "--source", str(top),
                   timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("fetch was still hashing the sparse file after 30 s")
    assert res.returncode == 3, res.stdout + res.stderr
    assert ("not read" in res.stderr or "not the complete vLLM v0.10.2 source" in res.stderr) \
        and "To fix:" in res.stderr, res.stderr
    assert "Traceback" not in res.stdout + res.stderr


@pytest.mark.parametrize("value", ["", None])
def test_a_scratch_naming_a_variable_the_job_lacks_is_refused_with_a_fix(
        tmp_path: Path, value: str | None) -> None:
    """A build job whose ``--scratch`` names ``$SLURM_TMPDIR`` on a node that leaves it unset
    (or empty): the job names the variable and the way out, exit 2, and makes nothing (was:
    bash's "SLURM_TMPDIR: unbound variable" alone, exit 1)."""
    camp, mine = tmp_path / "camp", tmp_path / "mine"
    res = _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in", "--batch", "1",
               "--scratch", f"{mine}/$SLURM_TMPDIR/${{USER}}", "--python", sys.executable)
    assert res.returncode == 0, res.stdout + res.stderr
    env = {"USER": "me", **({} if value is None else {"SLURM_TMPDIR": value})}
    res = _run(tmp_path, camp, "10-build-baseline.sbatch", **env)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "names $SLURM_TMPDIR, which is not set (or is empty)" in res.stderr, res.stderr
    assert "To fix: set SLURM_TMPDIR when you submit" in res.stderr
    assert "resubmit" in res.stderr and "build-baseline" in res.stderr
    assert not mine.exists()
    exits = list((camp / "logs").glob("build-baseline-*.exit"))
    assert [p.read_text() for p in exits] == ["2\n"]


def test_a_campaign_forged_with_a_huge_submission_history_is_refused_at_once(
        tmp_path: Path) -> None:
    """``slurm status`` of a campaign.json forged with 200,000 submissions of one job: refused
    as corrupt within seconds (was: one scontrol per submission, still running after 30 s)."""
    camp = tmp_path / "camp"
    bin_dir = _fake_slurm(tmp_path)
    res = _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in", "--batch", "1,8",
               "--python", sys.executable)
    assert res.returncode == 0, res.stdout + res.stderr
    rec = json.loads((camp / "campaign.json").read_text())
    rec["submitted"] = {"prepare": [{"id": str(1000 + i), "task": None}
                                    for i in range(200_000)]}
    (camp / "campaign.json").write_text(json.dumps(rec))
    try:
        res = _kit(tmp_path, "slurm", "status", str(camp), path=f"{bin_dir}:/usr/bin:/bin",
                   timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("slurm status was still asking Slurm about each submission after 30 s")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "records 200000 submissions" in res.stderr and "To fix:" in res.stderr
    assert "Traceback" not in res.stdout + res.stderr


@pytest.mark.parametrize("task", ["0_1", " 1", "+1", "01"])
def test_a_task_id_in_another_spelling_acts_on_no_task(tmp_path: Path, task: str) -> None:
    """``slurm stand-in --task`` and ``slurm resubmit bench --task`` with a task id Slurm never
    writes (``0_1``, Slurm's JOB_TASK form; a space, a sign, a leading zero): a usage error,
    no shard written and nothing sent (was: read as task 1, its shard written, task 1 sent)."""
    camp = _published_campaign(tmp_path)
    bin_dir = _fake_slurm(tmp_path)
    path = f"{bin_dir}:/usr/bin:/bin"
    res = _kit(tmp_path, "slurm", "submit", str(camp), path=path)
    assert res.returncode == 0, res.stdout + res.stderr
    before = (camp / "campaign.json").read_bytes()
    res = _kit(tmp_path, "slurm", "stand-in", str(camp), "--task", task)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "is not an array task id" in res.stderr, res.stderr
    assert list((camp / "results").iterdir()) == []
    res = _kit(tmp_path, "slurm", "resubmit", str(camp), "bench", "--task", task, path=path)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "is not an array task id" in res.stderr, res.stderr
    assert (camp / "campaign.json").read_bytes() == before
    assert "Traceback" not in res.stdout + res.stderr


@pytest.mark.parametrize("command", ["slurm plan", "doctor"])
def test_a_path_that_is_a_loop_of_links_is_no_traceback(tmp_path: Path, command: str) -> None:
    """A campaign (``slurm plan``) or work directory (``doctor``) named by a link to itself:
    a usage error, or doctor's report, never pathlib's "RuntimeError: Symlink loop"."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    if command == "slurm plan":
        res = _kit(tmp_path, "slurm", "plan", str(loop), "--stand-in", "--batch", "1",
                   "--python", sys.executable)
        assert res.returncode == 2, res.stdout + res.stderr
        assert "is a loop of symlinks" in res.stderr, res.stderr
    else:
        res = _kit(tmp_path, "doctor", "--workdir", str(loop))
    assert "Traceback" not in res.stdout + res.stderr, res.stdout + res.stderr
    assert "RuntimeError" not in res.stdout + res.stderr


@pytest.mark.parametrize("command", ["build --dry-run", "slurm publish"])
def test_pathlibs_symlink_loop_error_is_one_message(tmp_path: Path, command: str) -> None:
    """``build --dry-run --workdir LOOP`` and ``slurm publish --scratch LOOP`` (LOOP a link to
    itself): the loop named with a fix, as the OSError (ELOOP) it stands for (was: pathlib's
    "RuntimeError: Symlink loop" traceback)."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    if command == "build --dry-run":
        res = _kit(tmp_path, "build", "--dry-run", "--workdir", str(loop))
    else:
        camp = tmp_path / "camp"
        res = _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in", "--batch", "1",
                   "--python", sys.executable)
        assert res.returncode == 0, res.stdout + res.stderr
        res = _kit(tmp_path, "slurm", "publish", str(camp), "--tree", "patched", "--scratch",
                   str(loop))
    assert "Traceback" not in res.stdout + res.stderr, res.stdout + res.stderr
    assert res.returncode != 0
    # a --workdir that is a loop of links is refused by the option itself (the thirtieth pass)
    assert (f"{loop}: Too many levels of symbolic links" in res.stderr
            or "is a symlink to nothing (or a loop of links)" in res.stderr), res.stderr
    assert "To fix:" in res.stderr
