"""A stopped child's processes below it end before ``runner.run`` returns (issue 41, the
twenty-ninth hostile pass left it open): after a SIGTERM during ``build``, ninja forwarded the
stop to its commands and exited, and nvcc, its ``sh`` and ``cudafe++`` (each command in a
process group of its own, as ninja starts them) ran on for up to 2 s, reparented to init, after
the kit had released the build's lock. Real processes: a Python child that starts a grandchild
in a group of its own, as ninja does, stopped by ``run``'s timeout (the stop a Ctrl-C makes)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from kvprefetch import proctree, runner

_CHILD = r'''
import os, signal, subprocess, sys, time
# its output is not the kit's pipe (ninja reads each command's own), so nothing of the run
# waits on it
grandchild = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]],
                              start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
forward = sys.argv[3] == "forward"
def stop(signum, frame):
    if forward:  # as ninja does: its commands' groups get the stop, then it exits at once
        os.killpg(grandchild.pid, signum)
    os._exit(130)
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
print(grandchild.pid, flush=True)
time.sleep(60)
'''

# the grandchild: on the stop it takes 1 s to clean up (nvcc removing its tmpxft files), then
# says so; without a stop it would run for a minute
_GRANDCHILD = r'''
import signal, sys, time
from pathlib import Path
def stop(signum, frame):
    time.sleep(1.0)
    Path(sys.argv[1]).write_text("cleaned up")
    sys.exit(130)
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
time.sleep(60)
'''


def _running(pid: int) -> bool:
    """Alive and not a zombie (reparented to init, which reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _stopped_run(tmp_path: Path, forward: str) -> tuple[int, Path, float]:
    marker = tmp_path / "cleaned"
    t0 = time.monotonic()
    done = runner.run([sys.executable, "-c", _CHILD, _GRANDCHILD, str(marker), forward],
                      echo=False, check=False, timeout=2.0)
    took = time.monotonic() - t0
    assert done.returncode != 0
    return int(done.output.split()[0]), marker, took


def test_a_process_below_that_its_parent_stopped_ends_before_run_returns(tmp_path: Path) -> None:
    """The child forwards the stop and exits at once; the grandchild takes 1 s to clean up. The
    run returned while it was still cleaning up; now it returns once the grandchild has
    ended."""
    pid, marker, _ = _stopped_run(tmp_path, "forward")
    assert marker.read_text() == "cleaned up", "run returned before the process below ended"
    assert not _running(pid)


def test_a_process_below_that_nobody_stopped_is_stopped_once_its_parent_has_ended(
        tmp_path: Path) -> None:
    """The child exits without forwarding the stop: the grandchild would have run on for its
    minute. It is asked to stop after ``BELOW_GRACE_S``, and cleans up as a stopped one does."""
    pid, marker, took = _stopped_run(tmp_path, "exit")
    assert not _running(pid), "a process below the stopped child is still running"
    assert marker.read_text() == "cleaned up"
    assert took < 2.0 + proctree.BELOW_GRACE_S + proctree.STOP_GRACE_S
