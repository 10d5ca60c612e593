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
- ``remove_path`` is the one way the kit deletes: confined, never through a symlink, never
  across a mount point; its descriptor walk unlinks symlinks inside without following them;
  ``rename_path`` is the one way it moves a path aside inside one folder.

The checks above read the path with ``lstat``; the acts do not trust that reading. Each one
opens the folder it acts in by a walk of ``O_NOFOLLOW | O_DIRECTORY`` opens from ``root`` (or, for
an output the user named, the folder itself with ``O_NOFOLLOW``) and then acts relative to that
descriptor (``dir_fd``): a folder on the way swapped for a symlink between the check and the act
(issue 41, the time-of-check race left open by the second hostile pass) makes the open fail
(``ELOOP``/``ENOTDIR``), and the act lands in the folder that was checked or nowhere.

Past the ~500-line mark on purpose: every confined act (write, read, move, copy, remove) is
here, the one module the writer scan and a reviewer need to read to know where the kit acts.
"""

from __future__ import annotations

import errno
import os
import pwd
import re
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from ..errors import ConfigError, KvprefetchError
from ..hashing import walk
from ..reading import read_limited

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def has_control(text: str) -> bool:
    """Whether ``text`` holds a control character (a newline, a NUL, an escape, ...)."""
    return bool(_CONTROL.search(text))


def without_control(text: str) -> str:
    """``text`` with each control character replaced by ``_``: a name as a path check sees it
    where a control character is allowed (a file a user added to a tree may hold one)."""
    return _CONTROL.sub("_", text)


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
    # a name no file can have: a part over NAME_MAX bytes, or the whole over PATH_MAX (issue
    # 41, ninth pass: an orphan named with 300 letters stopped clean with "File name too
    # long ... check the path and its file system", not at the record)
    raw = rel.encode("utf-8", "surrogateescape")
    if len(raw) >= _PATH_MAX or any(len(part) > _NAME_MAX for part in raw.split(b"/")):
        return (f"is longer than a path can be (a name over {_NAME_MAX} bytes, or over "
                f"{_PATH_MAX} in all)")
    return None


_NAME_MAX, _PATH_MAX = 255, 4096


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


# The work directories (and campaign folders) this process acts in: locations the user named,
# trusted as they are, below which nothing is written through a link. ``open_log`` writes a log
# from the deepest one holding it down (issue 41, the thirteenth hostile pass: a build folder
# swapped for a link to a folder outside, after the build made its logs folder, had the logs
# appended to files made outside).
_ROOTS: set[str] = set()


def trust_root(root: Path) -> None:
    """Record ``root`` as a work directory of this process (``root_of``)."""
    from .. import runner

    _ROOTS.add(os.path.normpath(os.path.abspath(root)))
    runner.LOG_DIR_OPENER = open_log_dir


def trusted_roots() -> list[str]:
    """The work directories recorded by ``trust_root`` in this process."""
    return sorted(_ROOTS)


def root_of(path: Path) -> Path | None:
    """The deepest recorded work directory strictly above ``path``, lexically; None if none."""
    p = os.path.normpath(os.path.abspath(path))
    found = [r for r in _ROOTS if p != r and p.startswith(r.rstrip("/") + "/")]
    return Path(max(found, key=len)) if found else None


def open_log_dir(d: Path) -> int | None:
    """For ``runner.open_log``: a descriptor of the log folder ``d``, made and opened from the
    deepest recorded work directory holding it down (``ensure_dir``, ``open_dir``), or, in no
    work directory (a bench ``--out`` the user names), made and opened a part at a time from
    ``/`` (``open_named_dir``), as the run's documents are. By path (``mkdir -p``, then an
    open by name), a folder of another user's on the way, swapped for their link after
    ``bench ncu --out /tmp/theirs/a/run`` had made ``run``, had ncu's log made and written in
    the folder the link chose (issue 41, the fortieth hostile pass; the thirty-ninth left
    "``open_log`` without a work directory" open, thinking no option reached it)."""
    root = root_of(d)
    if root is None:
        return open_named_dir(d, make=True, what="write the log in")
    ensure_dir(d, root=root)
    return open_dir(d, root=root, what="write the log in")


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
                     # the path itself a link (a result or record file): "by a real
                     # directory" sent the user to make a folder where the kit writes a file
                     # (issue 41, the tenth hostile pass)
                     f"move the symlink {link} away (its target is left as it is), then rerun"
                     if link == Path(os.path.normpath(os.path.abspath(path))) else
                     f"replace the symlink {link} by a real directory (or move it away), "
                     "then rerun")


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _raced(path: Path, what: str, family: type[KvprefetchError]) -> KvprefetchError:
    return family(f"refusing to {what} {path}: a folder on the way became a symlink or stopped "
                  "being a folder while kvprefetch worked (another process is changing the "
                  "work directory)",
                  "stop whatever else writes there, make the folder a real directory again, "
                  "then rerun")


def absent(root: Path, path: Path) -> bool:
    """Whether ``path`` is surely not there: looked up in its folder opened from ``root`` down
    without following a link (``open_dir``). By path, a folder on the way swapped for a link
    just after a check made a kit temporary that was still in place look gone, and its record
    was forgotten (issue 41, the thirtieth hostile pass). False where the folder cannot be
    opened so (a link on the way, or gone): the record stays for the next run to judge."""
    try:
        dfd = open_dir(path.parent, root=root, what="look for", family=ConfigError)
    except (KvprefetchError, OSError):
        return False
    try:
        os.lstat(path.name, dir_fd=dfd)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    finally:
        os.close(dfd)
    return False


def open_dir(d: Path, *, root: Path | None = None, what: str = "write into",
             family: type[KvprefetchError] = ConfigError) -> int:
    """A descriptor of the folder ``d``, opened without following a symlink: from ``root``
    down, one ``O_NOFOLLOW`` open per part (``root`` itself is the location the user named, and
    is trusted), or, without ``root``, ``d`` itself with ``O_NOFOLLOW`` (its ancestors may be
    links, as for an output folder the user names). A symlink met on the way, now or swapped in
    after a check, is refused (``family``); the caller closes the descriptor."""
    try:
        if root is None:
            return open_named_dir(d, what=what, family=family)
        rel = Path(os.path.normpath(os.path.abspath(d))).relative_to(
            os.path.normpath(os.path.abspath(root)))
        # the root's own last part is not followed either: the command line resolved a root
        # the user named through a link (cli.common._real_workdir), so a link there now was
        # swapped in since. A campaign's work/ swapped for a link after prepare's or publish's
        # check had the work directory's tag, ownership record and a published environment
        # written into the folder the link named (issue 41, the nineteenth hostile pass)
        fd = os.open(root, _DIR_FLAGS)
        try:
            for part in rel.parts:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _raced(d, what, family) from None
        raise


def user_name(uid: int) -> str:
    """``name (uid N)`` for a message, or ``uid N`` where the user has no name here."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, OverflowError):
        return f"uid {uid}"


