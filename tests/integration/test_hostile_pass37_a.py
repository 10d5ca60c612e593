"""Issue 41, the thirty-seventh hostile pass (tester a: swaps and stops, an attacker who can
write only the work directory). Each test fails without its fix (checked by reverting ``src``
and running it):

- **A fetch of a git repository killed a process that was not the kit's.** ``runner.
  stop_others`` (the thirty-sixth pass: GitPython's ``git clone`` stopped before its folder is
  removed) stopped every process below the kit that ``run`` had not started. A process inherits
  the children of the one it replaced: ``sleep 300 & exec kvprefetch fetch --source git ...``
  (a wrapper's monitor, an ``exec`` at a script's end), and every clone that failed, a bad URL
  included, sent that child SIGINT, waited 10 s (a shell's background job ignores SIGINT) and
  killed it. The children this process had before the clone are now spared, with all below
  them (``runner.others_stopped``, ``proctree.children``); git is still stopped and waited for.
- **Another user's link taken as the work directory or campaign.** The command line follows a
  link the user names once (``--workdir``, a campaign); ``nobody``'s ``ln -s /root/empty
  /tmp/shared/camp`` in a sticky folder had ``slurm plan /tmp/shared/camp`` write the campaign
  into the empty folder nobody chose (and ``fetch --workdir`` likewise; where the kernel lets
  root follow such a link, ``fs.protected_symlinks=0``), and the next command can be led to
  another folder of the user's. A named link another user owns (root aside) is now refused
  (``workspace/foreign.refuse_foreign_link``, from ``cli.common._real_workdir`` and
  ``cli.slurm._campaign_folder``).

What held (no test needed): ``renameat2`` swap loops run as ``nobody`` on a world-writable
campaign (``scripts``, ``logs``, ``results``, ``report``, ``cache`` with a link to a victim)
during re-plans, and on ``results``, ``work``, ``work/build/<tree>`` and its build folder during
``slurm stand-in``; ``export-header -o`` and ``report --out`` into a folder swapped with a link;
INT, TERM, HUP, KILL and STOP+CONT at 0.5 to 4 s into ``clean --what all --discard-edits`` and
into ``slurm plan`` at each file it writes (no survivor, no write after exit, nothing in
``TMPDIR``, the rerun works without ``--force``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


def _state(pid: int) -> str | None:
    """The process's state letter (``Z``: ended, not reaped), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except OSError:
        return None


def _fetch_after_a_background_job(tmp_path: Path, *fetch: str,
                                  stop: tuple[Path, int] | None = None) -> tuple[int, str, int]:
    """``sleep 300 & exec kvprefetch fetch ...`` (the sleep becomes the kit's child); the
    fetch's exit status and output, and the sleep's pid. ``stop``: (a folder, a signal) sent
    once a git clone there has checked files out."""
    pidfile = tmp_path / "sleep.pid"
    # the sleep's output elsewhere: it holds no end of the pipe the fetch's output is read from
    script = (f'sleep 300 >/dev/null 2>&1 & echo $! > {pidfile}; '
              'exec "$0" -m kvprefetch fetch "$@"')
    proc = subprocess.Popen(["bash", "-c", script, sys.executable, *fetch], cwd="/",
                            env=dict(os.environ, TMPDIR=str(stop[0]) if stop else
                                     os.environ.get("TMPDIR", "/tmp")),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if stop is not None:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            clones = list(stop[0].glob("kvprefetch-clone-*/vllm"))
            if clones and sum(len(f) for _, _, f in os.walk(clones[0])) > 40:
                break
            time.sleep(0.01)
        assert proc.poll() is None, "the fetch ended before its checkout was seen"
        proc.send_signal(stop[1])
    out, _ = proc.communicate(timeout=120)
    return proc.returncode, out, int(pidfile.read_text())


def test_a_failed_fetch_from_git_leaves_a_process_it_did_not_start_running(
        tmp_path: Path) -> None:
    empty = tmp_path / "not-a-repo"
    empty.mkdir()
    t0 = time.monotonic()
    rc, out, pid = _fetch_after_a_background_job(
        tmp_path, "--workdir", str(tmp_path / "w"), "--source", "git", "--repo-url", str(empty))
    took = time.monotonic() - t0
    try:
        assert rc == 3, out
        assert "git clone of" in out and "To fix:" in out and "Traceback" not in out, out
        assert _state(pid) not in (None, "Z"), f"the shell's background job {pid} was stopped"
        assert took < 8, f"the failed fetch took {took:.1f} s (waited on a process not its own)"
    finally:
        if _state(pid) is not None:
            os.kill(pid, signal.SIGKILL)


def test_a_stopped_fetch_from_git_stops_git_and_spares_a_process_it_did_not_start(
        tmp_path: Path, vllm_git_repo: tuple[Path, str]) -> None:
    repo, sha = vllm_git_repo
    temp = tmp_path / "systemp"
    temp.mkdir()
    rc, out, pid = _fetch_after_a_background_job(
        tmp_path, "--workdir", str(tmp_path / "w"), "--source", str(repo), "--allow-commit", sha,
        stop=(temp, signal.SIGTERM))
    try:
        assert rc in (-signal.SIGTERM, 128 + signal.SIGTERM), out
        assert "Traceback" not in out, out
        time.sleep(0.5)  # anything still writing would show now
        assert list(temp.iterdir()) == [], "git's half-made clone was left in the temp folder"
        assert _state(pid) not in (None, "Z"), f"the shell's background job {pid} was stopped"
    finally:
        if _state(pid) is not None:
            os.kill(pid, signal.SIGKILL)



NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a link another user owns")
def test_a_link_another_user_planted_is_never_taken_as_a_work_directory_or_campaign(
        tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("camp", "work"):
        (shared / name).symlink_to(mine)
        os.lchown(shared / name, NOBODY, NOBODY)
    runs = [["slurm", "plan", "--stand-in", "--no-gpu", str(shared / "camp")],
            ["fetch", "--workdir", str(shared / "work"), "--source", "sdist"],
            ["clean", "--workdir", str(shared / "work"), "--what", "all"]]
    for args in runs:
        res = subprocess.run([sys.executable, "-m", "kvprefetch", *args], capture_output=True,
                             text=True, timeout=300, check=False, cwd="/")
        out = res.stdout + res.stderr
        assert res.returncode == 2, out
        assert "is a symlink that belongs to nobody" in out and "realpath" in out, out
        assert list(mine.iterdir()) == [], f"{args[0]} wrote into the folder nobody's link names"
    own = tmp_path / "own-link"
    own.symlink_to(mine)  # a link of the user's own is still followed once
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "fetch", "--workdir", str(own),
                          "--dry-run"], capture_output=True, text=True, timeout=300,
                         check=False, cwd="/")
    assert res.returncode == 0, res.stdout + res.stderr
