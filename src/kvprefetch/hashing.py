"""sha256 helpers and the per-tree file inventory used to tell a pristine tree from a
modified one."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# What the inventory of a tree leaves out, and why (issue 41, class 6: these used to be skipped
# by name at any depth, so an edited vllm/_version.py, a build/ folder inside csrc/, a .so or a
# new symlink anywhere went unseen):
# - at the tree's top level only, where vLLM's setup.py, CMake and pip write a full build's
#   outputs: build/, .deps/, .eggs/, *.egg-info/ (the sdist ships vllm.egg-info; pip rewrites
#   it), and .git/ of a git source;
# - __pycache__/ at any depth: Python's own bytecode cache, written whenever code of the tree
#   runs (an editable install, a test). The kit never copies one into a tree (fetch leaves the
#   sdist's out), so whatever is in one was written by Python, not by the kit or the user.
# Everything else is in: vllm/_version.py, *.so, *.o, *.pyc outside __pycache__, a nested
# build/, and symlinks (as ``-> target``) and special files, which are never followed or read.
_TOP_LEVEL_OUTPUTS = {".git", "build", ".deps", ".eggs"}
PYCACHE = "__pycache__"
# The rules of inventory(); a state record without "inventory_rules" was made by the old ones
# (legacy_view) and is compared under them until `fetch --repair` or `--force` records it again.
INVENTORY_RULES = 2
_LEGACY_DIRS = {".git", "build", ".deps", PYCACHE, ".eggs"}
_LEGACY_SUFFIXES = (".so", ".pyc", ".o")


# The largest built library the kit hashes before it loads, disassembles or benchmarks it: a
# shared library's code and data sit within 2 GiB of each other (the default code model; a
# CUDA fatbin past that fails to link), so no library the kit builds comes near 4 GiB. A 15 TB
# sparse file at a campaign's envs/<tree>/.../_C.so was hashed for hours by the bench job's
# stand-in (a hang until the time limit; issue 41, the nineteenth hostile pass).
MAX_LIBRARY_BYTES = 4 << 30


def sha256_file(path: str | os.PathLike[str], *, limit: int | None = None) -> str:
    """sha256 of a regular file. A FIFO, device or socket is an OSError naming it, never read
    (opened with O_NONBLOCK, so a FIFO with no writer does not hang the kit); so is a file of
    more than ``limit`` bytes (by the descriptor read), when given."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, device or socket); "
                                        "kvprefetch reads only regular files", os.fspath(path))
        if limit is not None and st.st_size > limit:
            raise OSError(errno.EFBIG, f"{st.st_size} bytes, more than the {limit} bytes any "
                                       "library the kit builds can have; not read",
                          os.fspath(path))
        return sha256_of_size(f, st.st_size, path)


def sha256_of_size(f: Any, size: int, path: str | os.PathLike[str]) -> str:
    """sha256 of the ``size`` bytes fstat gave: a kernel file that says 0 bytes and whose read
    waits or gives what it queued (``/proc/kmsg``, opened O_NONBLOCK: its read gave None) was a
    TypeError traceback in ``slurm stand-in``, named as a manifest's library, and would have
    drained the kernel's log had it held messages (issue 41, the twenty-ninth hostile pass)."""
    h = hashlib.sha256()
    left = size
    while left > 0:
        chunk = f.read(min(left, 1 << 20))
        if chunk is None:
            raise OSError(errno.EAGAIN, "its read would wait (a kernel file, not a library "
                                        "or source file); kvprefetch reads only regular files",
                          os.fspath(path))
        if not chunk:
            break
        h.update(chunk)
        left -= len(chunk)
    return h.hexdigest()


def sha256_file_of_size(path: str | os.PathLike[str], size: int) -> str | None:
    """sha256 of a regular file of exactly ``size`` bytes (a pinned download's), read through
    the descriptor whose size was checked; None for a file of another size, never read. A
    sparse 15 TB file at a cached sdist or CUDA 12 archive in the work directory had the kit
    hash it for hours (a hang; issue 41, the eighteenth hostile pass)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, device or socket); "
                                        "kvprefetch reads only regular files", os.fspath(path))
        if st.st_size != size:
            return None
        return sha256_of_size(f, size, path)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _skipped_dir(here: Path, root: Path, name: str) -> bool:
    if name == PYCACHE:
        return True
    return here == root and (name in _TOP_LEVEL_OUTPUTS or name.endswith(".egg-info"))


def _entry(p: Path) -> str:
    """A file's sha256; ``-> target`` for a symlink; a marker for a FIFO, device or socket."""
    mode = os.lstat(p).st_mode
    if stat.S_ISLNK(mode):
        return "-> " + os.readlink(p)
    if stat.S_ISREG(mode):
        return sha256_file(p)
    return f"! special file (mode {stat.S_IFMT(mode):o})"


