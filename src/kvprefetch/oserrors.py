"""Operating-system failures (full disk, read-only file system, permissions) as the kit's
errors: one line naming the path and the cause, then "To fix", in the family of the command
that hit it. ``shutil.Error`` (copytree's list of every failed file) is reduced to its first
entry instead of being printed whole."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import KvprefetchError

_FIX = {
    errno.ENOSPC: "free space on that file system (`df -h {where}`), or pass a --workdir on a "
                  "larger one, then rerun: partial files of this run were removed",
    errno.EDQUOT: "free space within your quota, or pass a --workdir elsewhere, then rerun",
    errno.EROFS: "the file system is mounted read-only: pass a writable --workdir, or remount it "
                 "read-write, then rerun",
    errno.EACCES: "make {where} writable for this user (or pass a --workdir you own), then rerun",
    errno.EPERM: "make {where} writable for this user (or pass a --workdir you own), then rerun",
}


def describe(exc: OSError) -> tuple[str, str]:
    """(cause, fix) for an OSError."""
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list) \
            and exc.args[0]:
        first = exc.args[0][0]
        n = len(exc.args[0])
        src, dst, why = [*first, "", "", ""][:3]
        more = f" (and {n - 1} more files)" if n > 1 else ""
        return (f"copying {src} to {dst} failed: {why}{more}",
                "free space or fix the permissions of the destination, then rerun")
    where = exc.filename or ""
    if exc.filename2:
        where = f"{exc.filename} -> {exc.filename2}"
    reason = exc.strerror or str(exc)
    cause = f"{where}: {reason}" if where else reason
    fix = _FIX.get(exc.errno or 0, "check the path and its file system, then rerun")
    return cause, fix.format(where=os.path.dirname(str(exc.filename or ".")) or ".")


@contextmanager
def mapped(family: type[KvprefetchError], doing: str) -> Iterator[None]:
    """Turn an OSError raised inside into ``family`` ("<doing> failed: <path>: <reason>")."""
    try:
        yield
    except OSError as exc:
        cause, fix = describe(exc)
        raise family(f"{doing} failed: {cause}", fix) from exc
