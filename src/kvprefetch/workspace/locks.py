"""Advisory file locks (fcntl.flock) so two kvprefetch processes never work on the same
tree, environment or build at once. The holder's pid is written into the lock file so the
refusal can name it; a lock file that holds anything else is not the kit's, and is refused
rather than truncated. A lock is never taken through a symlink: a lock file, or the directory
holding it, that is a symlink is refused (it could point outside the work directory)."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import LockError


def _refuse(lock_path: Path, why: str, culprit: Path | None = None) -> LockError:
    """The lock cannot be taken because of ``culprit`` (default: the lock file itself)."""
    culprit = culprit or lock_path
    what = ("replace the symlink " + str(culprit) + " by a real directory (or move it away)"
            if culprit != lock_path else
            f"remove or move away {lock_path} (kvprefetch creates it as an empty file)")
    return LockError(f"cannot take the lock {lock_path}: {why}", f"{what}, then rerun")


def _special(mode: int) -> str:
    return ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device")


# What a lock file of the kit's holds: nothing, or the holder's pid (and what a killed holder
# left: its pid).
_MAX_KIT_LOCK_BYTES = 20


@contextmanager
def locked(lock_path: Path, what: str, *, wait: bool = False) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` for the duration (non-blocking unless ``wait``)."""
    parent = lock_path.parent
    if parent.is_symlink():
        raise _refuse(lock_path, f"the folder holding it, {parent}, is a symlink, and "
                                 "kvprefetch takes no lock through one", parent)
    parent.mkdir(parents=True, exist_ok=True)
    try:  # a FIFO, device or socket in its place is never opened (flock on a FIFO said only
        mode = os.lstat(lock_path).st_mode  # "Invalid argument"; opening a device can act)
    except FileNotFoundError:
        mode = stat.S_IFREG
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
        raise _refuse(lock_path, f"it is {_special(mode)}, not the empty file kvprefetch "
                                 "makes there")
    try:
        # O_NONBLOCK: should a FIFO appear in its place now, the open does not block on it
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC, 0o644)
    except IsADirectoryError:
        raise _refuse(lock_path, "it is a directory") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(lock_path, "it is a symlink") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _refuse(lock_path, f"it is {_special(mode)}, not the empty file kvprefetch "
                                 "makes there")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise LockError(
                f"another kvprefetch process (pid {holder}) is already working on {what} "
                f"(lock {lock_path})",
                "wait for it to finish, or stop it; the lock is released automatically when "
                "that process exits",
            ) from None
        held = os.pread(fd, _MAX_KIT_LOCK_BYTES + 1, 0)
        if held.strip() and not held.strip().isdigit() or len(held) > _MAX_KIT_LOCK_BYTES:
            # not empty and not a pid: a file the kit did not make (an adopted folder's own
            # `.lock`), which the kit never truncates (issue 41, A2)
            fcntl.flock(fd, fcntl.LOCK_UN)
            raise _refuse(lock_path, "it holds data kvprefetch did not write (kvprefetch's lock "
                                     "file is empty or holds a pid)")
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
