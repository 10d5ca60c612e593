"""Issue 41, the thirty-first hostile pass, tester a (job logs and stopping children). Findings:

1. A process below a stopped child that forks in a loop (ignoring the stop signals, in a
   session of its own or the kit's group) had every child it made after ``runner._stop`` read
   the processes below left running, reparented to init: ``proctree.end_below`` (and the
   SIGKILL of a child that outlived its grace) signalled only the processes read once, so the
   newest ones never got a signal (546 ``sleep``s ran on after one stopped ``run``). Now the
   final SIGKILL holds the whole tree with SIGSTOP until no new process is found below it,
   then kills it (``proctree.kill_all``), and the stop signal after ``BELOW_GRACE_S`` goes to
   the ones made meanwhile too.

2. A campaign job stopped by SIGINT (a Ctrl-C on a job run by hand, ``scancel -s INT``),
   SIGHUP or SIGPIPE recorded exit "0" (its EXIT trap saw the status of the last command
   before the signal; only SIGTERM was trapped), so an interrupted job read back as finished;
   SIGUSR1, SIGUSR2 or SIGALRM killed the log's writer, and the job then died of SIGPIPE
   inside its EXIT trap: no exit record at all. Now every ending signal is trapped as
   ``exit 128+n`` and the writer ignores them all (``joblog.TRAP_ENDING_SH``).

Real processes throughout; the graces are shortened (module constants) so each test takes
seconds, not the 13 s of the real ones."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from kvprefetch import proctree, runner
from tests.integration.test_job_log import _campaign
from tests.integration.test_reliability import _env

# a forker ignoring INT and TERM that starts a marked sleep (ignoring them too) every 20 ms;
# {setsid}: in a session of its own (a daemon), or in the kit's group
_CHILD = r'''
{trap}
{setsid} bash -c 'trap "" INT TERM; while :; do (exec -a {mark} sleep 1000) & sleep 0.02; done' \
  </dev/null >/dev/null 2>&1 &
echo started; sleep 60
'''


def _marked(mark: str) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if Path(entry.path, "cmdline").read_bytes().split(b"\0")[0] == mark.encode():
                    pids.append(int(entry.name))
    return pids


@pytest.mark.parametrize("how", ["daemon-below", "child-ignores-the-stop"])
def test_a_process_below_that_forks_in_a_loop_leaves_nothing_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    monkeypatch.setattr(proctree, "STOP_GRACE_S", 1.5)
    monkeypatch.setattr(proctree, "BELOW_GRACE_S", 0.5)
    mark = f"kvp31a-{os.getpid()}-{tmp_path.name}"
    child = _CHILD.format(
        mark=mark, setsid="setsid" if how == "daemon-below" else "",
        trap='trap "" INT TERM' if how == "child-ignores-the-stop" else "")
    try:
        t0 = time.monotonic()
        done = runner.run(["bash", "-c", child], echo=False, check=False, timeout=1.0)
        assert done.returncode != 0 and time.monotonic() - t0 < 15
        time.sleep(0.3)  # a missed one would have been made by now; a killed one reaped
        left = [p for p in _marked(mark)
                if Path(f"/proc/{p}/stat").exists()
                and Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
        assert not left, f"{len(left)} processes below the stopped child run on"
    finally:
        for pid in _marked(mark):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP, signal.SIGUSR1])
def test_a_job_ended_by_a_signal_records_it_and_logs_to_its_end(tmp_path: Path,
                                                                 sig: signal.Signals) -> None:
    camp = _campaign(tmp_path, 'echo "stand-in started"; sleep 60')
    proc = subprocess.Popen(["bash", str(camp / "scripts" / "00-prepare.sbatch")], cwd="/",
                            env=dict(_env(), SLURM_JOB_ID="4242"), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = camp / "logs" / "prepare-4242.out"
    try:
        deadline = time.monotonic() + 30
        while "stand-in started" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline and proc.poll() is None, "the job never started"
            time.sleep(0.05)
        os.killpg(proc.pid, sig)
        assert proc.wait(timeout=30) == 128 + sig
    finally:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert (camp / "logs" / "prepare-4242.exit").read_text() == f"{128 + sig}\n"
    assert log.read_text().startswith("kvprefetch job prepare on ")