def open_named_dir(d: Path, *, make: bool = False, what: str = "write into",
                   family: type[KvprefetchError] = ConfigError) -> int:
    """A descriptor of the folder ``d`` a user named to write in, outside any work directory
    (``-o``, ``--out``, ``--readme``), opened one part at a time from ``/`` (or the working
    folder) down, relative to the descriptor of the part before, as the kernel resolves it: a
    symlink on the way is followed only where it belongs to this user or root (its owner and
    target read from the link itself, opened ``O_PATH``), another user's is refused
    (``family``), and ``d`` itself is never a link (``ELOOP``). ``make``: folders not there yet
    are made (``mkdir -p``, ``DIR_MODE``). By path, a folder of another user's on the way,
    swapped for their link after the option's check (``cli.common.refuse_foreign_links``), had
    ``report --out /tmp/theirs/a/run`` make ``run`` and write its report in the folder the link
    chose (issue 41, the thirty-ninth hostile pass)."""
    me = os.geteuid()
    text = os.fspath(d)
    where = Path("/" if text.startswith("/") else ".")
    todo = [(part, False) for part in text.split("/") if part not in ("", ".")]
    fd = os.open(where, _DIR_FLAGS)
    hops = 0
    try:
        while todo:
            name, linked = todo.pop(0)
            here = where / name
            try:
                try:
                    nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not make or linked:  # a link to nothing is followed by no mkdir either
                        raise
                    with suppress(FileExistsError):
                        os.mkdir(name, DIR_MODE, dir_fd=fd)
                    nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                # a link is ELOOP, or ENOTDIR with O_DIRECTORY; d itself is never followed
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR) or not todo:
                    raise OSError(exc.errno, exc.strerror, str(here)) from None
                lfd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                try:
                    st = os.fstat(lfd)
                    if not stat.S_ISLNK(st.st_mode):
                        raise OSError(exc.errno, exc.strerror, str(here)) from None
                    if st.st_uid not in (0, me):
                        raise family(
                            f"refusing to {what} {d}: {here} is a symlink that belongs to "
                            f"{user_name(st.st_uid)}, not to you ({user_name(me)}): that user "
                            "chose the folder it leads to, and can change it at any time",
                            "name a path under folders only you or root own: another user's "
                            "folder or link on the way lets them move the write elsewhere") \
                            from None
                    target = os.readlink("", dir_fd=lfd)
                finally:
                    os.close(lfd)
                hops += 1
                if hops > 40:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(d)) from None
                todo = [(part, True) for part in target.split("/")
                        if part not in ("", ".")] + todo
                if not target.startswith("/"):
                    continue
                nxt, here = os.open("/", _DIR_FLAGS), Path("/")
            os.close(fd)
            fd, where = nxt, here
        return fd
    except BaseException:
        os.close(fd)
        raise


