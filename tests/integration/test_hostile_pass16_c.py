"""Issue 41, the sixteenth hostile pass (tester c: a re-attack of what the fifteenth pass
changed). Each test fails without its fix (checked by reverting ``src`` and running it):

- A temporary's ownership entry records when its run started (the fifteenth pass), and a run
  was taken for gone whenever ``/proc/<pid>/stat`` could not be read. Under ``hidepid=2`` (or
  ``1``) ``/proc`` hides another user's processes, so in a work directory two users share,
  one user's ``fetch`` or ``clean`` took the other's live run for a killed one and removed its
  temporary under it (seen for real: a live process of root's, looked at by ``nobody`` under
  a ``proc`` mounted with ``hidepid=2``: ``start_time`` None, ``kill`` EPERM, ``_gone`` True).
  Before the fifteenth pass ``kill(pid, 0)``'s EPERM kept it. Now a start time ``/proc`` does
  not give falls back to that: a hidden live run's temporary stays, a dead run's goes.
"""

from __future__ import annotations

import builtins
import errno
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvprefetch.workspace import ownership


def _hide_from_proc(monkeypatch: pytest.MonkeyPatch, pid: int) -> None:
    """What ``hidepid=2`` shows this user of another user's process ``pid``: no
    ``/proc/<pid>`` (ENOENT), and ``kill(pid, 0)`` refused (EPERM), not ESRCH."""
    real_open, real_kill = builtins.open, os.kill

    def hidden_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if str(file).startswith(f"/proc/{pid}/"):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(file))
        return real_open(file, *args, **kwargs)

    def refused_kill(target: int, sig: int) -> None:
        if target == pid:
            raise PermissionError(errno.EPERM, "Operation not permitted")
        real_kill(target, sig)

    monkeypatch.setattr(builtins, "open", hidden_open)
    monkeypatch.setattr(os, "kill", refused_kill)


def test_a_live_run_that_proc_hides_keeps_its_temporary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another user's live run (here a child, hidden as ``hidepid=2`` hides it) made
    ``pristine/.sdist.tmp-N``: this user's orphan removal (fetch's, clean's) removed it. Now it
    stays, and a temporary of a run that has ended (the same hiding) is still removed."""
    root = tmp_path / "wd"
    (root / "pristine").mkdir(parents=True)
    live = subprocess.Popen(["sleep", "60"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    try:
        started = ownership.start_time(live.pid)
        assert started is not None, "no /proc here: the test proves nothing"
        mine = root / "pristine" / f".sdist.tmp-{live.pid}"
        mine.write_text("half an unpack\n")
        ownership.record(root, mine, "tmp", pid=live.pid, started=started)
        debris = root / "pristine" / f".sdist.tmp-{dead.pid}"
        debris.write_text("left by a killed run\n")
        ownership.record(root, debris, "tmp", pid=dead.pid, started=started + 1)
        _hide_from_proc(monkeypatch, live.pid)
        removed = ownership.remove_orphans(root)
        monkeypatch.undo()
        assert mine.exists(), f"a live run's temporary was removed under it: {removed}"
        assert not debris.exists(), f"a dead run's temporary was kept: {removed}"
    finally:
        live.kill()
        live.wait()
