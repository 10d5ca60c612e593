"""Issue 41, the thirty-ninth hostile pass (tester a: the last session's new code read as an
attacker, then every write path with another user's link or folder on the way). Each test
fails without its fix (checked by reverting ``src`` and running it):

- **An output written into the folder another user's link chose, after the option's check.**
  Pass 38 refused another user's link on the way to ``-o``/``--out``/``--readme`` when the
  option is read (``cli/common.refuse_foreign_links``), but the writers then opened the output's
  folder by path (``confine.open_dir`` and ``ensure_dir`` with no work directory: only the last
  part not followed). A folder of another user's on the way (``/tmp/theirs/a/run``) is theirs to
  rename and replace by their link at any time: swapped once ``report`` had read its input,
  ``report --out /tmp/theirs/a/run`` made ``run`` in the folder the link chose and wrote its
  report there, and ``report --readme /tmp/theirs/a/docs/R.md`` rewrote another ``docs/R.md``
  of the user's. The output's folder is now opened one part at a time from ``/`` down
  (``confine.open_named_dir``): a link is followed only where it belongs to the user or root,
  read from the link itself, and another user's, swapped in after the check, is refused.

Nothing is mocked: the CLI runs as a user runs it; the swap is made when the kit opens its
input (``inotify``), with the kit stopped meanwhile (``SIGSTOP``), so no ``sleep`` orders it."""

from __future__ import annotations

import ctypes
import os
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.integration.helpers import tree_bytes
from tests.integration.test_reliability import _env, outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

NOBODY = 65534
IN_OPEN = 0x20


def _swap_on_open(watched: Path, folder: Path, to: Path) -> tuple[threading.Thread, list, int]:
    """A thread that, when ``watched`` is first opened, stops the kit (its pid put in the list
    it returns), renames ``folder`` away, puts ``nobody``'s link to ``to`` in its place and
    lets the kit go on: another user's folder swapped after the option's check."""
    libc = ctypes.CDLL(None, use_errno=True)
    ifd = libc.inotify_init1(os.O_CLOEXEC)
    assert ifd >= 0
    assert libc.inotify_add_watch(ifd, os.fsencode(watched), IN_OPEN) >= 0
    pid: list[int] = []

    def swap() -> None:
        data = os.read(ifd, 4096)
        assert struct.unpack_from("iIII", data)[1] & IN_OPEN
        os.kill(pid[0], signal.SIGSTOP)
        try:
            folder.rename(folder.with_name(folder.name + ".old"))
            folder.symlink_to(to)
            os.lchown(folder, NOBODY, NOBODY)
        finally:
            os.kill(pid[0], signal.SIGCONT)

    return threading.Thread(target=swap, daemon=True), pid, ifd


def _run_with_swap(args: list[str], watched: Path, folder: Path,
                   to: Path) -> subprocess.CompletedProcess:
    thread, pid, ifd = _swap_on_open(watched, folder, to)
    try:
        thread.start()
        proc = subprocess.Popen([sys.executable, "-m", "kvprefetch", *args], env=_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        pid.append(proc.pid)
        out, err = proc.communicate(timeout=300)
        thread.join(timeout=30)
        assert not thread.is_alive()
    finally:
        os.close(ifd)
    assert folder.is_symlink(), "the swap never happened"
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _theirs(tmp_path: Path) -> Path:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    theirs = shared / "theirs"
    (theirs / "a" / "docs").mkdir(parents=True)
    for p in (theirs, theirs / "a", theirs / "a" / "docs"):
        os.chown(p, NOBODY, NOBODY)
    return theirs


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a folder another user owns")
def test_another_users_folder_swapped_for_their_link_after_the_check_takes_no_output(
        tmp_path: Path, outside: Path) -> None:
    theirs = _theirs(tmp_path)
    result = Path(__file__).resolve().parents[2] / "docs" / "results" / \
        "2026-12-01-h200-decode" / "decode-qwen2.5-7b.json"
    inp = tmp_path / "in.json"
    inp.write_bytes(result.read_bytes())
    res = _run_with_swap(["report", "--out", str(theirs / "a" / "patched"), "--formats", "md",
                          str(inp)], inp, theirs / "a", outside)
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 7, (res.returncode, res.stderr)
    assert "is a symlink that belongs to nobody" in res.stderr and "To fix:" in res.stderr, \
        res.stderr
    assert not (outside / "patched" / "in.md").exists()  # the outside fixture checks the rest

    # --readme, rewritten in place: the user's other docs/R.md is never the one written
    theirs2 = tmp_path / "shared2"
    theirs2.mkdir()
    (theirs2 / "a" / "docs").mkdir(parents=True)
    for p in (theirs2, theirs2 / "a", theirs2 / "a" / "docs"):
        os.chown(p, NOBODY, NOBODY)
    text = "# x\n<!-- commands -->\nold\n<!-- /commands -->\n"
    (theirs2 / "a" / "docs" / "R.md").write_text(text)
    mine = tmp_path / "mine"
    (mine / "docs").mkdir(parents=True)
    (mine / "docs" / "R.md").write_text(text)
    before = tree_bytes(mine)
    readme = theirs2 / "a" / "docs" / "R.md"
    res = _run_with_swap(["report", "--readme", str(readme)], readme, theirs2 / "a", mine)
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 7, (res.returncode, res.stderr)
    assert "is a symlink that belongs to nobody" in res.stderr, res.stderr
    assert tree_bytes(mine) == before


def test_the_users_own_and_roots_links_are_still_followed_to_an_output(tmp_path: Path,
                                                                        outside: Path) -> None:
    """The part-by-part open follows what the kernel follows for the user: their own link, a
    ``..`` after it, folders not made yet; a link to nothing is not made through."""
    result = Path(__file__).resolve().parents[2] / "docs" / "results" / \
        "2026-12-01-h200-decode" / "decode-qwen2.5-7b.json"
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "own").symlink_to("real")
    (tmp_path / "dang").symlink_to(tmp_path / "nothing")
    for out, where in (("own/sub/r1", "real/sub/r1"), ("own/../real/r2", "real/r2"),
                       ("real/new/deeper/r3", "real/new/deeper/r3")):
        res = subprocess.run([sys.executable, "-m", "kvprefetch", "report", "--out", out,
                              "--formats", "md", str(result)], env=_env(), cwd=tmp_path,
                             capture_output=True, text=True, timeout=300, check=False)
        assert res.returncode == 0, res.stderr
        assert (tmp_path / where / "decode-qwen2.5-7b.md").is_file()
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "report", "--out", "dang/r",
                          "--formats", "md", str(result)], env=_env(), cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
    assert not (tmp_path / "nothing").exists()
