"""A campaign job's log (``slurm/joblog.py``): Slurm's own output is ``/dev/null``, and the job's
shell writes its log as a new file in the campaign's ``logs/`` it has entered and checked.

Slurm opens ``--output`` by path when the job starts, as the user, following links. The kit
sent it into a fresh folder per submission (``logs/sbatch-<time>-<random>/``), but that folder,
or ``logs/`` itself, swapped for a link between submit and the job's start had Slurm write the
job's output outside the campaign (issue 41, the twenty-fifth hostile pass, on a real Slurm;
left open until now). Here the fake sbatch records what it was asked, and the test then starts
each job as slurmstepd does: it opens the job's ``--output`` by path (links followed) and runs
the kit's script with bash. The job's Python is a stand-in that exits 0 (or sleeps, to be
cancelled), so no kit command runs inside the job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.test_hostile_pass11_t import _SWAPPER, _kit
from tests.integration.test_reliability import _env, outside

__all__ = ["outside"]  # the autouse fixture: the outside folder is byte-identical afterwards

# records each sbatch's arguments and answers the next id; runs nothing
_SBATCH = r'''#!/usr/bin/env python3
import fcntl, json, sys
from pathlib import Path
calls = Path(sys.argv[0]).parent.parent / "sbatch-calls.jsonl"
with open(calls.with_suffix(".lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    n = 101 + (len(calls.read_text().splitlines()) if calls.exists() else 0)
    with open(calls, "a") as f:
        f.write(json.dumps({"id": n, "argv": sys.argv[1:]}) + "\n")
print(f"{n};cluster")
'''


def _campaign(tmp_path: Path, python_body: str = "exit 0") -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(_SBATCH)
    (bin_dir / "scontrol").write_text('#!/bin/bash\necho "JobId=$4 JobState=PENDING '
                                      'Reason=Dependency ExitCode=0:0"\n')
    python = tmp_path / "python"
    python.write_text(f"#!/bin/bash\n{python_body}\n")
    for p in (*bin_dir.iterdir(), python):
        p.chmod(0o755)
    camp = tmp_path / "camp"
    res = _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in", "--python", str(python))
    assert res.returncode == 0, res.stderr
    return camp


def _slurm_output(argv: list[str], script: Path) -> str:
    """The job's output file as slurmstepd takes it: the command line's ``--output``, else the
    script's ``#SBATCH --output``."""
    given = [a.split("=", 1)[1] for a in argv if a.startswith("--output=")]
    if given:
        return given[-1]
    return next(line.split("=", 1)[1] for line in script.read_text().splitlines()
                if line.startswith("#SBATCH --output="))


def _start(argv: list[str], job_id: int, **popen: object) -> subprocess.Popen[bytes]:
    """Start a sent job as slurmstepd does: its output opened by path, following links,
    truncated (``%j`` is the id), then its script run by bash from ``/``."""
    script = Path(argv[-1])
    path = _slurm_output(argv, script).replace("%j", str(job_id))
    with open(path, "wb") as out:  # by path, links followed, as Slurm opens it
        return subprocess.Popen(["bash", str(script)], cwd="/", stdout=out,
                                stderr=subprocess.STDOUT,
                                env=dict(_env(), SLURM_JOB_ID=str(job_id)), **popen)  # type: ignore[call-overload]


def _sent(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in
            (tmp_path / "sbatch-calls.jsonl").read_text().splitlines()]


def test_the_folder_of_a_jobs_output_swapped_for_a_link_after_submit_gets_nothing(
        tmp_path: Path, outside: Path) -> None:
    """Submit, then the folder the job's output goes to becomes a link to a folder outside
    (the attacker's move, made once submit has returned), then prepare starts: Slurm opened the
    submission's ``logs/sbatch-*/prepare-101.out`` through the link and wrote a file outside.
    Now Slurm's output is ``/dev/null``, the folder the job writes its log in is ``logs/``, and
    with that swapped the job refuses to run."""
    camp = _campaign(tmp_path)
    res = _kit(tmp_path, "slurm", "submit", str(camp))
    assert res.returncode == 0, res.stderr
    prepare = next(s for s in _sent(tmp_path) if s["argv"][-1].endswith("00-prepare.sbatch"))
    output = Path(_slurm_output(prepare["argv"], Path(prepare["argv"][-1])))
    folder = output.parent if output.is_relative_to(camp) else camp / "logs"
    taken = tmp_path / "taken"
    folder.rename(taken)
    try:
        folder.symlink_to(outside)
        assert _start(prepare["argv"], prepare["id"]).wait(timeout=60) == 2
    finally:
        folder.unlink()
        taken.rename(folder)
    assert output == Path("/dev/null")
    assert not list((camp / "logs").glob("prepare-*")), "no log and no exit record: refused"


