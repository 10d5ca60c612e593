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
- The verify job piped ``verify-kernel --json`` into ``write_new``, which could not know how
  the command ended: one killed while it printed its report (the OOM killer, a ``kill`` of its
  own; the fifteenth pass kept the earlier report only for an empty input) had the half it
  printed replace the earlier run's ``results/verify.json`` (exit 137, 3 runs of 3). Now
  ``write_new FILE CMD...`` runs the command and replaces nothing when it ended by a signal or
  by the kit's exit after a stop (status 128 and up); the job's status is still the command's.
- The build job's scratch check (``in_campaign``, the fifteenth pass) walked every folder again
  from each link's target: 2^n checks for n links on the way. A link in the campaign to
  ``/proc/self/root/proc/self/root/.../tmp`` (under the user's own link to it, a scratch the
  job must refuse) kept the job on its node for about half an hour at 16 repetitions, hours at
  20. Now each path is checked once per call and the job refuses in seconds.
"""

from __future__ import annotations

import builtins
import errno
import json
import os
import subprocess
import sys
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


def _verify_job(tmp_path: Path, python_body: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The verify job's script run by bash as Slurm runs it, with a ``--python`` whose
    ``verify-kernel`` is ``python_body`` (bash), over an earlier run's report."""
    camp = tmp_path / "camp"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/bash\n{python_body}\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"), TMPDIR=str(tmp_path))
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp),
                          "--stand-in", "--no-gpu", "--python", str(fake)], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    report = camp / "results" / "verify.json"
    report.write_text('{"earlier": true}\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(SLURM_JOB_ID="9")
    res = subprocess.run(["bash", str(camp / "scripts" / "20-verify.sbatch")], env=env,
                         capture_output=True, text=True, timeout=60, check=False, cwd="/")
    return res, report


def test_a_verify_killed_while_it_printed_its_report_keeps_the_earlier_one(
        tmp_path: Path) -> None:
    """``verify-kernel`` prints the first half of its report and is killed (SIGKILL): the half
    replaced the earlier report. Now the earlier report stays, named with a fix, and the job
    and its exit record say 137."""
    res, report = _verify_job(tmp_path, 'printf \'{"checks": [1, 2, \'; kill -9 $$')
    assert res.returncode == 137, res
    assert report.read_text() == '{"earlier": true}\n', "a half report replaced the earlier one"
    assert "To fix" in res.stderr, res.stderr
    assert (report.parent.parent / "logs" / "verify-9.exit").read_text() == "137\n"
    assert sorted(p.name for p in report.parent.iterdir()) == ["verify.json"]


def test_a_verify_that_ended_by_itself_still_replaces_the_report(tmp_path: Path) -> None:
    """A report printed whole by a verify-kernel that found the kernel wrong (exit 6) replaces
    the earlier one, and the command runs in the folder write_new was called from, as it did in
    the pipe (not in results/, where write_new works): the kit's own folder, which the job
    enters before it runs the kit (`python -m` imports from its working folder first: the
    seventeenth pass left the campaign for /, and the twenty-fourth found a campaign planned in
    / imported from there)."""
    res, report = _verify_job(tmp_path, 'echo "{\\"cwd\\": \\"$PWD\\"}"; exit 6')
    assert res.returncode == 6, res
    kit = Path(__file__).resolve().parents[2] / "src"
    assert json.loads(report.read_text()) == {"cwd": str(kit)}


def test_a_link_in_the_campaign_through_proc_self_root_is_refused_at_once(
        tmp_path: Path) -> None:
    """The user's scratch is their link to a link in the campaign (refused since the
    fifteenth pass), which whoever writes the campaign points at
    ``/proc/self/root/proc/self/root/.../tmp``: the job's check walked every folder again from
    each ``self`` link's target, 2^n checks for n links (10 times: 30 s; 16 times: about half
    an hour), so the job sat on its node instead of refusing. Now each path is checked once
    and the job refuses (exit 2) in seconds."""
    camp = tmp_path / "camp"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "scr").symlink_to(camp / "lnk")
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/bash\necho "$*" >> {tmp_path / "ran.log"}\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"), TMPDIR=str(tmp_path))
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp),
                          "--stand-in", "--python", str(fake), "--scratch", f"{mine}/scr/s"],
                         env=env, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    (camp / "lnk").symlink_to("/proc/self/root" * 16 + "/tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(SLURM_JOB_ID="7")
    try:
        res = subprocess.run(["bash", str(camp / "scripts" / "10-build-baseline.sbatch")],
                             env=env, capture_output=True, text=True, timeout=40, check=False,
                             cwd="/")
    except subprocess.TimeoutExpired:
        raise AssertionError("the job's scratch check still ran after 40 s") from None
    assert res.returncode == 2, res
    assert "refusing to build in" in res.stderr and "To fix" in res.stderr, res.stderr
    assert not (tmp_path / "ran.log").exists()
