"""Whether a path is at or below a folder (``within``): by path, by device and inode, and by the
mount table (``/proc/self/mountinfo``): a bind mount shows a folder of a file system at another
path, and neither that path nor the device and inode of the folders above it say which folder
it shows."""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from . import confine


def within_by_mount_table(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or below it in the file system both are on, by the mount
    table. A bind mount of a *sub-folder* of the work directory elsewhere (a container's
    ``-v <workdir>/tmp:/tmp``) has neither the work directory's path nor, for itself or any
    folder above it, its device and inode: a ``TMPDIR`` there passed ``within``, apply's
    private folder for ``git apply`` was made inside the work directory, and a watcher that
    swapped it for a link had git patch a vLLM checkout outside (issue 41, the twenty-second
    hostile pass). The table names, for each mount, the folder of its file system it shows."""
    here, there = _place_in_file_system(path), _place_in_file_system(folder)
    if here is None or there is None or here[0] != there[0]:
        return False
    return here[1] == there[1] or there[1] in here[1].parents


def _place_in_file_system(path: Path) -> tuple[str, PurePosixPath] | None:
    """(the device ``major:minor``, the path inside that file system) of ``path`` (resolved
    already; a name not made yet, an ``export-header -o``, by its nearest folder that is), from
    ``/proc/self/mountinfo``'s line for the mount it is on; None where /proc does not say."""
    for there in (path, *path.parents):
        try:
            fd = os.open(there, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
        place = _place_of_open(fd, there)
        return None if place is None else (place[0], place[1] / path.relative_to(there))
    return None


def _place_of_open(fd: int, path: Path) -> tuple[str, PurePosixPath] | None:
    """``_place_in_file_system`` of the open ``path`` (``fd``, closed here)."""
    try:
        mount = confine._mount_id(fd)
    finally:
        os.close(fd)
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read(1 << 24).splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(" ")
        if mount is None or len(fields) < 5 or fields[0] != str(mount):
            continue
        root, point = (PurePosixPath(_unescape(x)) for x in fields[3:5])
        try:
            return fields[2], root / PurePosixPath(path).relative_to(point)
        except ValueError:  # the path is not where the table says the mount is
            return None
    return None


def _unescape(field: str) -> str:
    """A mountinfo path: the kernel writes space, tab, newline and backslash as \\ooo."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def within(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or below it: by path, or by device and inode for ``path``
    and every folder above it. A bind mount of the work directory elsewhere (a container's view
    of it, a second mount point) resolves to another path, so a TMPDIR inside it passed the
    check by path (apply's git folder and doctor's probe were made in the work directory), and
    so did an ``export-header -o`` through it (the ownership record overwritten; issue 41, the
    nineteenth hostile pass). Both paths are resolved already."""
    if path == folder or folder in path.parents:
        return True
    try:
        st = os.stat(folder)
    except OSError:
        return False  # no such folder yet: nothing of it can hold ``path``
    for above in (path, *path.parents):
        try:
            other = os.stat(above)
        except OSError:
            continue
        if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
            return True
    return within_by_mount_table(path, folder)
