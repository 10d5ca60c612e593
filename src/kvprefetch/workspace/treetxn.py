"""All-or-nothing replacement of some of a tree's files, with the state record that goes with
them (what ``apply`` writes).

The new files are staged in ``trees/.<name>.apply/new/`` and the current ones copied to
``old/``; then ``journal.json`` (each file's sha256 before and after, and the state record to
write) is written; only then are the staged files renamed into place, one ``os.replace`` each,
and the state written. A failure on the way rolls every file back. A run killed on the way
leaves the stage directory, and the next command that takes the tree's lock (fetch, apply,
build, clean) calls ``recover``: without a journal nothing in the tree had changed and the
stage is removed; with one, the tree is rolled back to the journal's "before" (or, when the
state already records the journal's result, the stage is simply removed)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

from ..errors import ConfigError, PatchError
from ..hashing import sha256_file
from ..reading import load_json, read_limited
from . import confine, ownership
from .workdir import Workdir, write_json_atomic

# the largest tree file apply stages (the patched files are tens of KiB)
_MAX_FILE = 16 << 20


def _mode(p: Path) -> int:
    """The permission bits of the regular file ``p`` (not followed), kept as they are; else
    0o644 less the umask (``confine.kept_mode``): written with ``exact=True``."""
    return confine.kept_mode(p)


def stage_dir(wd: Workdir, name: str) -> Path:
    return wd.tree(name).with_name(f".{name}.apply")


def _hash(p: Path) -> str | None:
    if p.is_symlink() or (os.path.lexists(p) and not p.is_file()):
        return "not a regular file"
    return sha256_file(p) if p.is_file() else None


def _journal_files(journal: Path, tree: Path, files: Any) -> list[dict[str, Any]]:
    """The journal's file list, each ``rel`` confined to the tree (confine.record_path): a
    journal naming a path outside the tree, or of the wrong shape, is corrupt."""
    fix = _journal_fix(journal)
    if not isinstance(files, list):
        raise PatchError(f"{journal} is corrupt: 'files' is not a list", fix)
    for f in files:
        # both keys there (a null is a file that was absent): an entry without one was a
        # KeyError traceback in the rollback, from every fetch, apply and clean after it (issue
        # 41, the twentieth hostile pass)
        if not isinstance(f, dict) or not all(
                k in f and (f[k] is None or isinstance(f[k], str)) for k in ("before", "after")):
            raise PatchError(f"{journal} is corrupt: an entry of 'files' is malformed", fix)
        confine.record_path(tree, f.get("rel"), record=journal, family=PatchError, fix=fix)
        confine.check_target(tree, tree / f["rel"], what="roll back", family=PatchError)
    return files


def _stage_files(journal: Path, stage: Path, files: list[dict[str, Any]]) -> None:
    """Every ``old/<rel>`` copy a rollback would read is a regular file inside the stage, with
    no symlink on the way (``lstat``): a symlink (to /dev/zero, to a file outside the work
    directory), FIFO or device there makes the journal corrupt, and nothing is read from it."""
    for f in files:
        if f.get("before") is None:
            continue
        old = stage / "old" / f["rel"]
        if confine.first_symlink(stage, old) is not None or not confine.is_plain_file(old):
            raise PatchError(f"{journal} is corrupt: its saved copy {old} is not a regular file "
                             "inside the stage (a symlink, FIFO, device, folder or missing)",
                             _journal_fix(journal))


def _journal_fix(journal: Path) -> str:
    return (f"move {journal.parent} out of the work directory (it is the stage of an "
            "interrupted apply; kvprefetch acts on no path from it), then `kvprefetch "
            "diff-upstream --check` shows what the tree holds; `kvprefetch fetch --force` "
            "starts it again")


def _restore(root: Path, tree: Path, stage: Path, files: list[dict[str, Any]]) -> None:
    """Put every file back to its "before" content (the tree is locked by the caller). Every
    read, write and removal is relative to a folder opened without following a link
    (``confine``): a folder of the tree or the stage swapped for a symlink meanwhile makes it
    stop, and nothing is written outside, or read from outside into the tree."""
    for f in files:
        dst = tree / f["rel"]
        confine.check_target(tree, dst, what="roll back", family=PatchError)
        now = _hash(dst)
        if now == f["before"]:
            continue
        if now != f["after"]:
            # the stage named too: every fetch (--force included) recovers the stage before
            # anything else, so "then `kvprefetch fetch --force`" alone met this same error
            # again, for ever (issue 41, the thirty-eighth hostile pass)
            raise PatchError(f"{dst} changed while an interrupted apply was pending (sha256 "
                             f"{now}); kvprefetch cannot roll it back safely, and left it as is",
                             f"keep what you need from the tree, move {stage} (the interrupted "
                             "apply's stage: old/ holds the files as they were before it) out "
                             "of the work directory, then `kvprefetch fetch --force` (the tree "
                             "is moved to backup/)")
        if f["before"] is None:
            confine.remove_path(root, dst, family=PatchError)
            continue
        src = stage / "old" / f["rel"]
        if confine.first_symlink(stage, src) is not None or not confine.is_plain_file(src):
            raise PatchError(f"{src}, the saved copy of {dst}, is not a regular file; "
                             "kvprefetch stopped the rollback there",
                             _journal_fix(stage / "journal.json"))
        data = confine.read_file(root, src, family=PatchError)
        confine.write_file(dst, data, root=root, mode=_mode(src), family=PatchError,
                           exact=True)


def _recorded(wd: Workdir, stage: Path) -> bool:
    return (ownership.owned(wd.root, stage) or {}).get("kind") == "stage"


def _remove_stage(root: Path, stage: Path) -> None:
    """Remove the stage, then its entry in the ownership record (a run killed between the two
    leaves an entry for a path that is gone, which the next ``recover`` forgets)."""
    confine.remove_path(root, stage, family=PatchError)
    ownership.forget(root, stage)


def recover(wd: Workdir, name: str) -> str | None:
    """Finish the business of an apply that was killed (call with the tree's lock held).
    Returns what was done, or None when there was nothing to do. (A state record's temporary
    left by a killed run is in the ownership record: the next fetch or clean removes it.)"""
    stage = stage_dir(wd, name)
    if not os.path.lexists(stage):
        if _recorded(wd, stage):  # a run killed after recording its stage, before making it
            ownership.forget(wd.root, stage)
        return None
    if stage.is_symlink() or not stage.is_dir():
        raise PatchError(f"{stage} is not a kvprefetch stage directory",
                         "move it out of the trees/ directory, then rerun")
    if not _recorded(wd, stage) and wd.is_adopted():
        # in an adopted directory only what the record lists is the kit's: a folder of the
        # user's named like a stage (with a journal.json or not) was removed, and the tree
        # "rolled back" by its journal (issue 41, the seventeenth hostile pass: `fetch --adopt`
        # deleted a user's trees/.patched.apply/ and everything in it)
        raise PatchError(f"{stage} is not the stage of an apply kvprefetch made (the ownership "
                         "record does not list it, and kvprefetch adopted this work directory "
                         "with the user's files in it)",
                         f"move {stage} out of {stage.parent} (kvprefetch does not remove what "
                         "it did not make), then rerun")
    journal = stage / "journal.json"
    if journal.is_symlink():
        # it was read through the link, from wherever it led, and its fields called missing
        # ("unreadable ('files')"): a state record linked so is refused, and so is this (issue
        # 41, the forty-third hostile pass)
        raise PatchError(f"{journal} is corrupt: it is a symlink, and kvprefetch reads no "
                         "journal through one", _journal_fix(journal))
    if not journal.is_file():
        _remove_stage(wd.root, stage)
        return f"removed the stage of an apply to {name!r} that stopped before changing the tree"
    try:
        data = load_json(journal)
        files = data["files"]
        new_state = data["state"]
    except (ValueError, KeyError, TypeError) as exc:
        raise PatchError(f"the journal {journal} of an interrupted apply is unreadable ({exc})",
                         f"move {stage} out of the work directory, then `kvprefetch fetch "
                         "--force` to start the tree again") from None
    files = _journal_files(journal, wd.tree(name), files)
    sp = wd.state_file(name)
    try:
        committed = confine.is_plain_file(sp) and load_json(sp) == new_state
    except (OSError, ValueError):
        committed = False
    if not committed:
        _stage_files(journal, stage, files)  # all checked before the first file is touched
        _restore(wd.root, wd.tree(name), stage, files)
    _remove_stage(wd.root, stage)
    return (f"completed an interrupted apply to {name!r}" if committed
            else f"rolled back an interrupted apply to {name!r}: the tree is as before it")


def commit(wd: Workdir, name: str, changes: dict[str, Path], new_state: dict[str, Any],
           verify: Callable[[], None]) -> None:
    """Replace ``tree/rel`` by the file ``changes[rel]`` for every rel, run ``verify`` and write
    ``new_state``; all of it or (on any failure) none of it."""
    tree = wd.tree(name)
    stage = stage_dir(wd, name)
    if os.path.lexists(stage):
        raise PatchError(f"{stage} is in the way", "rerun: the next run recovers it")
    for rel in changes:  # before anything is staged: a symlink on the way is refused up front
        confine.check_target(tree, tree / rel, what="replace", family=PatchError)
    confine.check_target(wd.root, stage, what="create the stage", family=PatchError)
    root = wd.root
    files: list[dict[str, Any]] = []
    journal_written = False
    # every write into the stage and the tree, every read from the tree, goes through confine
    # (relative to folders opened O_NOFOLLOW from the work directory down): a stage or a tree
    # folder swapped for a symlink while apply runs makes it stop, and nothing is written
    # behind the link (issue 41, the ninth hostile pass: `shutil.copy2` into a stage swapped
    # for a link to a folder outside wrote the staged files there, a race a loop won within
    # a few runs)
    # recorded before it exists: a stage the record lists is the kit's to recover and remove
    # even in an adopted directory, where an unlisted one is the user's (recover)
    ownership.record(root, stage, "stage")
    try:
        confine.ensure_dir(stage, root=root, family=PatchError)
        for rel, src in changes.items():
            try:
                data = read_limited(src, _MAX_FILE)
            except ValueError as exc:
                raise PatchError(f"cannot stage {rel}: {exc}", "rerun; report this if it "
                                 "happens again") from None
            confine.write_file(stage / "new" / rel, data, root=root, mode=_mode(src),
                               family=PatchError, exact=True)
            before = _hash(tree / rel)
            if before is not None:
                old = confine.read_file(root, tree / rel, limit=_MAX_FILE, family=PatchError)
                if hashlib.sha256(old).hexdigest() != before:
                    raise PatchError(f"{tree / rel} changed while apply copied it (another "
                                     "process is changing the work directory)",
                                     "stop whatever else writes there, then rerun")
                confine.write_file(stage / "old" / rel, old, root=root, mode=_mode(tree / rel),
                                   family=PatchError, exact=True)
            files.append({"rel": rel, "before": before,
                          "after": hashlib.sha256(data).hexdigest()})
        write_json_atomic(stage / "journal.json", {"tree": name, "files": files,
                                                    "state": new_state})
        journal_written = True
        for f in files:
            dst = tree / f["rel"]
            confine.ensure_dir(dst.parent, root=tree, family=PatchError)
            confine.move_file(root, stage / "new" / f["rel"], dst, family=PatchError)
        verify()
        ownership.write_record(wd.root, wd.state_file(name), new_state)
    except BaseException:
        if journal_written:
            _restore(root, tree, stage, files)
        with suppress(OSError, PatchError, ConfigError):
            _remove_stage(root, stage)
        raise
    _remove_stage(root, stage)
