"""Advisory file locks (fcntl.flock) so two kvprefetch processes never work on the same
tree, environment or build at once. The holder's pid is written into the lock file so the
refusal can name it."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import LockError


@contextmanager
def locked(lock_path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive, non-blocking lock on ``lock_path`` for the duration."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise LockError(
                f"another kvprefetch process (pid {holder}) is already working on {what} "
                f"(lock {lock_path})",
                "wait for it to finish, or stop it; the lock is released automatically when "
                "that process exits",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
