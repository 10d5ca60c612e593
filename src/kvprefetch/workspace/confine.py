"""Where the kit may act, whatever it reads.

The work directory (and a campaign folder) may be written by the user, by other programs and by
killed runs of the kit; so every path the kit reads back from a file (the ownership record, an
apply journal, a state record, a manifest, a campaign) is data, never trusted as code. Before a
delete, move or write, such a path passes through this module:

- ``record_path`` turns a relative path read from a record into ``root/rel`` and refuses, as a
  corrupt record, anything that is not a plain relative path inside ``root`` (absolute, ``..``,
  ``.``, empty parts, control characters, not a string);
- ``check_target`` refuses a path that is not lexically inside ``root``, or that has a symlink
  on the way from ``root`` to it (``lstat`` only: links are never followed to decide);
- ``write_file`` is the one way the kit writes a file: a temporary file created with
  ``O_EXCL | O_NOFOLLOW`` in the destination's own directory, then renamed over the
  destination; a destination or parent that is a symlink is refused, and so is an existing
  destination that is not a regular file (a device node, a FIFO, a socket: never replaced);
  ``open_new`` is the same for a stream, ``write_if_changed`` skips a write that would change
  nothing;
- ``remove_path`` is the one way the kit deletes: confined, never through a symlink, and
  ``shutil.rmtree``'s fd-based walk unlinks symlinks inside a directory without following them.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from ..errors import ConfigError, KvprefetchError
from ..reading import read_limited

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def has_control(text: str) -> bool:
    """Whether ``text`` holds a control character (a newline, a NUL, an escape, ...)."""
    return bool(_CONTROL.search(text))


def rel_problem(rel: object) -> str | None:
    """Why ``rel`` is not a plain relative path that stays where it is joined (None: it is)."""
    if not isinstance(rel, str) or not rel:
        return "is not a non-empty string"
    if has_control(rel):
        return "contains a control character"
    if rel.startswith("/"):
        return "is absolute"
    if any(part in ("", ".", "..") for part in rel.split("/")):
        return "has a '..', '.' or empty part"
    return None


def record_path(root: Path, rel: object, *, record: Path | str,
                family: type[KvprefetchError] = ConfigError, fix: str) -> Path:
    """``root/rel`` for a relative path ``rel`` read from ``record``; a path that would leave
    ``root`` makes the record corrupt (``family`` with ``fix``)."""
    problem = rel_problem(rel)
    if problem is not None:
        raise family(f"{record} is corrupt: the path {rel!r} in it {problem}, so it could point "
                     f"outside {root}; kvprefetch acts on no path from that record", fix)
    assert isinstance(rel, str)
    return root.joinpath(*PurePosixPath(rel).parts)


def inside(root: Path, path: Path) -> bool:
    """Whether ``path`` is ``root`` or under it, lexically (no link is followed)."""
    r = os.path.normpath(os.path.abspath(root))
    p = os.path.normpath(os.path.abspath(path))
    return p == r or p.startswith(r.rstrip("/") + "/")


def first_symlink(root: Path, path: Path) -> Path | None:
    """The first symlink among the entries between ``root`` (not included) and ``path``
    (included), by ``lstat``; None when there is none (missing entries end the walk)."""
    r = Path(os.path.normpath(os.path.abspath(root)))
    p = Path(os.path.normpath(os.path.abspath(path)))
    cur = r
    for part in p.relative_to(r).parts:
        cur = cur / part
        try:
            mode = os.lstat(cur).st_mode
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(mode):
            return cur
    return None


def check_target(root: Path, path: Path, *, what: str,
                 family: type[KvprefetchError] = ConfigError) -> None:
    """Refuse to ``what`` (remove, write, create, replace) ``path`` unless it is inside ``root``
    with no symlink on the way."""
    if not inside(root, path):
        raise family(f"refusing to {what} {path}: it is outside {root}",
                     "kvprefetch acts only inside its work directory; if a record named this "
                     "path, the record is corrupt (move it away; `kvprefetch fetch --repair` "
                     "rebuilds the work directory's records)")
    link = first_symlink(root, path)
    if link is not None:
        raise family(f"refusing to {what} {path}: {link} is a symlink, and kvprefetch never "
                     "writes, moves or deletes through one",
                     f"replace the symlink {link} by a real directory (or move it away), "
                     "then rerun")


def ensure_dir(d: Path, *, root: Path | None = None,
               family: type[KvprefetchError] = ConfigError) -> None:
    """``mkdir -p d`` without going through a symlink (checked from ``root`` when given, else
    ``d`` itself)."""
    if root is not None:
        check_target(root, d, what="create a folder at", family=family)
        cur = Path(os.path.normpath(os.path.abspath(root)))
        cur.mkdir(parents=True, exist_ok=True)
        for part in Path(os.path.normpath(os.path.abspath(d))).relative_to(cur).parts:
            cur = cur / part
            try:
                cur.mkdir()
            except FileExistsError:
                pass
            if cur.is_symlink() or not cur.is_dir():
                raise family(f"cannot create the folder {d}: {cur} is "
                             f"{'a symlink' if cur.is_symlink() else 'not a directory'}",
                             f"move {cur} away, then rerun")
        return
    if d.is_symlink():
        raise family(f"refusing to write into {d}: it is a symlink",
                     f"replace the symlink {d} by a real directory, then rerun")
    d.mkdir(parents=True, exist_ok=True)


@contextmanager
def open_new(path: Path, *, root: Path | None = None, mode: int = 0o644,
             family: type[KvprefetchError] = ConfigError) -> Iterator[BinaryIO]:
    """A binary file to stream into ``path`` (a download, a large output), written as
    ``write_file`` writes: a new temporary file in the same directory (``O_EXCL |
    O_NOFOLLOW``), renamed over ``path`` only when the block ends without an exception (else
    removed). A symlinked destination or parent is refused (from ``root`` down, when given), and
    so is an existing destination that is not a regular file (a device node, a FIFO)."""
    ensure_dir(path.parent, root=root, family=family)
    if root is not None:
        check_target(root, path, what="write", family=family)
    if path.is_symlink() or path.parent.is_symlink():
        link = path if path.is_symlink() else path.parent
        raise family(f"refusing to write {path}: {link} is a symlink, and kvprefetch never "
                     "writes through one", f"move the symlink {link} away, then rerun")
    if os.path.isdir(path):
        raise family(f"cannot write {path}: a directory is in its place",
                     f"move {path} away, then rerun")
    # only a regular file is ever replaced: the rename would put a file in place of a device
    # node (`-o /dev/null` as root), a FIFO or a socket, which is no output of the kit's
    try:
        existing = os.lstat(path).st_mode
    except FileNotFoundError:
        existing = None
    if existing is not None and not stat.S_ISREG(existing):
        raise family(f"refusing to write {path}: it exists and is {_kind(existing)}, not a "
                     "regular file, and kvprefetch replaces only regular files",
                     f"write to another path, or move {path} away if it is yours, then rerun")
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(3)}-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.chmod(tmp, mode)  # not the umask's
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def _kind(mode: int) -> str:
    """What a non-regular, non-directory file is, in words."""
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


def write_file(path: Path, data: bytes | str, *, root: Path | None = None, mode: int = 0o644,
               family: type[KvprefetchError] = ConfigError) -> None:
    """Write ``data`` to ``path`` atomically: a new temporary file in the same directory
    (``O_EXCL | O_NOFOLLOW``), then ``os.replace``. A symlinked destination or parent is refused
    (from ``root`` down, when given)."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with open_new(path, root=root, mode=mode, family=family) as f:
        f.write(payload)


def write_if_changed(path: Path, data: bytes | str, *, root: Path | None = None,
                     mode: int = 0o644, family: type[KvprefetchError] = ConfigError) -> bool:
    """``write_file``, only when ``path`` does not already hold ``data`` (a plain file's bytes
    are compared; a FIFO or a link is never read). True when it wrote."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    if is_plain_file(path):
        try:
            if read_limited(path, max(len(payload), 1)) == payload:
                return False
        except (OSError, ValueError):
            pass
    write_file(path, payload, root=root, mode=mode, family=family)
    return True


def remove_path(root: Path, path: Path, *,
                family: type[KvprefetchError] = ConfigError) -> None:
    """Remove ``path`` (a file or a directory) inside ``root``, never through a symlink."""
    if os.path.normpath(os.path.abspath(path)) == os.path.normpath(os.path.abspath(root)):
        raise family(f"refusing to remove {path}: it is the work directory itself",
                     "a record naming it is corrupt: move the record away")
    check_target(root, path, what="remove", family=family)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)  # fd-based: unlinks symlinks inside, never follows them
    else:
        os.unlink(path)


def is_plain_file(path: Path) -> bool:
    """A regular file that is not a symlink (never a FIFO, device or socket)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False