def rename_path(root: Path, path: Path, new_name: str, *,
                family: type[KvprefetchError] = ConfigError) -> Path:
    """Rename ``path`` (inside ``root``, no symlink on the way) to ``new_name`` in the same
    folder, relative to a descriptor of that folder (``open_dir``): a folder swapped for a
    symlink after the check never moves anything outside ``root``. ``new_name`` must not
    exist. Returns the new path."""
    check_target(root, path, what="move", family=family)
    if "/" in new_name or new_name in ("", ".", ".."):
        raise ValueError(f"not a file name: {new_name!r}")
    dfd = open_dir(path.parent, root=root, what="move", family=family)
    try:
        try:
            os.stat(new_name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            raise family(f"{path.with_name(new_name)} is in the way of moving {path}",
                         f"move {path.with_name(new_name)} away, then rerun")
        try:
            os.rename(path.name, new_name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError as exc:
            if exc.errno != errno.EXDEV:  # named by the whole paths, not the bare names
                raise OSError(exc.errno, exc.strerror, str(path), None,
                              str(path.with_name(new_name))) from None
            # within one folder no mount is crossed: the file system itself refuses (an
            # overlayfs, as a container image's, renames a folder of its lower layer only with
            # redirect_dir=on). oserrors' "unmount the one in the way" sent the user to a mount
            # that is not there, and every clean failed the same way (issue 41, the
            # twenty-third hostile pass)
            raise family(f"cannot move {path} to {new_name} in the same folder: its file "
                         "system refuses to rename it (Invalid cross-device link: an overlayfs "
                         "whose lower layer holds it, as a container image's, renames such a "
                         "folder only when mounted with redirect_dir=on)",
                         f"remove {path} by hand (`rm -rf -- {path}`), or keep the work "
                         "directory on a file system of its own (a volume, not the image's "
                         "overlay), then rerun") from None
    finally:
        os.close(dfd)
    return path.with_name(new_name)


# The mode every folder the kit makes asks for. The umask (world-write added at start-up) is
# not enough: under a default ACL the kernel ignores the umask and takes the mode's bits as the
# limit, and a parent with `o::rwx` made trees/, pristine/, state/ and .locks/ world-writable
# (issue 41, the twenty-fifth hostile pass).
DIR_MODE = 0o775


def make_dirs(d: Path) -> None:
    """``mkdir -p d`` (by path, as ``Path.mkdir(parents=True, exist_ok=True)``), each folder it
    makes asking for ``DIR_MODE``, the parents too (``Path.mkdir`` makes them 0o777). A ``..``
    is the kernel's, as ``mkdir -p`` reads it, never folded away by name first: ``--out
    L/../new`` with ``L`` a link made ``./new`` in the current folder, a folder nobody named,
    then failed with "a link to nothing" (issue 41, the thirty-third hostile pass)."""
    todo: list[Path] = []
    p = Path(d).absolute()
    while not p.is_dir() and p.parent != p:
        todo.append(p)
        p = p.parent
    for p in reversed(todo):
        with suppress(FileExistsError):
            os.mkdir(p, DIR_MODE)
    if not Path(d).is_dir():
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(d))


def kernel_path(path: Path, *, family: type[KvprefetchError] = ConfigError) -> Path:
    """``path`` as the kernel reads it: every link on the way followed, each ``..`` taken from
    the folder the part before it is; the part past the last existing entry (folders to be
    made, as ``mkdir -p`` makes them) folded by name. A link to nothing, a loop of links, or a
    ``..`` after something that is no folder is refused (``family``): the kernel finds no
    folder there, and ``realpath`` (or ``Path.resolve``) read such a link's target by name, so
    ``bench --out WD/D/../new`` and ``slurm plan D`` with ``D`` a link to nothing made the
    folders of its target (``/x/a``, ``/x/a/b``), which nobody named, and wrote the run or the
    campaign there; a loop ``LOOP/../new`` wrote into ``./new`` (issue 41, the thirty-fifth
    hostile pass)."""
    p = Path(path).absolute()  # the real working folder (getcwd); no ``..`` folded
    cur, rest = Path(p.anchor), p.parts[1:]
    for i, part in enumerate(rest):
        if part == "..":
            if not os.path.isdir(cur):
                raise family(f"{path} names no folder: {cur} is {what_is(cur)}, and a `..` "
                             "after it leads nowhere", "give the path of a folder, then rerun")
            cur = cur.parent
            continue
        nxt = cur / part
        try:
            is_link = stat.S_ISLNK(os.lstat(nxt).st_mode)
        except OSError:  # not there (made later, by name), or not reachable: the act says why
            return Path(os.path.normpath(cur.joinpath(*rest[i:])))
        if not is_link:
            cur = nxt
            continue
        try:
            cur = Path(os.path.realpath(nxt, strict=True))
        except OSError as exc:
            what = ("a loop of symlinks" if exc.errno == errno.ELOOP else
                    f"a link to nothing ({os.readlink(nxt)})")
            raise family(f"{path} names no folder the kernel can reach: {nxt} is {what}",
                         f"give a path without the symlink {nxt} (or make the folder it names), "
                         "then rerun") from None
    return cur


def ensure_dir(d: Path, *, root: Path | None = None,
               family: type[KvprefetchError] = ConfigError) -> None:
    """``mkdir -p d`` without going through a symlink (checked from ``root`` when given, else
    ``d`` itself)."""
    if root is not None:
        check_target(root, d, what="create a folder at", family=family)
        cur = Path(os.path.normpath(os.path.abspath(root)))
        make_dirs(cur)
        # each part made and opened relative to its parent's descriptor (O_NOFOLLOW): a folder
        # on the way swapped for a symlink meanwhile is refused, and no folder is ever made
        # behind one (issue 41, ninth pass: `mkdir` by path made folders outside)
        try:  # the root's last part not followed either (open_dir says why)
            fd = os.open(cur, _DIR_FLAGS)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise _raced(d, "create a folder at", family) from None
            raise
        try:
            for part in Path(os.path.normpath(os.path.abspath(d))).relative_to(cur).parts:
                cur = cur / part
                # an error names the folder whole: made relative to its parent's descriptor,
                # it named the part alone ("scripts: Read-only file system / To fix: . is on a
                # file system mounted read-only", the current folder; the twenty-eighth pass)
                try:
                    with suppress(FileExistsError):
                        os.mkdir(part, DIR_MODE, dir_fd=fd)
                except OSError as exc:
                    raise OSError(exc.errno, exc.strerror, str(cur)) from None
                try:
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise OSError(exc.errno, exc.strerror, str(cur)) from None
                    is_link = stat.S_ISLNK(os.stat(part, dir_fd=fd,
                                                   follow_symlinks=False).st_mode)
                    raise family(f"cannot create the folder {d}: {cur} is "
                                 f"{'a symlink' if is_link else 'not a directory'}",
                                 f"move {cur} away, then rerun") from None
                os.close(fd)
                fd = nxt
        finally:
            os.close(fd)
        return
    if d.is_symlink():
        raise family(f"refusing to write into {d}: it is a symlink",
                     f"replace the symlink {d} by a real directory, then rerun")
    try:
        os.close(open_named_dir(d, make=True, what="create a folder at", family=family))
    except (FileExistsError, NotADirectoryError):
        # a file where a folder of the output belongs: "report failed: FILE: File exists / To
        # fix: check the path and its file system" (issue 41, the twenty-fourth hostile pass)
        blocker = next((p for p in (d, *d.parents) if os.path.lexists(p) and not p.is_dir()), d)
        raise family(f"cannot create the folder {d}: {blocker} is "
                     f"{what_is(blocker) if blocker.exists() else 'a link to nothing'}, not a "
                     "folder", f"give a path whose folders are folders (or move {blocker} "
                     "away), then rerun") from None


def _tmp_name(name: str) -> str:
    """``.<name>.tmp-<hex>-<pid>``, ``name`` cut to keep it within one name's 255 bytes: an
    ``-o`` or report of a legal 250-byte name failed with "use a shorter path: Linux takes at
    most ... 255 in one name", which the user's name was not (issue 41, the twenty-third
    hostile pass)."""
    suffix = f".tmp-{secrets.token_hex(3)}-{os.getpid()}"
    stem = os.fsencode(name)[:255 - 1 - len(suffix)]
    return f".{os.fsdecode(stem)}{suffix}"


@contextmanager
def open_new(path: Path, *, root: Path | None = None, mode: int = 0o644,
             family: type[KvprefetchError] = ConfigError,
             tmp_name: str | None = None, exact: bool = False) -> Iterator[BinaryIO]:
    """A binary file to stream into ``path`` (a download, a large output), written as
    ``write_file`` writes: a new temporary file in the same directory (``O_EXCL |
    O_NOFOLLOW``), renamed over ``path`` only when the block ends without an exception (else
    removed). A symlinked destination or parent is refused (from ``root`` down, when given), and
    so is an existing destination that is not a regular file (a device node, a FIFO).
    ``tmp_name``: the temporary's name (default: ``.<name>.tmp-<hex>-<pid>``), for a caller that
    records it before it exists (``ownership.write_record``); it is never opened if it exists.
    The file's bits are ``mode`` less the umask (``file_mode``); ``exact``: ``mode`` as it is
    (a user's file rewritten keeps its own, ``kept_mode``)."""
    final = safe_bits(mode if exact else file_mode(mode))
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
        raise family(f"refusing to write {path}: it exists and is {kind_of(existing)}, not a "
                     "regular file, and kvprefetch replaces only regular files",
                     f"write to another path, or move {path} away if it is yours, then rerun")
    tmp_name = tmp_name or _tmp_name(path.name)
    # every act relative to the folder's descriptor: a parent swapped for a symlink after the
    # checks above makes the open fail, and nothing is written behind it
    dfd = open_dir(path.parent, root=root, what="write", family=family)
    created = False
    try:
        try:
            fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, final & 0o700, dir_fd=dfd)
        except OSError as exc:  # relative to the folder's descriptor: name the folder too
            raise OSError(exc.errno, exc.strerror, str(path.parent / tmp_name)) from exc
        created = True
        try:
            with os.fdopen(fd, "wb") as f:
                yield f
                os.fchmod(f.fileno(), final)
        except OSError as exc:  # a write to the descriptor (a full disk) names no file
            # only a write's own error (a plain OSError: ENOSPC, EFBIG, EIO...) is the file's:
            # the block's other errors (a download's URLError, a reset connection, a timeout)
            # are raised as they are: renamed after the file, "connection refused" read
            # "[Errno None] None: <wd>/downloads/vllm-0.10.2.tar.gz / check the network", and
            # `ulimit -n 12` was sent to the network too (issue 41, the forty-second hostile
            # pass)
            if exc.filename or type(exc) is not OSError or exc.errno is None:
                raise
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        try:
            os.replace(tmp_name, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError as exc:  # named by the whole paths, as os.replace by path names them
            raise OSError(exc.errno, exc.strerror, str(path.parent / tmp_name), None,
                          str(path)) from exc
        created = False
    finally:
        if created:
            with suppress(FileNotFoundError):
                os.unlink(tmp_name, dir_fd=dfd)
        os.close(dfd)


def current_umask() -> int:
    """The process's umask, read without changing it (``/proc/self/status``; where that has no
    ``Umask:`` line, set and restored at once)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8) & 0o777
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old & 0o777


def file_mode(mode: int) -> int:
    """The bits a file the kit writes gets: ``mode`` less what the umask masks (a user under
    ``umask 077`` expects private files: the kit's records and outputs came out 0644 whatever
    it said; issue 41, the ninth and tenth passes left it open), never world-writable, and
    never less than the owner's own bits of ``mode`` (as ``cli.no_world_writable`` keeps
    them: the kit must still be able to rewrite what it wrote)."""
    return ((mode & ~current_umask()) | (mode & 0o700)) & ~0o002 & 0o7777


def safe_bits(mode: int) -> int:
    """``mode`` without the set-user-ID, set-group-ID and sticky bits, and never
    world-writable: what any file the kit writes or copies may carry. Bits kept from a file
    (``exact``, ``kept_mode``, ``copy_tree``) came from whoever wrote the work directory: an
    apply's stage planted with a program of mode 6777 had its rollback write it as a
    set-user-ID program of the user running the kit, writable by everyone (issue 41, the
    twenty-third hostile pass)."""
    return mode & 0o775


def kept_mode(path: Path, default: int = 0o644) -> int:
    """The permission bits of the regular file at ``path`` (never followed), else ``default``
    less the umask (``file_mode``): a file the user names that the kit replaces (``report
    --readme`` rewrites it in place, ``--index --out``, ``export-header -o``) keeps them (issue
    41, the fifth hostile pass: a README of mode 600 came back 644, readable by every user of
    the machine). Pass it with ``exact=True``: the bits are the file's own, not the kit's."""
    try:
        st = os.lstat(path)
    except OSError:
        return file_mode(default)
    return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else file_mode(default)


def kind_of(mode: int) -> str:
    """What a non-regular, non-directory file is, in words (for a message that would
    otherwise call a FIFO or a device "a file")."""
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


def what_is(path: Path) -> str:
    """What the thing at ``path`` is, in words, following links as an open would: "a file",
    "a folder", or ``kind_of``'s words."""
    mode = os.stat(path).st_mode
    if stat.S_ISREG(mode):
        return "a file"
    return "a folder" if stat.S_ISDIR(mode) else kind_of(mode)


