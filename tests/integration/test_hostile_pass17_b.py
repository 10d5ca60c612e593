"""Issue 41, the seventeenth hostile pass (tester b: campaigns, job scripts, reports and
outputs), the issue's closing fresh pass. Each test fails without its fix (checked by reverting
``src`` and running it):

- A hand-edited ``campaign.json`` whose job list was not the one the plan's trees and batch
  sizes give was used as it stood: an ``after`` of numbers or lists was a ``TypeError``
  traceback in ``slurm submit``; ``array`` 1,000,000 on the bench job had ``slurm status``
  list a million tasks for minutes (a hang: 60 s and counting); ``array`` on the merge job
  sent it to sbatch as an array. Each job's name, script and array size was checked alone,
  not the list. Now the jobs must be exactly what ``slurm plan`` makes for the campaign's
  trees and batch sizes, or the record is named as edited, with a fix (exit 2).
- An sbatch that took the job (exit 0, its id printed) and then printed a line of its own on
  stderr (a site's sbatch wrapper, a warning at exit) was read by its last line only: "sbatch
  printed 'sbatch: warning: ...', not a job id", with the fix to find a Slurm login node, and
  the job Slurm held left unrecorded (the next submit refused for good). Now the id is the last
  line that is one, and the campaign records it.
- The jobs' scripts pinned the planning shell's PATH as it was, and each job first enters the
  campaign folder: an entry that is not absolute (an empty one, as a careless
  ``PATH=$PATH:`` leaves, or ``.``) had every program a job looks up (``hostname``, ``date``,
  ``dd``, ``mktemp``, git, nvcc) found first in the campaign, where whoever can write it put
  their own, and the job ran it as the user: a ``hostname`` planted in the campaign wrote a
  file outside. Now the jobs' PATH leaves such entries (and any in the campaign) out, and
  ``slurm plan`` says so.
- Each job ran the kit as ``python -m kvprefetch`` in the campaign folder, and ``python -m``
  puts its working folder first on ``sys.path``, before PYTHONPATH and the standard library:
  a ``kvprefetch/`` package (or a ``json.py``) that whoever can write the campaign put there
  was imported in place of the kit and ran as the user in every job (it wrote a file outside,
  5 jobs of 5). Now each job leaves the
  campaign folder for ``/`` before it runs the kit (every path it passes is absolute).

Slurm is a fake ``sbatch``/``scontrol`` on PATH; everything else is the kit, run for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_SRC = Path(__file__).resolve().parents[2] / "src"


def _fake_slurm(tmp_path: Path) -> Path:
    """``sbatch`` answering a new id each call; ``scontrol`` that has forgotten every job (so
    ``status`` reads each task's exit record, as after MinJobAge without accounting)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    counter = tmp_path / "ids"
    (bin_dir / "sbatch").write_text(
        f'#!/bin/bash\nn=$(( $(cat {counter} 2>/dev/null || echo 100) + 1 ))\n'
        f'echo "$n" > {counter}\necho "$n"\n')
    (bin_dir / "scontrol").write_text(
        '#!/bin/bash\necho "slurm_load_jobs error: Invalid job id specified"; exit 1\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir


def _kit(tmp_path: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path),
               PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _edit_jobs(camp: Path, edit: str) -> None:
    rec = json.loads((camp / "campaign.json").read_text())
    jobs = rec["plan"]["jobs"]
    exec(edit, {"jobs": jobs})  # noqa: S102 - the test's own fixed edits below
    (camp / "campaign.json").write_text(json.dumps(rec))


@pytest.mark.parametrize("edit", [
    "jobs[1]['after'] = [1]",                 # submit: TypeError in the dependency message
    "jobs[1]['after'] = [['prepare']]",       # submit: unhashable list
    "jobs[4]['array'] = 1000000",             # status: a million tasks listed (a hang)
    "jobs[5]['array'] = 3",                   # the merge job sent as an array
    "jobs[1]['after'] = 'prepare'",           # a string: depends on p, r, e, ...
    "jobs.append(dict(jobs[0]))",             # prepare twice
    "jobs[4]['array'] = True",                # a bool is no task count
])
def test_a_campaign_whose_jobs_were_edited_is_named_never_sent_or_a_traceback(
        tmp_path: Path, outside: Path, edit: str) -> None:
    """The campaign's job list, edited by hand (anyone who can write the campaign can), is
    refused by every command that reads it, with its fix; before, submit sent it (or died with
    a traceback) and status listed its tasks."""
    _fake_slurm(tmp_path)
    camp = tmp_path / "camp"
    res = _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in")
    assert res.returncode == 0, res.stderr
    _edit_jobs(camp, edit)
    for args in (("submit",), ("submit", "--dry-run"), ("status",)):
        res = _kit(tmp_path, "slurm", *args, str(camp), timeout=30)
        out = res.stdout + res.stderr
        assert "Traceback" not in out, out
        assert res.returncode == 2, (args, res.returncode, out[-2000:])
        assert "kvprefetch plans" in out and "To fix" in out, out[-2000:]
    assert not (tmp_path / "ids").exists(), "an edited campaign was sent to sbatch"


def test_a_planned_campaign_is_submitted_and_its_status_read(tmp_path: Path) -> None:
    """The check above takes what `slurm plan` writes: its campaign is sent in order and its
    status read (every job forgotten by the fake controller: ENDED)."""
    _fake_slurm(tmp_path)
    camp = tmp_path / "camp"
    assert _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in", "--trees",
                "baseline,patched,launch", "--batch", "1,8,32").returncode == 0
    res = _kit(tmp_path, "slurm", "submit", str(camp))
    assert res.returncode == 0, res.stderr
    res = _kit(tmp_path, "slurm", "status", str(camp))
    assert "Traceback" not in res.stdout + res.stderr
    # prepare, 3 builds, verify, 3 bench tasks, merge
    assert res.stdout.count("ENDED") == 1 + 3 + 1 + 3 + 1, res.stdout


def test_an_sbatch_warning_after_the_job_id_still_records_the_job(tmp_path: Path,
                                                                  outside: Path) -> None:
    """sbatch prints the id, then a warning on stderr (joined to its output): every job of the
    campaign is recorded with its id, and status reads them."""
    bin_dir = _fake_slurm(tmp_path)
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(sbatch.read_text()
                      + 'echo "sbatch: warning: maintenance on Tuesday, 5 nodes down" >&2\n')
    camp = tmp_path / "camp"
    assert _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in").returncode == 0
    res = _kit(tmp_path, "slurm", "submit", str(camp))
    assert res.returncode == 0, res.stdout + res.stderr
    rec = json.loads((camp / "campaign.json").read_text())
    assert "sending" not in rec, rec
    assert sorted(s["id"] for subs in rec["submitted"].values() for s in subs) == \
        [str(i) for i in range(101, 107)], rec["submitted"]
    res = _kit(tmp_path, "slurm", "status", str(camp))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr


def test_a_job_never_runs_a_program_planted_in_the_campaign_through_the_planners_path(
        tmp_path: Path, outside: Path) -> None:
    """Planned with ``PATH=...:`` (an empty entry, the current folder) and ``.``: a
    ``hostname`` planted in the campaign is never what the job runs; the plan's notice names
    the entries left out."""
    camp, bad = tmp_path / "camp", outside / "ran-by-the-job"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path),
               PATH=f".:{os.environ['PATH']}:")
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp),
                          "--stand-in", "--python", "/bin/true"], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    notice = res.stdout + res.stderr
    for name in ("hostname", "date"):
        (camp / name).write_text(f"#!/bin/sh\necho pwned > {bad}\n")
        (camp / name).chmod(0o755)
    job_env = {"HOME": str(tmp_path), "SLURM_JOB_ID": "7", "PATH": "/usr/bin:/bin"}
    res = subprocess.run(["bash", str(camp / "scripts" / "00-prepare.sbatch")], env=job_env,
                         capture_output=True, text=True, timeout=60, check=False, cwd="/")
    assert res.returncode == 0, res.stdout + res.stderr
    assert not bad.exists(), "the job ran a program planted in the campaign"
    assert (camp / "logs" / "prepare-7.exit").read_text() == "0\n"
    assert "leaves out '.', ''" in notice, notice


