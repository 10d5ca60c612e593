"""ninja runs in a private folder, never in the build folder of the work directory.

ninja and the compilers it runs write their files in place, by path: ninja appends to
``.ninja_log`` and ``.ninja_deps``, nvcc and g++ write ``<object>.d`` and ``<object>.<pid>.tmp``.
The build folder is in the work directory, which others may write (the threat model), and a
hard link planted there while a build ran, at a name the build had not written yet, had the
build write into the file it names, perhaps outside the work directory (issue 41, the eleventh
hostile pass: ninja appended its log to a file outside through a ``.ninja_log`` linked in after
the build's one check of hard links). So the build folder's ``build.ninja`` and what an earlier
run finished are copied into a private folder (``ownership.private_dir``), ninja runs there, and
what it made is copied back through ``confine`` (a new file renamed into place, never written
through another name) as each edge ends and when the compile ends, however it ends: finished
objects are kept and the next run resumes, as before, even after a SIGKILL of the kit.
Modification times are kept both ways (ninja compares them)."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

from ..errors import BuildError, KvprefetchError
from ..workspace import confine, ownership

# what a build folder holds that ninja reads or made: its manifest, its logs, the outputs
_NINJA_FILES = ("build.ninja", ".ninja_log", ".ninja_deps")
_OUTPUTS = (".o", ".so")


def _wanted(name: str) -> bool:
    return name in _NINJA_FILES or name.endswith(_OUTPUTS)


_Write = Callable[[str, BinaryIO, os.stat_result], None]


def _copy(src_dir: Path, name: str, write: _Write) -> None:
    """Stream the regular file ``src_dir/name`` (never followed) to ``write``, mtime kept."""
    try:
        fd = os.open(src_dir / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return  # a link, or gone: nothing of the build's
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # a folder opens too, and os.fdopen fails on it
        os.close(fd)
        return
    with os.fdopen(fd, "rb") as src:
        write(name, src, st)


def _in_the_way(bdir: Path, name: str) -> str | None:
    """What stands at ``bdir/name`` in words, when it is no regular file (None when it is
    one, or nothing is there)."""
    try:
        mode = os.lstat(bdir / name).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return "a symlink"
    return "a folder" if stat.S_ISDIR(mode) else confine.kind_of(mode)


def _copy_in(bdir: Path, priv: Path) -> None:
    def write(name: str, src: BinaryIO, st: os.stat_result) -> None:
        out = os.open(priv / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                      | os.O_CLOEXEC, 0o600)
        with os.fdopen(out, "wb") as f:
            while chunk := src.read(1 << 20):
                f.write(chunk)
            f.flush()
            os.fchmod(f.fileno(), stat.S_IMODE(st.st_mode))
            os.utime(f.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))

    # a folder, link, FIFO or device at a name ninja writes: the copy back would refuse it
    # only after the whole compile, and a folder there was "build failed: 5: Is a directory"
    # (os.fdopen of its descriptor; issue 41, the twelfth hostile pass)
    for name in sorted(os.listdir(bdir)):
        if _wanted(name) and (what := _in_the_way(bdir, name)) is not None:
            raise BuildError(f"the build folder {bdir} holds {what} at {name}, a name the "
                             "build writes, and the kit writes only regular files there",
                             f"move {bdir / name} away (the kit never makes it), then rerun")
    for name in sorted(os.listdir(bdir)):
        if _wanted(name):
            _copy(bdir, name, write)


def _copy_back(priv: Path, bdir: Path, root: Path) -> None:
    def write(name: str, src: BinaryIO, st: os.stat_result) -> None:
        with suppress(OSError):
            now = os.lstat(bdir / name)
            if stat.S_ISREG(now.st_mode) and now.st_nlink == 1 and now.st_size == st.st_size \
                    and now.st_mtime_ns == st.st_mtime_ns:
                return  # copied in, not rebuilt
        with confine.open_new(bdir / name, root=root, mode=stat.S_IMODE(st.st_mode),
                              exact=True, family=BuildError) as f:
            while chunk := src.read(1 << 20):
                f.write(chunk)
            f.flush()
            os.utime(f.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))

    for name in sorted(os.listdir(priv)):
        if _wanted(name) and name != "build.ninja":
            _copy(priv, name, write)


# how often what ninja finished is copied back while it runs: ninja records an edge in
# .ninja_log and .ninja_deps just after it prints the edge's [n/N], so a copy made at that line
# alone would miss the records, and a rerun after a SIGKILL would build the object again
SYNC_EVERY_S = 1.0


@contextmanager
def private_ninja(argv: list[str], *, root: Path,
                  tree: str) -> Iterator[tuple[list[str], Callable[[], None]]]:
    """``argv`` (``ninja -C <build folder> ...``) with ``-C`` a private copy of the build
    folder, and a function that copies what ninja has finished so far back into the build
    folder (inside ``root``, the work directory), to call as each edge ends (ninja's
    ``[n/N]``). A thread does the same every ``SYNC_EVERY_S`` while the block runs, so that a
    SIGKILL of the kit, which runs no cleanup, still leaves the finished objects and ninja's
    records of them for the rerun to keep. The rest goes back when the block ends, however it
    ends. A command line without ``-C`` is run as it is."""
    if "-C" not in argv[:-1]:
        yield argv, lambda: None
        return
    i = argv.index("-C")
    bdir = Path(argv[i + 1])
    with ownership.private_dir(f"ninja-{tree}", outside=root) as priv:
        _copy_in(bdir, priv)
        lock = threading.Lock()
        stop = threading.Event()

        def sync() -> None:
            with lock:
                _copy_back(priv, bdir, root)

        def loop() -> None:
            while not stop.wait(SYNC_EVERY_S):
                with suppress(KvprefetchError, OSError):  # the last copy below reports it
                    sync()

        t = threading.Thread(target=loop, name="kvprefetch-ninja-sync", daemon=True)
        t.start()
        try:
            yield [*argv[:i + 1], str(priv), *argv[i + 2:]], sync
        except BaseException:
            stop.set()
            t.join()
            # a failed or stopped compile keeps what it finished (the rerun resumes), but
            # a copy that fails now must not hide why the compile ended
            with suppress(KvprefetchError, OSError):
                sync()
            raise
        finally:
            stop.set()
            t.join()
        sync()
