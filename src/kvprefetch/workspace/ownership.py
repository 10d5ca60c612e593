"""What kvprefetch created inside a work directory, and removing only that.

``<workdir>/.kvprefetch-owned.json`` maps each path the kit made (relative to the work
directory) to what it is: ``tree`` (with the sha256 of its file inventory when the kit last
wrote it, so an edited tree is told apart), ``pristine``, ``state``, ``backup``, ``build``, or
``tmp`` (a temporary directory of a running step, with its pid: once that process is gone it is
an orphan the next run removes). Nothing else is ever deleted: a folder the user put under
``build/`` or ``trees/`` is not in the record. Removal never follows a symlink: a path is
removed only when neither it nor any directory between the work directory and it is a symlink."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from .. import runner
from ..errors import ConfigError, KvprefetchError
from ..reading import load_json, read_limited
from . import confine, foreign, mounts
from .locks import locked
from .workdir import Workdir, json_text, write_json_atomic

OWNED_FILE = ".kvprefetch-owned.json"
_FIX = ("move it away; `kvprefetch fetch --repair` records the trees again "
        "(until then clean removes nothing)")
_NAME = r"[A-Za-z_][A-Za-z0-9_]{0,63}"
# Where each kind of entry can be: a record naming anything else is corrupt.
_WHERE = {
    "tree": re.compile(rf"trees/{_NAME}"),
    "state": re.compile(rf"state/{_NAME}\.json"),
    "build": re.compile(rf"build/{_NAME}"),
    "pristine": re.compile(r"pristine/[A-Za-z0-9_][A-Za-z0-9_.-]*"),
    "backup": re.compile(r"backup/[A-Za-z0-9_][A-Za-z0-9_.-]*"),
    "download": re.compile(r"downloads/[A-Za-z0-9_][A-Za-z0-9_.+-]*"),
    "toolkit": re.compile(r"toolkits/[A-Za-z0-9_][A-Za-z0-9_.-]*"),
    "env": re.compile(rf"envs/{_NAME}(?:-vllm)?"),  # a tree's environment (Workdir.env_dir)
    "tmp": re.compile(r".+"),  # checked below, against its pid
    "stage": re.compile(rf"trees/\.{_NAME}\.apply"),  # an apply's stage (treetxn)
}


def _entry_problem(rel: str, entry: dict[str, Any]) -> str | None:
    """Why an entry of the record is not one the kit could have written (None: it could)."""
    kind = entry.get("kind")
    if not isinstance(kind, str):
        return "has no kind"
    where = _WHERE.get(kind)
    if where is None:
        # any entry names a path the kit owns (fetch replaces a pristine copy any entry names;
        # a build folder with one is not recorded again): a kind the kit never writes, from a
        # forged or foreign record, was read as "the kit's" without a check of where it points
        # (issue 41, the ninth and tenth passes left it open)
        return (f"has the kind {kind[:40]!r}, which kvprefetch never writes (it writes "
                f"{', '.join(sorted(_WHERE))})")
    if not where.fullmatch(rel):
        return f"is not where kvprefetch puts a {kind}"
    if kind == "tmp":
        pid = entry.get("pid")
        name = rel.rsplit("/", 1)[-1]
        # the kit's temporaries carry their pid in their name: .<x>.tmp-PID, <x>.tmp-PID,
        # tmp/<step>-PID-<hex>; an entry that does not is not one of them
        if not valid_pid(pid) or not (
                name.endswith(f".tmp-{pid}")
                or (rel.startswith(f"{SCRATCH}/") and f"-{pid}-" in name)):
            return "is not a temporary path of a kvprefetch process (its pid must be in its name)"
        # and only where the kit makes one, in the kit's own folders: a scratch folder
        # tmp/<step>-<pid>-<hex>, or beside a tree, record, build, copy, download, environment
        # or toolkit (issue 41, the tenth hostile pass: an entry may name any path whose name
        # ends in .tmp-<pid>, or tmp/<anything>-<pid>-<anything>, and clean removed a user's
        # mine/results.tmp-99999 or tmp/run-4242-results with all it held)
        top, _, rest = rel.partition("/")
        if not (re.fullmatch(rf"[a-z][a-z-]*-{pid}-[0-9a-f]+", rest) if top == SCRATCH
                else top in _TMP_PARENTS and "/" not in rest and name.endswith(f".tmp-{pid}")):
            return ("is not where kvprefetch makes a temporary (tmp/<step>-<pid>-<hex>, or "
                    f"<folder>/<name>.tmp-<pid> in {', '.join(_TMP_PARENTS)})")
    return None


# The folders the kit makes temporaries in, one level down (fetch, apply's state records,
# clean's renames before removal, environments, unpacked deps, the CUDA 12 toolkit); the
# scratch is SCRATCH.
_TMP_PARENTS = ("trees", "state", "build", "pristine", "backup", "downloads", "envs", "deps",
                "toolkits")

# The largest pid_t (a C int): no process has a larger pid (Linux's own limit is 2^22), and
# os.kill refuses a number past a C long (issue 41, third pass: a record's pid of 10^23 was an
# OverflowError traceback)
PID_MAX = (1 << 31) - 1


def valid_pid(pid: object) -> bool:
    """Whether ``pid`` (read from a record or a file name) is a number a process can have."""
    return isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid <= PID_MAX


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
        if not confine.is_plain_file(p):
            raise ValueError("not a regular file")
        data = load_json(p)
        if not isinstance(data, dict) or not isinstance(data.get("paths"), dict) or not all(
                isinstance(v, dict) for v in data["paths"].values()):
            raise ValueError("not kvprefetch's ownership record")
    except ValueError as exc:  # UnicodeDecodeError is one
        raise ConfigError(f"the ownership record {p} is corrupt ({exc})", _FIX) from None
    out: dict[str, dict[str, Any]] = data["paths"]
    for rel_path, entry in out.items():
        confine.record_path(root, rel_path, record=p, fix=_FIX)
        problem = _entry_problem(rel_path, entry)
        if problem is not None:
            raise ConfigError(f"the ownership record {p} is corrupt: its entry {rel_path!r} "
                              f"{problem}; kvprefetch acts on no path from it", _FIX)
    return out


RECORD_WAIT_S = 10.0  # how long an edit of the ownership record waits for another's


@contextmanager
def _editing(root: Path) -> Iterator[dict[str, dict[str, Any]]]:
    # held for one read and one write: a holder still there after RECORD_WAIT_S is stuck
    # (stopped, or not the kit), named by the lock error rather than waited on for ever
    with locked(root / ".kvprefetch-owned.lock", "the ownership record", wait=RECORD_WAIT_S):
        paths = entries(root)
        yield paths
        write_json_atomic(_path(root), {"paths": paths}, root=root)


def rel(root: Path, path: Path) -> str:
    if not confine.inside(root, path):
        raise ConfigError(f"{path} is outside the work directory {root}",
                          "kvprefetch records and removes only paths inside its work directory")
    return Path(os.path.normpath(os.path.abspath(path))).relative_to(
        os.path.normpath(os.path.abspath(root))).as_posix()


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
    return confine.first_symlink(root, path)


def remove(root: Path, path: Path) -> None:
    """Remove ``path`` (a kit-made file or directory) inside ``root`` without following any
    symlink (confine.remove_path), and forget it.

    A directory is removed crash-safely (issue 41, class 6: a `clean` killed half-way left a
    half-deleted tree that `fetch` then refused without `--force`): it is first renamed to
    ``.<name>.removing.tmp-<pid>`` beside it, recorded as this run's temporary before the
    rename, and only then deleted. A run killed at any point leaves either the whole directory where
    it was, or an orphan temporary that the next fetch or clean removes."""
    try:
        is_dir = stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        is_dir = False
    if is_dir:
        confine.check_target(root, path, what="remove")
        confine.refuse_mounts_at(root, path)  # before the rename, not after its move
        # not fetch's ".<name>.tmp-<pid>", which may exist while fetch replaces a pristine copy
        doomed = path.with_name(f".{path.name}.removing.tmp-{os.getpid()}")
        if os.path.lexists(doomed):
            raise ConfigError(f"{doomed} is in the way of removing {path}",
                              f"move {doomed} away, then rerun")
        record(root, doomed, "tmp", **this_run())  # before the rename: never unrecorded
        # relative to the checked folder's descriptor: a folder on the way swapped for a
        # symlink since the check moves nothing outside the work directory (confine.open_dir)
        confine.rename_path(root, path, doomed.name)
        forget(root, path)
        path = doomed
    confine.remove_path(root, path)
    forget(root, path)


def pid_alive(pid: int) -> bool:
    if not valid_pid(pid):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def temporary(root: Path, path: Path, *,
              family: type[KvprefetchError] = ConfigError) -> Iterator[Path]:
    """A temporary path the kit creates, recorded (with this pid) before it exists, so a killed
    run leaves an orphan the next run can recognise as the kit's own and remove. On success the
    caller renames it away; on failure it is removed here, or left recorded behind a link (pass 29).
    ``family``: the caller's error, as the ``confine`` acts that follow take it: a folder
    swapped for a link ended a fetch with exit 2 here and exit 3 a moment later, in the copy
    (issue 41, the fifteenth hostile pass)."""
    confine.check_target(root, path, what="create the temporary", family=family)
    if os.path.lexists(path):
        raise family(f"{path} is in the way of a temporary kvprefetch creates",
                          f"move {path} away (kvprefetch does not remove what it did not make), "
                          "then rerun")
    record(root, path, "tmp", **this_run())
    try:
        yield path
    finally:
        if (blocked := symlink_on_the_way(root, path)) is None and os.path.lexists(path):
            with suppress(OSError):
                confine.remove_path(root, path)
        if blocked is None and confine.absent(root, path):  # by its folder, never a link's
            forget(root, path)


SCRATCH = "tmp"


@contextmanager
def scratch_dir(root: Path, prefix: str, *, read_only: bool = False) -> Iterator[Path]:
    """A new empty directory ``<workdir>/tmp/<prefix>-<pid>-<random>`` for one step's scratch
    files, removed on exit. It is recorded as the kit's temporary before it exists, so one that
    a killed run leaves behind is an orphan that the next fetch or clean removes: the kit writes
    nothing outside its work directory (tempfile's default, /tmp, kept every killed run's).

    ``read_only``: the command must not write the work directory at all (a dry run,
    ``diff-upstream``, ``doctor``; issue 41, class 6), so the scratch is a system temp folder
    instead, neither recorded nor inside the work directory (a killed run may leave it there,
    as tempfile does)."""
    if read_only:
        with private_dir(prefix) as tmp:
            yield tmp
        return
    base = root / SCRATCH
    link = symlink_on_the_way(root, base) if base.exists() or base.is_symlink() else None
    if link is not None:
        raise ConfigError(f"{link} is a symlink; kvprefetch keeps its scratch files in {base}",
                          f"move {link} away")
    path = base / f"{prefix}-{os.getpid()}-{secrets.token_hex(4)}"
    # only a tmp/ this step made goes again: a user's own (empty) tmp/ is theirs (issue 41, the
    # tenth hostile pass: apply removed it)
    made = not os.path.lexists(base)
    try:
        with temporary(root, path):
            confine.make_dirs(base)
            os.mkdir(path, confine.DIR_MODE)
            yield path
    finally:
        if made:
            with suppress(OSError):  # not empty: another step's scratch is in it
                base.rmdir()  # a refused step leaves the work directory as it found it


@contextmanager
def private_dir(prefix: str, *, outside: Path | None = None) -> Iterator[Path]:
    """A new folder only this process's user can enter (``mkdtemp``: mode 0700, a random name
    in the system temp, outside the work directory), removed on exit (a signal's cleanup
    included; a SIGKILL leaves it, as tempfile does). For what a program the kit runs writes
    by path: ``git apply`` writes its results into its working folder by name, and a folder
    of a scratch copy inside the work directory swapped for a link to a folder outside while it
    ran had git write the patched files (and ``name~<pid>`` temporaries) there (issue 41, the
    eleventh hostile pass: a swap loop won most runs). Whoever can write only the work
    directory (the threat model's attacker) cannot reach this folder.

    ``outside``: the work directory, for a folder that programs write into by path (the
    build's ``TMPDIR``): a ``TMPDIR`` inside it is refused, since whoever can write the work
    directory can rename this folder there and put a link in its place; nvcc then wrote its
    temporaries, 51 MB, into the folder the link named (issue 41, the twelfth hostile pass).
    Every work directory this process works in is checked so, ``outside`` or not: apply's
    folder for ``git apply`` in a ``TMPDIR`` inside the work directory, renamed there and
    replaced by a link to a folder outside while apply ran, had the patched files written
    there, exit 0 (the seventeenth hostile pass, 2 runs of 3)."""
    _check_temp_outside(outside)
    temp = tempfile.gettempdir()
    foreign.refuse_foreign_temp(Path(temp), f"the system temp folder {temp} (TMPDIR)")
    made: list[Path] = []
    try:
        # a stop between mkdtemp's mkdir and the assignment would leave the folder unnamed
        with runner.stops_held():
            made.append(Path(tempfile.mkdtemp(prefix=f"kvprefetch-{prefix}-")))
        yield made[0]
    finally:
        if made:
            _remove_private(made[0])


def _check_temp_outside(outside: Path | None) -> None:
    """Refuse a system temp folder (TMPDIR) inside ``outside`` or inside any work directory
    this process works in (``confine.trusted_roots``): the programs the kit runs in a private
    folder (git apply, nvcc, gcc, pip) write there by path, and whoever can write the work
    directory can rename the folder and put a link in its place."""
    roots = [Path(r) for r in confine.trusted_roots()]
    if outside is not None:
        roots.append(Path(outside))
    if not roots:
        return
    # realpath, not resolve(): a work directory named by a loop of links was resolve()'s
    # RuntimeError, a traceback in doctor (issue 41, the twentieth hostile pass)
    system_temp = Path(os.path.realpath(tempfile.gettempdir()))
    for root in roots:
        work = Path(os.path.realpath(root))
        if mounts.within(system_temp, work):
            raise ConfigError(
                f"the system temp folder {system_temp} (TMPDIR) is inside the work directory "
                f"{work}: the programs kvprefetch runs (git apply, the compilers) write their "
                "files there by path, in a folder others who can write the work directory "
                "could swap for a link",
                "set TMPDIR to a folder outside the work directory (e.g. export TMPDIR=/tmp), "
                "then rerun")


def _writable_then_retry(top: str) -> Any:
    """rmtree's error handler, as tempfile's: a folder of the private folder ``top`` a program
    left read-only is made writable and the removal retried once; anything else is left (the
    removal must never fail a command that has already done its work). An error at ``top``
    itself (a link in its place) changes nothing: the folder above it is the system temp
    folder, which the handler made 0700 (issue 41, the thirty-ninth hostile pass)."""
    def handler(func: Any, path: str, exc_info: Any) -> None:
        if os.path.normpath(path) == os.path.normpath(top):
            return
        with suppress(OSError):
            os.chmod(os.path.dirname(path), 0o700)  # inside the private folder: nobody else's
            func(path)
    return handler


def _remove_private(tmp: Path) -> None:
    """Remove the private folder ``tmp`` whatever signals come meanwhile: a stop that comes
    during the removal is held and raised once the folder is gone (``runner.stops_held``). A
    third signal during a stop's cleanup (the first raises, the second only kills children, the
    third raises again) broke off tempfile's removal and left a ``kvprefetch-apply-*`` folder in
    the system temp (issue 41, the twelfth pass left it open); the thirteenth pass retried the
    removal after each stop, but a stop inside ``shutil.rmtree``'s descriptor walk made it close
    a descriptor twice, and the ``EBADF`` it raised ended the retries: a SIGINT every few
    milliseconds still left the folder (a ``kvprefetch-sdist-*`` of up to 130 MB after 3 of 14
    stopped fetches, the fifteenth pass). Held, the walk is never broken into."""
    with runner.stops_held():
        if os.path.lexists(tmp):
            if sys.version_info >= (3, 12):  # onerror is deprecated from 3.12
                shutil.rmtree(tmp, onexc=_writable_then_retry(str(tmp)))
            else:
                shutil.rmtree(tmp, onerror=_writable_then_retry(str(tmp)))


def start_time(pid: int) -> int | None:
    """When the process ``pid`` started (clock ticks since boot: ``/proc/<pid>/stat``'s 22nd
    field), None where it does not run or there is no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_line = f.read(4096)
        return int(stat_line.rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def this_run() -> dict[str, int]:
    """What a temporary's entry records of the run that makes it: its pid and, where known,
    when it started, which tells it from a later process given the same pid."""
    pid = os.getpid()
    started = start_time(pid)
    return {"pid": pid} if started is None else {"pid": pid, "started": started}


def _gone(entry: dict[str, Any]) -> bool:
    """Whether the run that made the temporary ``entry`` no longer runs. A pid alone could not
    tell a killed run from this one when both had the same pid: in a container the kit is
    often pid 1 every time, and a fetch killed there left ``pristine/.sdist.tmp-1``, which
    each later fetch kept as its own, then refused as "in the way ... kvprefetch does not
    remove what it did not make", and clean never removed (issue 41, the fifteenth hostile
    pass). With the start time recorded, a process of that pid that started at another time is
    another run."""
    pid = entry.get("pid")
    if not isinstance(pid, int) or not valid_pid(pid):
        return True
    started = entry.get("started")
    if isinstance(started, int) and not isinstance(started, bool):
        now = start_time(pid)
        if now is not None:
            return now != started
        # /proc says nothing of it: no such process, or one /proc hides from this user
        # (hidepid=1/2, another user's kit run in a shared work directory). The hidden run is
        # alive (kill says EPERM), and its temporary was removed under it by this user's fetch
        # or clean (issue 41, the sixteenth hostile pass); as before the start time was kept
    return pid != os.getpid() and not pid_alive(pid)  # a record made before it was kept


def orphans(root: Path) -> list[Path]:
    """Temporary paths of kit processes that no longer run."""
    return [root / r for r, e in entries(root).items() if e.get("kind") == "tmp" and _gone(e)]


# confine.write_file's temporary of one of the kit's own top-level records (the ownership
# record, the work directory's tag): ..kvprefetch-<record>.tmp-<6 hex>-<pid>. Names that begin
# with ".kvprefetch-" at the top of a work directory are the kit's, as the records themselves.
_RECORD_TMP = re.compile(r"\.\.kvprefetch-(?:owned\.json|workdir)\.tmp-[0-9a-f]{6}-([0-9]{1,10})")


def stale_writes(root: Path) -> list[Path]:
    """Temporaries of the kit's top-level records (the ownership record, the tag) left by
    killed runs: these cannot be listed in the ownership record (they are its own rewrite), so
    they are found by name, in the kit's reserved ``.kvprefetch-`` names only, with a dead pid,
    and only in a work directory the kit created empty (in an adopted one a user's file may
    carry any name, issue 41 A1). Every other temporary (a state record's, ``write_record``) is
    in the ownership record before it exists and goes with ``orphans``: a user's file named
    like a kit temporary is never removed by its name (issue 41, third pass)."""
    out: list[Path] = []
    if Workdir(root).is_adopted() or not root.is_dir() or root.is_symlink():
        return out
    for p in sorted(root.iterdir()):
        m = _RECORD_TMP.fullmatch(p.name)
        if m and int(m[1]) != os.getpid() and not pid_alive(int(m[1])) \
                and confine.is_plain_file(p):
            out.append(p)
    return out


def write_record(root: Path, path: Path, data: Any) -> None:
    """Write a record of the kit's (a tree's state) as JSON through a temporary that the
    ownership record names, with this pid, before it exists: a run killed mid-write leaves an
    orphan the next fetch or clean removes from the record, never by its name."""
    text = json_text(data)
    if confine.is_plain_file(path):
        try:
            if read_limited(path).decode("utf-8") == text:
                return
        except (OSError, ValueError):
            pass
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with temporary(root, tmp):
        confine.write_file(path, text, root=root, tmp_name=tmp.name)


def remove_orphans(root: Path, dry_run: bool = False) -> list[str]:
    out = []
    for p in stale_writes(root):
        out.append(str(p))
        if not dry_run:
            confine.remove_path(root, p)
    for p in orphans(root):
        # only what is there, with no link on the way, is removed, and only that is reported:
        # an entry whose path is absent or behind a link is forgotten quietly (issue 41, the
        # thirteenth hostile pass: clean said "removed" of a path behind a planted link that
        # it rightly left alone)
        there = os.path.lexists(p) and symlink_on_the_way(root, p) is None
        if there:
            out.append(str(p))
        if dry_run:
            continue
        if there:
            confine.remove_path(root, p)  # a temporary already: no rename first
        forget(root, p)
    return out

runner.PRIVATE_DIR[0] = private_dir  # the folder a child given runner.NEUTRAL_CWD starts in
runner.TEMP_CHECK[0] = lambda tmp: foreign.refuse_foreign_temp(Path(tmp), f"TMPDIR={tmp}")
# every log (runner.open_log) in a folder opened from a work directory or from / down, never
# by path: confine.open_log_dir says why (the fortieth pass)
runner.LOG_DIR_OPENER = confine.open_log_dir
