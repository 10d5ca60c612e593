"""Issue 41, the thirty-second hostile pass (tester b: a campaign's jobs run as a node runs
them, with the real kit inside: prepare from a local sdist, stand-in bench, merge; then
``slurm status``, ``resubmit`` and ``publish --logs-only`` against the result, under forged
exit records, signals to the job's group, two jobs of one id and renameat2 swaps of ``logs/``,
``results/``, ``report/``, ``work/``, ``cache/`` and the campaign itself). The test fails without
its fix (checked by reverting ``src`` and running it):

- **A merge job whose bench result was missing sent the user to "correct the command line".**
  A bench task that failed or was cancelled (then ``slurm resubmit CAMP merge``), or a result
  moved since, left ``results/bench-N.json`` missing; the merge job's ``report --merge`` then
  stopped on click's ``exists=True``: "Invalid value for '[FILES]...': File
  '.../results/bench-1.json' does not exist. To fix: correct the command line", a command line
  the kit wrote into the job script. ``report`` now checks its FILES itself (``_check_files``):
  a missing file named as a campaign's bench result (``slurm.campaign.shard_task``: the name
  ``bench-N.json`` in a ``results/`` beside a ``campaign.json``) is named as the task that did
  not leave it, with that task's ``slurm resubmit`` and the merge's; any other missing file
  gets click's message as before.

Nothing is mocked: the real kit in the job, its script run by bash as a node runs it.
A single SIGTERM (or SIGHUP) of the job's group that lands during its EXIT trap, just as its
work had ended, killed the trap's ``write_new`` (its subshell traps TERM as exit 143) and the
job left no exit record (3 runs in 20; found and left open by tester b, closed by the lead): the
trap now ignores every ending signal, and so does its ``write_new``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_SRC = Path(__file__).resolve().parents[2] / "src"


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path), PATH="/usr/bin:/bin")
    return env


def _kit(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvprefetch", *argv], env=_env(tmp_path),
                          capture_output=True, text=True, timeout=60, check=False,
                          cwd=tmp_path)


def test_a_merge_job_missing_a_bench_result_names_the_task_to_resubmit(
        tmp_path: Path, outside: Path) -> None:
    camp = tmp_path / "camp"
    res = _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in", "--batch", "1,8",
               "--python", sys.executable)
    assert res.returncode == 0, res.stderr
    (camp / "results" / "bench-0.json").write_text("{}")  # task 0 left one; task 1 did not
    job = subprocess.run(["bash", str(camp / "scripts" / "40-merge.sbatch")],
                         env={"HOME": str(tmp_path), "SLURM_JOB_ID": "7",
                              "PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)},
                         capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path)
    assert job.returncode == 2, job.stderr
    assert "Traceback" not in job.stderr, job.stderr
    assert "correct the command line" not in job.stderr, job.stderr
    assert f"bench task 1's result '{camp}/results/bench-1.json' does not exist" in job.stderr
    assert f"kvprefetch slurm resubmit {camp} bench --task 1`" in job.stderr, job.stderr
    assert f"kvprefetch slurm resubmit {camp} merge`" in job.stderr, job.stderr
    assert (camp / "logs" / "merge-7.exit").read_text() == "2\n"
    assert "bench task 1's result" in (camp / "logs" / "merge-7.out").read_text()
    # a missing file that is no campaign's bench result: click's message, as before
    res = _kit(tmp_path, "report", "--merge", str(tmp_path / "bench-1.json"))
    assert res.returncode == 2, res.stderr
    assert f"File '{tmp_path}/bench-1.json' does not exist." in res.stderr, res.stderr
    # one whose folder is past Linux's name limit: the same, not "report failed: File name too
    # long" (the fix's own first draft looked for campaign.json there)
    res = _kit(tmp_path, "report", "--merge", f"{'x' * 300}/results/bench-0.json")
    assert res.returncode == 2, res.stderr
    assert "does not exist." in res.stderr and "too long" not in res.stderr, res.stderr


def test_a_stop_signal_as_a_job_ends_never_loses_its_exit_record(tmp_path: Path) -> None:
    """The job's python (a stand-in) says it is done and exits 0; a storm of SIGTERMs to the
    job's group then runs until the job has ended, so some land in its EXIT trap. Every run
    leaves an exit record: 143 where the signal came first, 0 where the trap had begun."""
    import signal
    import time

    done = tmp_path / "done"
    py = tmp_path / "py"
    py.write_text(f"#!/bin/bash\ntouch {done}\nexit 0\n")
    py.chmod(0o755)
    camp = tmp_path / "camp"
    res = _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in", "--python", str(py))
    assert res.returncode == 0, res.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    for i in range(12):
        done.unlink(missing_ok=True)
        job = subprocess.Popen(["bash", str(camp / "scripts" / "00-prepare.sbatch")],
                               env={**env, "SLURM_JOB_ID": str(500 + i)}, cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
        deadline = time.monotonic() + 30
        while not done.exists() and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        while job.poll() is None and time.monotonic() < deadline:
            try:
                os.killpg(job.pid, signal.SIGTERM)
            except ProcessLookupError:
                break
            time.sleep(0.002)
        job.wait(timeout=30)
        record = camp / "logs" / f"prepare-{500 + i}.exit"
        assert record.is_file(), f"run {i}: no exit record (the job exited {job.returncode})"
        assert record.read_text() in ("0\n", "143\n"), record.read_text()