@pytest.mark.parametrize("job", ["00-prepare", "10-build-baseline", "20-verify", "30-bench",
                                 "40-merge"])
def test_a_job_never_imports_a_package_planted_in_the_campaign(
        tmp_path: Path, outside: Path, job: str) -> None:
    """A ``kvprefetch/`` package and a ``json.py`` planted in the campaign folder, each writing
    a file outside when imported: the job (run by bash as Slurm runs it, with the real
    interpreter and kit) imports neither."""
    camp, bad = tmp_path / "camp", outside / "imported-from-the-campaign"
    res = _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in", "--scratch",
               str(tmp_path / "scratch"))
    assert res.returncode == 0, res.stderr
    payload = f"open({str(bad)!r}, 'w').write('pwned')\n"
    (camp / "kvprefetch").mkdir()
    for name in ("kvprefetch/__init__.py", "kvprefetch/__main__.py", "json.py"):
        (camp / name).write_text(payload)
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path),
           "SLURM_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "0"}
    res = subprocess.run(["bash", str(camp / "scripts" / f"{job}.sbatch")], env=env,
                         capture_output=True, text=True, timeout=120, check=False, cwd="/")
    assert not bad.exists(), f"the job imported the campaign's code: {res.stderr[-2000:]}"
    assert any((camp / "logs").glob("*-7.exit")), res.stderr  # it ran to its end