def write_file(path: Path, data: bytes | str, *, root: Path | None = None, mode: int = 0o644,
               family: type[KvprefetchError] = ConfigError, tmp_name: str | None = None,
               exact: bool = False) -> None:
    """Write ``data`` to ``path`` atomically: a new temporary file in the same directory
    (``O_EXCL | O_NOFOLLOW``), then ``os.replace``. A symlinked destination or parent is refused
    (from ``root`` down, when given)."""
    payload = _encoded(path, data, family)
    with open_new(path, root=root, mode=mode, family=family, tmp_name=tmp_name,
                  exact=exact) as f:
        f.write(payload)


def _encoded(path: Path, data: bytes | str, family: type[KvprefetchError]) -> bytes:
    """``data`` as the bytes to write to ``path``: UTF-8, and a byte of a name that is not UTF-8
    (read with Python's ``surrogateescape``) as that byte, so a file names a path as it is on
    disk (a work directory so named was a ``UnicodeEncodeError`` traceback in ``build``, whose
    log, narrowed sources and build.ninja name their paths; issue 41, the twenty-third hostile
    pass, tester c). Any other lone surrogate (a ``\\ud800`` escape in a JSON record the text is
    made of) has no bytes at all: it was a traceback in ``report --index`` and ``--readme``
    (tester b), and is now ``family``'s error naming the character, nothing written."""
    if not isinstance(data, str):
        return data
    try:
        return data.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        line = data.count("\n", 0, exc.start) + 1
        raise family(f"cannot write {path}: its text holds {data[exc.start]!r} (line {line}), "
                     "a lone surrogate, which no encoding can write: it came from a \\u "
                     "escape in a JSON record this text is made of",
                     "correct that record (its text as UTF-8), and run the command again; "
                     "nothing was written") from None


