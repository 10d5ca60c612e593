"""sha256 helpers and the per-tree file inventory used to tell a pristine tree from a
modified one."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path

# Things a build or an editable install legitimately adds inside a tree; they are not
# "local modifications" of the sources.
_IGNORED_DIRS = {".git", "build", ".deps", "__pycache__", ".eggs"}
_IGNORED_SUFFIXES = (".so", ".pyc", ".o")


def sha256_file(path: str | os.PathLike[str]) -> str:
    """sha256 of a regular file. A FIFO, device or socket is an OSError naming it, never read
    (opened with O_NONBLOCK, so a FIFO with no writer does not hang the kit)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, device or socket); "
                                        "kvprefetch reads only regular files", os.fspath(path))
        h = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def inventory(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every source file under ``root`` (build outputs skipped)."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in _IGNORED_DIRS and not d.endswith(".egg-info"))
        for name in sorted(filenames):
            if name.endswith(_IGNORED_SUFFIXES) or name == "_version.py":
                continue
            p = Path(dirpath, name)
            if p.is_symlink() or not p.is_file():
                continue
            out[p.relative_to(root).as_posix()] = sha256_file(p)
    return out


def differences(recorded: dict[str, str], current: dict[str, str]) -> list[str]:
    """Human-readable list of what differs: ``M path``, ``A path`` (added), ``D path``."""
    diffs = [f"M {p}" for p in sorted(recorded.keys() & current.keys())
             if recorded[p] != current[p]]
    diffs += [f"D {p}" for p in sorted(recorded.keys() - current.keys())]
    diffs += [f"A {p}" for p in sorted(current.keys() - recorded.keys())]
    return diffs


def source_manifest(root: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Relative path -> sha256 of EVERY file under ``root`` (a symlink: ``-> target``), nothing
    skipped but the top-level names in ``skip``: what a source must match in full."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here == root:
            dirnames[:] = [d for d in dirnames if d not in skip]
            filenames = [f for f in filenames if f not in skip]
        dirnames.sort()
        for name in sorted(filenames + [d for d in dirnames if (here / d).is_symlink()]):
            p = here / name
            key = p.relative_to(root).as_posix()
            mode = os.lstat(p).st_mode
            if stat.S_ISLNK(mode):
                out[key] = "-> " + os.readlink(p)
            elif stat.S_ISREG(mode):
                out[key] = sha256_file(p)
            else:  # a FIFO, device or socket: never opened; it makes the source differ
                out[key] = f"! special file (mode {stat.S_IFMT(mode):o})"
    return out


def manifest_digest(manifest: dict[str, str]) -> str:
    """One sha256 over a manifest (sorted ``path\\0hash\\n`` lines): a whole source's identity."""
    h = hashlib.sha256()
    for path, digest in sorted(manifest.items()):
        h.update(f"{path}\0{digest}\n".encode())
    return h.hexdigest()