def walk(top: str | os.PathLike[str], *, strict: bool = False
         ) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(top)`` (top-down, a symlinked folder listed among the folders and never
    entered, the caller may prune the folders in place, unreadable folders skipped), without
    recursion: Python 3.11's ``os.walk`` calls itself once per level, so a folder 1,500
    levels deep in a tree (anyone who writes the work directory can make one) was a
    ``RecursionError`` traceback in fetch, apply, fetch --repair and clean (issue 41, the
    twenty-first hostile pass). ``strict``: a folder that cannot be listed (mode 0000, as a
    user who is not root) is its OSError, not skipped: an inventory that skipped one listed
    its files as deleted, and apply called the tree edited, sending the user to move it to
    backup/ (issue 41, the twenty-fourth hostile pass); one gone meanwhile is still skipped."""
    stack = [os.fspath(top)]
    while stack:
        here = stack.pop()
        try:
            with os.scandir(here) as it:
                entries = list(it)
        except FileNotFoundError:
            continue
        except OSError:
            if strict:
                raise
            continue
        dirs: list[str] = []
        files: list[str] = []
        for entry in entries:
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            (dirs if is_dir else files).append(entry.name)
        yield here, dirs, files
        stack.extend(p for p in (os.path.join(here, d) for d in reversed(dirs))
                     if not os.path.islink(p))


def inventory(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root`` (a symlink: ``-> target``, never
    followed), but for a full build's outputs at the top level and Python's __pycache__
    (see _TOP_LEVEL_OUTPUTS)."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in walk(root, strict=True):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not _skipped_dir(here, root, d))
        # os.walk lists a symlinked folder among dirnames and does not enter it
        links = [d for d in dirnames if (here / d).is_symlink()]
        dirnames[:] = [d for d in dirnames if d not in links]
        for name in sorted(filenames + links):
            p = here / name
            out[p.relative_to(root).as_posix()] = _entry(p)
    return out


def legacy_view(inv: dict[str, str]) -> dict[str, str]:
    """``inv`` as the first inventory rules saw a tree (build outputs skipped by name at any
    depth, _version.py, symlinks and special files left out): for comparing with a state
    record those rules made."""
    def kept(rel: str, digest: str) -> bool:
        parts = rel.split("/")
        return not (digest.startswith(("-> ", "! "))
                    or any(d in _LEGACY_DIRS or d.endswith(".egg-info") for d in parts[:-1])
                    or parts[-1].endswith(_LEGACY_SUFFIXES) or parts[-1] == "_version.py")
    return {rel: digest for rel, digest in inv.items() if kept(rel, digest)}


def tree_inventory(tree: Path, state: dict[str, Any]) -> dict[str, str]:
    """The inventory of ``tree`` under the rules its state record was made with."""
    inv = inventory(tree)
    return inv if state.get("inventory_rules") == INVENTORY_RULES else legacy_view(inv)


def differences(recorded: dict[str, str], current: dict[str, str]) -> list[str]:
    """Human-readable list of what differs: ``M path``, ``A path`` (added), ``D path``."""
    def shown(p: str) -> str:
        now = current[p]
        if now.startswith("-> "):
            return f"{p} (a symlink {now})"
        return f"{p} (a FIFO, device or socket)" if now.startswith("! ") else p

    diffs = [f"M {shown(p)}" for p in sorted(recorded.keys() & current.keys())
             if recorded[p] != current[p]]
    diffs += [f"D {p}" for p in sorted(recorded.keys() - current.keys())]
    diffs += [f"A {shown(p)}" for p in sorted(current.keys() - recorded.keys())]
    return diffs


def source_manifest(root: Path, skip: tuple[str, ...] = (),
                    limit: int | None = None) -> dict[str, str]:
    """Relative path -> sha256 of EVERY file under ``root`` (a symlink: ``-> target``), nothing
    skipped but the top-level names in ``skip``: what a source must match in full. ``limit``:
    a file of more bytes (by the descriptor read) is named by its size, never read; a pinned
    source has none (a sparse 15 TB file in a --source folder was hashed for hours: issue 41,
    the twentieth hostile pass)."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in walk(root, strict=True):
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
                out[key] = sha256_or_size(p, limit)
            else:  # a FIFO, device or socket: never opened; it makes the source differ
                out[key] = f"! special file (mode {stat.S_IFMT(mode):o})"
    return out


def sha256_or_size(path: Path, limit: int | None) -> str:
    """``path``'s sha256, or past ``limit`` bytes a line naming its size (it makes the source
    differ)."""
    try:
        return sha256_file(path, limit=limit)
    except OSError as exc:
        if exc.errno != errno.EFBIG:
            raise
        return f"(more than {limit} bytes, not read)"


def manifest_digest(manifest: dict[str, str]) -> str:
    """One sha256 over a manifest (sorted ``path\\0hash\\n`` lines): a whole source's identity."""
    h = hashlib.sha256()
    for path, digest in sorted(manifest.items()):
        # a name that is not UTF-8 as its bytes: a --source folder holding one was a
        # UnicodeEncodeError traceback (issue 41, the twenty-third hostile pass)
        h.update(f"{path}\0{digest}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()
