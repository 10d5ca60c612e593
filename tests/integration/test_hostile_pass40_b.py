"""Issue 41, the fortieth hostile pass (tester b: outputs and campaigns under swaps by another
user, the races the thirty-ninth pass left untried). Each test fails without its fix (checked
by reverting ``src`` and running it):

- **A bench run's log written into the folder another user's link chose.** ``bench ncu`` (and
  ``bench e2e``) write each program's log beside the run's files (``runner.open_log``). In a
  work directory its folder is opened from the work directory down; with ``--out`` outside
  every work directory, ``open_log`` made the folder by path (``mkdir -p``) and opened the log
  by name, after ``make_dir`` had opened ``--out`` part by part. A folder of another user's on
  the way (``/tmp/theirs/a/patched``), swapped for their link between the two, had ncu's log
  made and written in the folder the link chose (the thirty-ninth pass left "``open_log``
  without a work directory" open, thinking no option reached it). The log's folder is now
  opened as the documents' is, a part at a time from ``/`` (``confine.open_named_dir``, through
  ``confine.open_log_dir``, set for every run by ``workspace/ownership``).

Nothing is mocked: the CLI runs as a user runs it, with pass 33 c's stand-in for Nsight Compute
(none here). The kit is held where it writes its first line to standard error (the command it
is about to run, echoed just before the log is opened): that stream is a pipe the test has
filled, so the write blocks until the test, having swapped the folder, drains it. No ``sleep``
orders anything."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

NOBODY = 65534
SRC = str(Path(__file__).resolve().parents[2] / "src")
F_SETPIPE_SZ = 1031


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVPREFETCH")}
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    env.update(PYTHONPATH=SRC, TMPDIR=str(tmp))
    return env


def _full_pipe() -> tuple[int, int]:
    """A pipe of one page, filled: the next write to it blocks until it is read."""
    r, w = os.pipe()
    fcntl.fcntl(w, F_SETPIPE_SZ, 4096)
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, b"#")
    except BlockingIOError:
        pass
    os.set_blocking(w, True)  # the kit's stderr: a blocking write, as a terminal's
    return r, w


def _blocked_writing_stderr(pid: int, proc: subprocess.Popen) -> bool:
    """Wait until ``pid`` is blocked in write(2, ...) (``/proc/PID/syscall``); False if it
    ended first. A state looked at, not a time waited for."""
    import time

    while proc.poll() is None:
        try:
            fields = Path(f"/proc/{pid}/syscall").read_text().split()
        except OSError:
            return False
        if fields[:2] == ["1", "0x2"]:
            return True
        time.sleep(0.01)
    return False


def _run_held_at_first_stderr_write(args: list[str], tmp_path: Path, swap) -> tuple[int, str]:
    r, w = _full_pipe()
    out = tmp_path / "stdout.txt"
    with out.open("wb") as so:
        proc = subprocess.Popen([sys.executable, "-m", "kvprefetch", *args], env=_env(tmp_path),
                                stdout=so, stderr=w, cwd=tmp_path)
    os.close(w)
    try:
        held = _blocked_writing_stderr(proc.pid, proc)
        if held:
            swap()
        chunks: list[bytes] = []
        reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(r, 65536),
                                                                     b"")), daemon=True)
        reader.start()
        proc.wait(timeout=300)
        reader.join(timeout=30)
    finally:
        os.close(r)
    text = b"".join(chunks).lstrip(b"#").decode(errors="replace") + out.read_text()
    assert held, "the kit never wrote to its standard error: " + text
    return proc.returncode, text


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a folder another user owns")
def test_a_bench_logs_folder_swapped_for_another_users_link_takes_no_log(
        tmp_path: Path, outside: Path) -> None:
    from tests.integration.test_hostile_pass10_r import _published_workdir
    from tests.integration.test_hostile_pass33_c import _writing_ncu

    wd = _published_workdir(tmp_path)
    ncu = _writing_ncu(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    theirs = shared / "theirs"
    (theirs / "a").mkdir(parents=True)
    for p in (theirs, theirs / "a"):
        os.chown(p, NOBODY, NOBODY)
    folder = theirs / "a"

    def swap() -> None:  # nobody's folder renamed away, their link to the user's in its place
        folder.rename(folder.with_name("a.old"))
        folder.symlink_to(outside)
        os.lchown(folder, NOBODY, NOBODY)

    out = folder / "patched"  # outside/patched is a folder of the user's, elsewhere
    code, text = _run_held_at_first_stderr_write(
        ["bench", "ncu", "--workdir", str(wd), "--ncu", str(ncu), "--shape", "1x1k",
         "--formats", "json", "--out", str(out)], tmp_path, swap)
    assert folder.is_symlink(), "the swap never happened"
    assert "Traceback" not in text, text
    # without the fix: ncu's log made and written in outside/patched (the fixture sees it too)
    assert not (outside / "patched" / "ncu-1-baseline.log").exists(), text
    assert code != 0, text
    assert "is a symlink that belongs to nobody" in text and "To fix:" in text, text


def _exchange(a: Path, b: Path) -> None:
    """``renameat2(a, b, RENAME_EXCHANGE)``: the two names swap in one step, as another user's
    swap loop does."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), 2) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(a))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a folder another user owns")
