"""What kvprefetch created inside a work directory, and removing only that.

``<workdir>/.kvprefetch-owned.json`` maps each path the kit made (relative to the work
directory) to what it is: ``tree`` (with the sha256 of its file inventory when the kit last
wrote it, so an edited tree is told apart), ``pristine``, ``state``, ``backup``, ``build``, or
``tmp`` (a temporary directory of a running step, with its pid: once that process is gone it is
an orphan the next run removes). Nothing else is ever deleted: a folder the user put under
``build/`` or ``trees/`` is not in the record. Removal never follows a symlink: a path is
removed only when neither it nor any directory between the work directory and it is a symlink.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .locks import locked
from .workdir import write_json_atomic

OWNED_FILE = ".kvprefetch-owned.json"


def inventory_digest(inv: dict[str, str]) -> str:
    """One sha256 over a tree's inventory (path -> sha256): the tree's content hash."""
    return hashlib.sha256(json.dumps(sorted(inv.items())).encode()).hexdigest()


def _path(root: Path) -> Path:
    return root / OWNED_FILE


def entries(root: Path) -> dict[str, dict[str, Any]]:
    p = _path(root)
    if not os.path.lexists(p):
        return {}
    try:
        if p.is_symlink() or not p.is_file():
            raise ValueError("not a regular file")
        data = json.loads(p.read_bytes().decode("utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("paths"), dict) or not all(
                isinstance(v, dict) for v in data["paths"].values()):
            raise ValueError("not kvprefetch's ownership record")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"the ownership record {p} is corrupt ({exc})",
                          "move it away; `kvprefetch fetch --repair` records the trees again "
                          "(until then clean removes nothing)") from None
    out: dict[str, dict[str, Any]] = data["paths"]
    return out


@contextmanager
def _editing(root: Path) -> Iterator[dict[str, dict[str, Any]]]:
    with locked(root / ".kvprefetch-owned.lock", "the ownership record", wait=True):
        paths = entries(root)
        yield paths
        write_json_atomic(_path(root), {"paths": paths})


def rel(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


def record(root: Path, path: Path, kind: str, **info: Any) -> None:
    with _editing(root) as paths:
        paths[rel(root, path)] = {"kind": kind, **info}


def forget(root: Path, path: Path) -> None:
    with _editing(root) as paths:
        paths.pop(rel(root, path), None)


def owned(root: Path, path: Path) -> dict[str, Any] | None:
    return entries(root).get(rel(root, path))


def symlink_on_the_way(root: Path, path: Path) -> Path | None:
    """The first symlink among ``path`` and the directories between ``root`` and it."""
    cur = root
    for part in path.relative_to(root).parts:
        cur = cur / part
        if cur.is_symlink():
            return cur
    return None


def remove(root: Path, path: Path) -> None:
    """Remove ``path`` (a kit-made file or directory) without following any symlink."""
    link = symlink_on_the_way(root, path)
    if link is not None:
        raise ConfigError(f"refusing to remove {path}: {link} is a symlink",
                          "remove the symlink yourself if you no longer need what it points to")
    if path.is_dir():
        shutil.rmtree(path)  # the fd-based rmtree: it unlinks symlinks inside, never follows
    elif os.path.lexists(path):
        path.unlink()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def temporary(root: Path, path: Path) -> Iterator[Path]:
    """A temporary path the kit creates, recorded (with this pid) before it exists, so a killed
    run leaves an orphan the next run can recognise as the kit's own and remove. On success the
    caller renames it away; on failure it is removed here."""
    record(root, path, "tmp", pid=os.getpid())
    try:
        yield path
    finally:
        if os.path.lexists(path) and symlink_on_the_way(root, path) is None:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink()
        forget(root, path)


SCRATCH = "tmp"


@contextmanager
def scratch_dir(root: Path, prefix: str) -> Iterator[Path]:
    """A new empty directory ``<workdir>/tmp/<prefix>-<pid>-<random>`` for one step's scratch
    files, removed on exit. It is recorded as the kit's temporary before it exists, so one that
    a killed run leaves behind is an orphan that the next fetch or clean removes: the kit writes
    nothing outside its work directory (tempfile's default, /tmp, kept every killed run's)."""
    base = root / SCRATCH
    link = symlink_on_the_way(root, base) if base.exists() or base.is_symlink() else None
    if link is not None:
        raise ConfigError(f"{link} is a symlink; kvprefetch keeps its scratch files in {base}",
                          f"move {link} away")
    path = base / f"{prefix}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with temporary(root, path):
            path.mkdir(parents=True)
            yield path
    finally:
        with suppress(OSError):  # not empty: another step's scratch is in it
            base.rmdir()  # a refused step leaves the work directory as it found it


def orphans(root: Path) -> list[Path]:
    """Temporary paths of kit processes that no longer run."""
    def gone(pid: Any) -> bool:
        return not isinstance(pid, int) or (pid != os.getpid() and not pid_alive(pid))

    return [root / r for r, e in entries(root).items()
            if e.get("kind") == "tmp" and gone(e.get("pid"))]


def remove_orphans(root: Path, dry_run: bool = False) -> list[str]:
    out = []
    for p in orphans(root):
        out.append(str(p))
        if dry_run:
            continue
        if symlink_on_the_way(root, p) is None:
            remove(root, p)
        forget(root, p)
    return out