def write_if_changed(path: Path, data: bytes | str, *, root: Path | None = None,
                     mode: int = 0o644, family: type[KvprefetchError] = ConfigError) -> bool:
    """``write_file``, only when ``path`` does not already hold ``data`` (a plain file's bytes
    are compared; a FIFO or a link is never read). True when it wrote."""
    payload = _encoded(path, data, family)
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
    if not os.path.lexists(path.parent):
        return
    dfd = open_dir(path.parent, root=root, what="remove", family=family)
    try:
        try:
            mode = os.stat(path.name, dir_fd=dfd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISDIR(mode):
            refuse_mounts(dfd, path, family)  # before anything goes, when one is there
            _remove_tree(dfd, path, family)
        else:
            _unlink(dfd, path.name, path, path, family)
    finally:
        os.close(dfd)


def _remove_tree(dfd: int, path: Path, family: type[KvprefetchError]) -> None:
    """Remove the folder ``path`` (the entry ``path.name`` of the open folder ``dfd``) by
    descriptors, each folder opened ``O_NOFOLLOW`` from its parent's descriptor (a link inside
    is unlinked, never followed; a folder swapped for a link is refused by the open), and each
    checked to be on its parent's mount *after* it is open: ``refuse_mounts``' walk before it
    cannot see a mount made while the removal runs, and ``shutil.rmtree`` walked into a folder
    bind-mounted below after that check and deleted what it showed, outside the work directory
    (issue 41, the twenty-first hostile pass). A mount made on a folder already open does not
    cover what is reached from its descriptor. Iterative: a deep tree is no RecursionError."""
    key = _mount_key(dfd)
    stack: list[tuple[int, str, int, Path, Iterator[str]]] = []
    try:
        _enter(stack, dfd, path.name, path, key, path, family)
        while stack:
            parent, name, fd, where, subs = stack[-1]
            sub = next(subs, None)
            if sub is not None:
                _enter(stack, fd, sub, where / sub, key, path, family)
                continue
            stack.pop()
            os.close(fd)
            try:
                os.rmdir(name, dir_fd=parent)
            except OSError as exc:  # relative to the folder's descriptor: name the whole path
                raise OSError(exc.errno, exc.strerror, str(where)) from None
    finally:
        for _parent, _name, fd, _where, _subs in stack:
            os.close(fd)


def _enter(stack: list[tuple[int, str, int, Path, Iterator[str]]], parent: int, name: str,
           where: Path, key: tuple[int, int | None], path: Path,
           family: type[KvprefetchError]) -> None:
    """Open the folder ``name`` of ``parent`` for ``_remove_tree``, refuse it when it is on
    another mount than the removal's start, unlink all in it that is no folder, and push it
    with its sub-folders still to go."""
    fd = _open_folder(parent, name, where)
    if _mount_key(fd) != key:
        os.close(fd)
        raise family(f"refusing to remove {path}: {where} is a mount point (mounted while "
                     "kvprefetch removed the folder), and what is mounted there is not the "
                     "work directory's, so kvprefetch never deletes across one",
                     f"unmount {where} (`umount {where}`), then rerun")
    subs: list[str] = []
    try:
        for entry in _entries(fd, where):
            if entry.is_dir(follow_symlinks=False):
                subs.append(entry.name)
            else:  # a file, link, FIFO or socket: unlinked, never opened or followed
                _unlink(fd, entry.name, where / entry.name, path, family)
    except BaseException:
        os.close(fd)
        raise
    stack.append((parent, name, fd, where, iter(subs)))


def _unlink(dfd: int, name: str, where: Path, path: Path,
            family: type[KvprefetchError]) -> None:
    """Unlink the entry ``name`` (at ``where``) of the open folder ``dfd`` while removing
    ``path``. A file of elsewhere bind-mounted there cannot be unlinked (``EBUSY``) and is
    left, as is the file it shows; the mount checks see folders only, so clean ended with
    "target: Device or resource busy / To fix: check the path and its file system", naming
    neither where the file is nor the mount (issue 41, the twenty-second hostile pass)."""
    try:
        os.unlink(name, dir_fd=dfd)
    except OSError as exc:
        if exc.errno != errno.EBUSY:  # named by its whole path, not the bare name
            raise OSError(exc.errno, exc.strerror, str(where)) from None
        raise family(f"cannot remove {path}: {where} is a mount point (a file of elsewhere "
                     "mounted there), and what is mounted there is not the work directory's, "
                     "so kvprefetch never deletes across one; what went before it is gone",
                     f"unmount {where} (`umount {where}`), then rerun") from None


def _mount_id(fd: int) -> int | None:
    """The id of the mount the open folder ``fd`` is on (``/proc/self/fdinfo``'s ``mnt_id``),
    None where /proc does not say. A bind mount of a folder of the same file system has the
    same device number as the folder it is mounted in, so ``st_dev`` alone cannot tell it."""
    try:
        with open(f"/proc/self/fdinfo/{fd}", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("mnt_id:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _mount_key(fd: int) -> tuple[int, int | None]:
    return os.fstat(fd).st_dev, _mount_id(fd)


def refuse_mounts(dfd: int, path: Path, family: type[KvprefetchError] = ConfigError) -> None:
    """Refuse to remove the folder ``path`` (the entry ``path.name`` of the open folder
    ``dfd``) when it, or a folder below it, is a mount point: what is mounted there (another
    disk, a bind mount of a folder elsewhere, a container's volume) is outside the work
    directory, whatever its path says, and ``shutil.rmtree`` walks into it and deletes it all
    before the mount point's own ``rmdir`` fails (issue 41, the twentieth hostile pass: a
    folder bind-mounted into a kit-made build folder was emptied by ``clean --what builds``,
    which then said "Device or resource busy / check the path and its file system"). Folders
    are opened ``O_NOFOLLOW`` from ``dfd`` down: no link is followed. Without recursion
    (``os.fwalk`` calls itself per level: a folder 3,000 levels deep in a build folder was a
    ``RecursionError`` traceback in clean; issue 41, the twenty-first hostile pass)."""
    parent = _mount_key(dfd)
    for fd, where in _folders(dfd, path):
        if _mount_key(fd) != parent:
            raise family(f"refusing to remove {path}: {where} is a mount point (another file "
                         "system, or a bind mount of a folder elsewhere), and what is mounted "
                         "there is not the work directory's, so kvprefetch never deletes "
                         "across one",
                         f"unmount {where} (`umount {where}`), then rerun")


def _open_folder(parent: int, name: str, where: Path) -> int:
    """The folder ``name`` of the open folder ``parent`` (at ``where``), opened ``O_NOFOLLOW``;
    an OSError names ``where``, not ``name``: a folder of mode 0000 in a tree made clean say
    "benchmarks: Permission denied / To fix: make . writable" (issue 41, the twenty-fourth
    hostile pass, as a user who is not root), naming neither the folder nor what to change."""
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                       dir_fd=parent)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(where)) from None


def _entries(fd: int, where: Path) -> list[os.DirEntry[str]]:
    """The entries of the open folder ``fd`` (at ``where``); an OSError names ``where``."""
    try:
        with os.scandir(fd) as entries:
            return list(entries)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(where)) from None