def test_the_job_writes_its_own_log_and_keeps_a_link_planted_at_its_name(
        tmp_path: Path, outside: Path) -> None:
    """A link at ``logs/prepare-101.out`` (the next id's log) to a file outside: the job keeps
    it and writes ``prepare-101.1.out``; the log holds what the job printed, and its exit record
    says 0. Every job's ``#SBATCH --output`` is ``/dev/null`` too (an sbatch by hand)."""
    camp = _campaign(tmp_path)
    for script in (camp / "scripts").glob("*.sbatch"):
        assert "#SBATCH --output=/dev/null" in script.read_text().splitlines(), script
    planted = camp / "logs" / "prepare-101.out"
    planted.symlink_to(outside / "notes.txt")
    res = _kit(tmp_path, "slurm", "submit", str(camp))
    assert res.returncode == 0, res.stderr
    prepare = next(s for s in _sent(tmp_path) if s["argv"][-1].endswith("00-prepare.sbatch"))
    assert _start(prepare["argv"], prepare["id"]).wait(timeout=60) == 0
    assert planted.is_symlink()
    log = (camp / "logs" / "prepare-101.1.out").read_text()
    assert log.startswith("kvprefetch job prepare on "), log
    assert (camp / "logs" / "prepare-101.exit").read_text() == "0\n"


def test_a_cancelled_job_logs_to_its_end_and_records_143(tmp_path: Path) -> None:
    """``scancel`` sends SIGTERM to every process of the job, the log's writer included: it
    ignores it, so the log keeps what the job printed up to its end (bash's "Terminated" for
    the child the signal killed, printed after the signal), and the exit record says 143 (the
    script's own trap)."""
    camp = _campaign(tmp_path, 'echo "stand-in started"; sleep 60')
    res = _kit(tmp_path, "slurm", "submit", str(camp))
    assert res.returncode == 0, res.stderr
    prepare = next(s for s in _sent(tmp_path) if s["argv"][-1].endswith("00-prepare.sbatch"))
    proc = _start(prepare["argv"], prepare["id"], start_new_session=True)
    log = camp / "logs" / "prepare-101.out"
    deadline = time.monotonic() + 30
    while "stand-in started" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline and proc.poll() is None, "the job never started"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    assert (camp / "logs" / "prepare-101.exit").read_text() == "143\n"
    lines = log.read_text().splitlines()
    # bash's own line for the child the TERM killed, printed after it: the writer outlived it
    assert lines.index("stand-in started") < len(lines) - 1 and "Terminated" in lines[-1], lines


def test_jobs_under_a_swap_loop_on_logs_write_nothing_outside(tmp_path: Path,
                                                              outside: Path) -> None:
    """``logs/`` traded with a link to a folder outside and back, over and over (renameat2),
    while 30 prepare jobs start one after another: each job logs into the campaign's
    ``logs/`` or is refused, and nothing outside changes (the ``outside`` fixture)."""
    camp = _campaign(tmp_path)
    res = _kit(tmp_path, "slurm", "submit", str(camp))
    assert res.returncode == 0, res.stderr
    prepare = next(s for s in _sent(tmp_path) if s["argv"][-1].endswith("00-prepare.sbatch"))
    stop = tmp_path / "stop-swapping"
    swapper = subprocess.Popen([sys.executable, "-c", _SWAPPER, str(camp / "logs"),
                                str(outside), str(stop)], stdout=subprocess.PIPE, text=True)
    codes = []
    try:
        assert swapper.stdout is not None and swapper.stdout.readline().strip() == "ready"
        for i in range(30):
            codes.append(_start(prepare["argv"], 1000 + i).wait(timeout=60))
    finally:
        stop.touch()
        swapper.wait(timeout=30)
        if swapper.stdout is not None:
            swapper.stdout.close()
    assert set(codes) <= {0, 2}, codes
    logged = list((camp / "logs").glob("prepare-1*.out"))
    assert all(p.is_file() and not p.is_symlink() for p in logged), logged
