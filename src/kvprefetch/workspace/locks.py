"""Advisory file locks (fcntl.flock) so two kvprefetch processes never work on the same
tree, environment or build at once. The holder writes ``kvprefetch-lock pid <pid>`` into the lock
file (so a refusal can name it) and empties it on release; a lock file that holds anything else
is not the kit's, and is refused rather than truncated: a user's file of digits too (issue 41,
third pass: a digit-only ``.lock`` was taken for a stale lock of the kit's and emptied). A lock is
never taken through a symlink: a lock file, or the directory holding it, that is a symlink is
refused (it could point outside the work directory)."""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import LockError
from .confine import kind_of, make_dirs


def _refuse(lock_path: Path, why: str, culprit: Path | None = None) -> LockError:
    """The lock cannot be taken because of ``culprit`` (default: the lock file itself)."""
    culprit = culprit or lock_path
    what = ("replace the symlink " + str(culprit) + " by a real directory (or move it away)"
            if culprit != lock_path else
            f"remove or move away {lock_path} (kvprefetch creates it as an empty file)")
    return LockError(f"cannot take the lock {lock_path}: {why}", f"{what}, then rerun")


# What a lock file of the kit's holds: nothing, or the marker with the holder's pid (what a
# killed holder left too). A bare pid, what kits before this marker wrote, is refused as well:
# it cannot be told from a user's file of digits.
_MARKER = "kvprefetch-lock pid "
_KIT_LOCK = re.compile(rb"kvprefetch-lock pid ([0-9]{1,7})\n?")
_MAX_KIT_LOCK_BYTES = 40


def _holder(held: bytes) -> str:
    m = _KIT_LOCK.fullmatch(held)
    return m[1].decode() if m else "unknown"


def refusal(lock_path: Path, place: str = "work directory") -> LockError | None:
    """What ``locked`` would refuse in the lock file now at ``lock_path`` (a symlink, no regular
    file, a hard link, data the kit did not write), for a dry run, which takes no lock; None
    where there is nothing or a lock file of the kit's. Only looked at (``lstat``, and a read
    of a regular file opened without following a link)."""
    try:
        st = os.lstat(lock_path)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return _refuse(lock_path, "it is a symlink")
    if stat.S_ISDIR(st.st_mode):
        return _refuse(lock_path, "it is a directory")
    if not stat.S_ISREG(st.st_mode):
        return _refuse(lock_path, f"it is {kind_of(st.st_mode)}, not the empty file kvprefetch "
                                  "makes there")
    if st.st_nlink > 1:
        return _refuse(lock_path, f"it has {st.st_nlink} hard links (it is also a file under "
                                  f"another name, perhaps outside the {place}), and kvprefetch "
                                  "writes only into the lock file it makes")
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        held = os.pread(fd, _MAX_KIT_LOCK_BYTES + 1, 0)
    finally:
        os.close(fd)
    if held and not _KIT_LOCK.fullmatch(held):
        return LockError(f"cannot take the lock {lock_path}: it holds data kvprefetch did not "
                         "write (kvprefetch's lock file is empty, or holds "
                         f"'{_MARKER}<pid>' while a run holds it)",
                         f"if no kvprefetch runs on this {place} and {lock_path} is not yours "
                         "remove it; if it is yours, move it away; then rerun")
    return None