def _folders(dfd: int, path: Path) -> Iterator[tuple[int, Path]]:
    """Each folder from ``path`` (the entry ``path.name`` of ``dfd``) down, open (``O_NOFOLLOW``
    from its parent's descriptor), with its path; depth first, one descriptor per level."""
    stack: list[tuple[int, Path, Iterator[str]]] = []
    parent, name, where = dfd, path.name, path
    try:
        while True:
            fd = _open_folder(parent, name, where)
            stack.append((fd, where, iter(())))
            subs = [e.name for e in _entries(fd, where) if e.is_dir(follow_symlinks=False)]
            stack[-1] = (fd, where, iter(subs))
            yield fd, where
            sub = None
            while stack and (sub := next(stack[-1][2], None)) is None:
                os.close(stack.pop()[0])
            if not stack or sub is None:
                return
            parent, name, where = stack[-1][0], sub, stack[-1][1] / sub
    finally:
        for fd_, _where, _subs in stack:
            os.close(fd_)


def refuse_mounts_at(root: Path, path: Path,
                     family: type[KvprefetchError] = ConfigError) -> None:
    """``refuse_mounts`` for the folder ``path`` below ``root``, its parent opened confined."""
    dfd = open_dir(path.parent, root=root, what="remove")
    try:
        refuse_mounts(dfd, path, family)
    finally:
        os.close(dfd)