def test_report_index_under_another_users_folder_swaps_names_the_swap(
        tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``report --index D --out /tmp/theirs/a/x/results.md`` while ``nobody`` swaps their folder
    ``a`` with their link to the user's folder (``renameat2`` exchange): realpath read ``a`` as
    a link, then found a folder to read the link of, and the command said "report failed:
    .../a: Invalid argument / To fix: check the path and its file system". Nothing was written
    outside either way (the write opens the folder from ``/`` down); the message now names the
    swap.

    The swaps are real ``renameat2`` exchanges of the real folder and link, made at the one
    instant that matters: the link is in place for realpath's ``lstat`` of ``a``, and the folder
    is back before realpath reads the link. A hook on ``os.lstat``, acting only for realpath's
    own call, makes the two exchanges around it; every other check sees the folder. The first
    version of this test ran a swap loop in another process until the race was met, and a
    fresh CI machine went 3,000 runs without meeting it; the hook meets it every time."""
    import stat as stat_mod

    from click.testing import CliRunner

    from kvprefetch.cli.report import report as report_cmd
    from kvprefetch.errors import BenchError

    results = Path(__file__).resolve().parents[2] / "docs" / "results" / \
        "2026-12-01-h200-decode"
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    theirs = shared / "theirs"
    (theirs / "a" / "x").mkdir(parents=True)
    (outside / "x").mkdir()
    (theirs / "alink").symlink_to(outside)
    for p in (theirs, theirs / "a", theirs / "a" / "x"):
        os.chown(p, NOBODY, NOBODY)
    os.lchown(theirs / "alink", NOBODY, NOBODY)
    swapped: list[str] = []
    real_lstat = os.lstat

    def lstat_in_a_swap(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        caller = sys._getframe(1).f_code
        by_realpath = "posixpath" in caller.co_filename and "realpath" in caller.co_name
        if swapped or not by_realpath or os.fspath(path) != str(theirs / "a"):
            return real_lstat(path, *args, **kwargs)
        _exchange(theirs / "a", theirs / "alink")  # ``a`` is their link ...
        try:
            st = real_lstat(path, *args, **kwargs)
        finally:
            _exchange(theirs / "a", theirs / "alink")  # ... and their folder again
        swapped.append(stat_mod.filemode(st.st_mode))
        return st

    monkeypatch.setattr(os, "lstat", lstat_in_a_swap)
    try:
        res = CliRunner().invoke(report_cmd, ["--index", str(results), "--out",
                                              str(theirs / "a" / "x" / "results.md")])
    finally:
        monkeypatch.undo()
        (outside / "x").rmdir()  # the outside fixture: nothing else there changed
    assert swapped == ["lrwxrwxrwx"], f"realpath never saw their link: {swapped}"
    # without the fix: OSError(EINVAL, 'Invalid argument') out of Path.resolve
    exc = res.exception
    assert isinstance(exc, BenchError), repr(exc)
    assert "stopped being a symlink" in exc.cause, exc.cause
    assert str(theirs / "a") in exc.cause