@contextmanager
def locked(lock_path: Path, what: str, *, wait: bool | float = False,
           root: Path | None = None,
           place: str = "work directory") -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` for the duration (non-blocking unless ``wait``:
    ``True`` waits for the holder as long as it takes, a number of seconds that long at most).
    ``root``: the work directory the lock is under: its folder is then made, and the lock file
    opened, from ``root`` down without following a link (``confine``), for a lock deeper than
    one folder below it (a ``build/`` planted as a link to a folder outside had the build's
    ``build/<tree>/.lock``, and its folder, made there: issue 41, the thirteenth hostile
    pass). ``place``: what the lock guards, as its messages name it (a campaign's lock said
    "work directory", issue 41, the twelfth pass left it open)."""
    parent = lock_path.parent
    if parent.is_symlink():
        raise _refuse(lock_path, f"the folder holding it, {parent}, is a symlink, and "
                                 "kvprefetch takes no lock through one", parent)
    if os.path.lexists(parent) and not parent.is_dir():
        # a user's file named `.locks` in an adopted directory: "File exists" told nothing
        raise LockError(f"cannot take the lock {lock_path}: the folder that should hold it, "
                        f"{parent}, is a file", f"move {parent} away (kvprefetch makes a folder "
                                                "there), then rerun")
    if root is not None:
        from . import confine
        confine.ensure_dir(parent, root=root, family=LockError)
        pfd = confine.open_dir(parent, root=root, what="take a lock in", family=LockError)
    else:
        make_dirs(parent)
        pfd = _open_parent(lock_path, parent)
    try:
        with _opened(lock_path, wait, what, pfd, place) as _fd:
            yield
    finally:
        os.close(pfd)


def _open_parent(lock_path: Path, parent: Path) -> int:
    """The folder holding the lock, opened without following a link: the check above reads it
    by path, and a folder swapped for a link to a folder outside after that check had the lock
    file made there through the link (issue 41, the fourteenth hostile pass: a swap loop on
    `.locks` during `apply` made `tree-patched.lock` outside, 1 run in 2). Its own folder is the
    work directory (or the campaign) the user named: trusted, as ``--workdir`` is."""
    try:
        return os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _refuse(lock_path, f"the folder holding it, {parent}, is a symlink (or not "
                                     "a folder), and kvprefetch takes no lock through one",
                          parent) from None
        raise


def _flock(fd: int, wait: bool | float) -> None:
    """``flock(LOCK_EX)`` on ``fd``: at once (``BlockingIOError`` if held), for ever
    (``True``), or for at most ``wait`` seconds. A lock that is only held for a moment (the
    ownership record's) waited for ever: a holder that never let go (a process stopped with
    Ctrl-Z, or one that whoever writes the work directory runs to hold it) hung ``apply``
    with no word (issue 41, the fifteenth hostile pass)."""
    if wait is True:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    deadline = time.monotonic() + (0 if wait is False else float(wait))
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


@contextmanager
def _opened(lock_path: Path, wait: bool | float, what: str, pfd: int,
            place: str) -> Iterator[int]:
    """The lock file opened (relative to its folder's descriptor ``pfd``), checked,
    locked and marked with this pid for the duration."""
    try:  # a FIFO, device or socket in its place is never opened (flock on a FIFO said only
        mode = os.lstat(lock_path).st_mode  # "Invalid argument"; opening a device can act)
    except FileNotFoundError:
        mode = stat.S_IFREG
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
        raise _refuse(lock_path, f"it is {kind_of(mode)}, not the empty file kvprefetch "
                                 "makes there")
    try:
        # O_NONBLOCK: should a FIFO appear in its place now, the open does not block on it
        fd = os.open(lock_path.name,
                     os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o644, dir_fd=pfd)
    except IsADirectoryError:
        raise _refuse(lock_path, "it is a directory") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(lock_path, "it is a symlink") from None
        # opened by its name in its folder's descriptor, the error named only that name, and
        # the fix "." (the caller's folder): "tree-patched.lock: Read-only file system / To
        # fix: . is on a file system mounted read-only" (issue 41, the nineteenth hostile pass)
        raise OSError(exc.errno, exc.strerror, str(lock_path)) from exc
    st = os.fstat(fd)
    mode = st.st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _refuse(lock_path, f"it is {kind_of(mode)}, not the empty file kvprefetch "
                                 "makes there")
    if st.st_nlink > 1:
        # a hard link: the same file under another name, maybe outside the work directory,
        # which the marker (and the truncation on release) would write (issue 41, ninth pass:
        # an empty file outside, hard-linked at `.locks/tree-patched.lock`, was written)
        os.close(fd)
        raise _refuse(lock_path, f"it has {st.st_nlink} hard links (it is also a file under "
                                 "another name, perhaps outside the " + place + "), and "
                                 "kvprefetch writes only into the lock file it makes")
    try:
        try:
            _flock(fd, wait)
        except BlockingIOError:
            holder = _holder(os.pread(fd, _MAX_KIT_LOCK_BYTES + 1, 0))
            raise LockError(
                f"another kvprefetch process (pid {holder}) is already working on {what} "
                f"(lock {lock_path})",
                "wait for it to finish, or stop it; the lock is released automatically when "
                "that process exits",
            ) from None
        held = os.pread(fd, _MAX_KIT_LOCK_BYTES + 1, 0)
        if held and not _KIT_LOCK.fullmatch(held):
            # not empty and not the kit's marker: a file the kit did not make (an adopted
            # folder's own `.lock`, issue 41 A2; a file of digits, third pass), which the kit
            # never truncates
            fcntl.flock(fd, fcntl.LOCK_UN)
            bare = held.strip().isdigit()
            raise LockError(
                f"cannot take the lock {lock_path}: it holds "
                + ("only digits" if bare else "data") + " kvprefetch did not write "
                f"(kvprefetch's lock file is empty, or holds '{_MARKER}<pid>' while a run "
                "holds it)",
                f"if no kvprefetch runs on this {place} and {lock_path} is not yours "
                + ("(a kvprefetch older than this marker left its bare pid there when it was "
                   "killed) " if bare else "") + "remove it; if it is yours, move it away; "
                "then rerun")
        os.ftruncate(fd, 0)
        try:
            os.pwrite(fd, f"{_MARKER}{os.getpid()}\n".encode(), 0)
        except OSError as exc:  # a full disk: a write to a descriptor names no file, and
            # `build` said "No space left on device / (`df -h .`)", the user's shell's folder
            # (issue 41, the twenty-fourth hostile pass)
            raise OSError(exc.errno, exc.strerror, str(lock_path)) from exc
        try:
            yield fd
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