def is_plain_file(path: Path) -> bool:
    """A regular file that is not a symlink (never a FIFO, device or socket)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def first_hard_link(top: Path) -> tuple[Path, int] | None:
    """The first regular file at or under ``top`` (symlinks never followed) that has more than
    one hard link, with its link count; None when there is none. A hard link is the same file
    under another name, perhaps outside the work directory: a program that writes a file in
    place (a compiler's object, ninja's log, an appended log) writes that file too (issue 41,
    the ninth hostile pass)."""
    try:
        st = os.lstat(top)
    except FileNotFoundError:
        return None
    if stat.S_ISREG(st.st_mode):
        return (top, st.st_nlink) if st.st_nlink > 1 else None
    if not stat.S_ISDIR(st.st_mode):
        return None
    for dirpath, dirnames, filenames in walk(top):  # follows no link
        for name in sorted(filenames) + sorted(dirnames):
            p = Path(dirpath) / name
            try:
                s = os.lstat(p)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(s.st_mode) and s.st_nlink > 1:
                return p, s.st_nlink
    return None


def _open_regular(root: Path, path: Path, what: str,
                  family: type[KvprefetchError]) -> tuple[BinaryIO, os.stat_result]:
    """The regular file ``path`` inside ``root``, open for reading (and its ``fstat``), opened
    relative to its folder's descriptor (``open_dir``) with ``O_NOFOLLOW``: a folder on the
    way, or the file, swapped for a symlink is refused; a FIFO or device is never read
    (``O_NONBLOCK`` + ``fstat``)."""
    check_target(root, path, what=what, family=family)
    dfd = open_dir(path.parent, root=root, what=what, family=family)
    try:
        fd = _open_in(dfd, path.name, path, what, family)
    finally:
        os.close(dfd)
    f = os.fdopen(fd, "rb")
    st = os.fstat(f.fileno())
    if not stat.S_ISREG(st.st_mode):
        f.close()
        raise family(f"refusing to {what} {path}: it is not a regular file",
                     f"move {path} away, then rerun")
    return f, st


def read_file(root: Path, path: Path, *, limit: int = 64 << 20,
              family: type[KvprefetchError] = ConfigError) -> bytes:
    """The bytes of the regular file ``path`` inside ``root`` (``_open_regular``: nothing from
    outside ``root`` is read and installed), at most ``limit`` bytes."""
    f, _ = _open_regular(root, path, "read", family)
    with f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise family(f"refusing to read {path}: it is larger than {limit} bytes",
                     f"move {path} away, then rerun")
    return data


def sha256_in(root: Path, path: Path, *, limit: int,
              family: type[KvprefetchError] = ConfigError) -> str:
    """sha256 of the regular file ``path`` inside ``root``, opened as ``read_file`` opens one,
    of at most ``limit`` bytes by its descriptor. ``slurm publish`` hashed its copy by path: a
    copy in the campaign swapped by whoever can write there for a folder of theirs had the hash
    follow a link in it to any file of the system (its digest printed), or read a sparse file
    of 200 GB for as long as that took (issue 41, the thirty-eighth hostile pass)."""
    from ..hashing import sha256_of_size

    f, st = _open_regular(root, path, "hash", family)
    with f:
        if st.st_size > limit:
            raise family(f"refusing to hash {path}: it is larger than {limit} bytes",
                         f"move {path} away, then rerun")
        return sha256_of_size(f, st.st_size, path)


def move_file(root: Path, src: Path, dst: Path, *,
              family: type[KvprefetchError] = ConfigError) -> None:
    """``os.replace(src, dst)`` for two paths inside ``root``, relative to descriptors of their
    folders (``open_dir``): a folder on the way swapped for a symlink after the checks moves
    nothing into or out of ``root``."""
    check_target(root, src, what="move", family=family)
    check_target(root, dst, what="replace", family=family)
    sfd = open_dir(src.parent, root=root, what="move", family=family)
    try:
        dfd = open_dir(dst.parent, root=root, what="replace", family=family)
        try:
            os.replace(src.name, dst.name, src_dir_fd=sfd, dst_dir_fd=dfd)
        except OSError as exc:  # named by the whole paths, as os.replace by path names them
            raise OSError(exc.errno, exc.strerror, str(src), None, str(dst)) from None
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


def copy_tree(root: Path, src: Path, dst: Path, *, skip: frozenset[str] = frozenset(),
              skip_globs: tuple[str, ...] = (), skip_special: bool = False,
              family: type[KvprefetchError] = ConfigError) -> None:
    """``shutil.copytree(src, dst, symlinks=True)`` for a new ``dst`` inside ``root``, where
    every folder is made and every file and symlink created relative to a folder opened
    ``O_NOFOLLOW`` from ``root`` down (``open_dir``; files ``O_EXCL | O_NOFOLLOW``): a folder of
    the copy swapped for a symlink while it runs makes it stop, and nothing is written behind
    the link (issue 41, the ninth hostile pass: copytree into ``trees/.<tree>.tmp-<pid>``
    swapped for a link wrote the tree's files into the folder it named). ``src`` is read the
    same way: each of its folders opened ``O_NOFOLLOW`` from ``root`` down (from ``src`` itself
    when it is outside ``root``: a ``--source`` the user named), each file relative to its
    folder's descriptor (issue 41, the tenth hostile pass: a folder of ``pristine/sdist``
    swapped for a link after it was listed had the files behind the link copied into the tree,
    and recorded as pristine). Names in ``skip``, and names matching a pattern of
    ``skip_globs`` (``fnmatch``), are left out at any depth; a FIFO, device or socket in
    ``src`` is refused (left out with ``skip_special``). Mode and mtime of each file are kept,
    as copytree keeps them."""
    check_target(root, dst, what="copy into", family=family)
    if os.path.lexists(dst):
        raise family(f"{dst} is in the way of a copy", f"move {dst} away, then rerun")
    src_root = root if inside(root, src) else src
    if src_root == root:
        # a link there from the start is named as one: open_dir's "became a symlink ...
        # another process is changing the work directory" named a cause that was not there
        # (`fetch --repair` with pristine/ a link; issue 41, the thirty-eighth hostile pass)
        check_target(root, src, what="copy from", family=family)
    ensure_dir(dst, root=root, family=family)
    pending = [Path()]
    while pending:
        rel = pending.pop()
        sfd = open_dir(src / rel, root=src_root, what="copy from", family=family)
        try:
            dfd = open_dir(dst / rel, root=root, what="copy into", family=family)
            try:
                for name in sorted(os.listdir(sfd)):
                    if name in skip or any(fnmatchcase(name, g) for g in skip_globs):
                        continue
                    s = src / rel / name
                    st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
                    if not (stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode)
                            or stat.S_ISREG(st.st_mode)):
                        if skip_special:
                            continue
                        raise family(f"cannot copy {s}: it is {kind_of(st.st_mode)}",
                                     f"move {s} away, then rerun")
                    try:
                        if stat.S_ISLNK(st.st_mode):
                            os.symlink(os.readlink(name, dir_fd=sfd), name, dir_fd=dfd)
                        elif stat.S_ISDIR(st.st_mode):
                            # safe_bits: a planted folder of mode 1777 came over sticky (and
                            # world-writable where a default ACL set the umask aside)
                            os.mkdir(name, safe_bits(stat.S_IMODE(st.st_mode)) | 0o700,
                                     dir_fd=dfd)
                            pending.append(rel / name)
                        else:
                            _copy_file(s, sfd, name, dfd, family)
                    except OSError as exc:
                        # made by its bare name in the copy's folder, or written by descriptor:
                        # named by the copy's whole path. Out of inodes, a fetch said "config in
                        # <workdir>/: No space left on device", a folder of the sdist that is
                        # in no work directory (issue 41, the thirty-sixth hostile pass)
                        if exc.filename not in (None, name):
                            raise
                        raise OSError(exc.errno, exc.strerror, str(dst / rel / name)) from exc
            finally:
                os.close(dfd)
        finally:
            os.close(sfd)


def _open_in(dfd: int, name: str, path: Path, act: str,
             family: type[KvprefetchError]) -> int:
    """A descriptor of the file ``name`` of the folder ``dfd`` (``path`` in messages), opened
    for reading with ``O_NOFOLLOW`` (the file swapped for a link is ``_raced``) and
    ``O_NONBLOCK`` (a FIFO never blocks; the caller checks the kind with ``fstat``)."""
    try:
        return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                       dir_fd=dfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _raced(path, act, family) from None
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


def _copy_file(src: Path, sfd_dir: int, name: str, dfd: int,
               family: type[KvprefetchError]) -> None:
    """Copy the regular file ``name`` of the folder ``sfd_dir`` (``src`` in messages) to a new
    ``name`` in the folder ``dfd``; one swapped for a link, a FIFO or a device is refused."""
    sfd = _open_in(sfd_dir, name, src, "copy", family)
    try:
        st = os.fstat(sfd)
        if not stat.S_ISREG(st.st_mode):
            raise family(f"cannot copy {src}: it is {kind_of(st.st_mode)}",
                         f"move {src} away, then rerun")
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dfd)
        try:
            while True:
                chunk = os.read(sfd, 1 << 20)
                if not chunk:
                    break
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
            os.fchmod(fd, safe_bits(stat.S_IMODE(st.st_mode)))
            os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(fd)
    finally:
        os.close(sfd)
