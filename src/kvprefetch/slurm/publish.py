"""A build job's last step (``kvprefetch slurm publish``): its finished outputs, moved from its
scratch work directory into the campaign's shared ``work/``, in the layout every reader of a
work directory already accepts (``kernels.ops.find_builds``, ``verify-kernel``, ``bench``):

    work/envs/<tree>/            the tree's environment, with kvprefetch_kernels/_C.so in it
    work/build/<tree>/<key>/     manifest.json, the library, build.ninja, logs/ (no objects)

Atomic by rename, no lock: each is copied under a temporary name in the folder it ends up in
(``.<name>.publish-<job>``), its JSON paths rewritten from scratch to the published place and
the library re-hashed against the manifest, then renamed into place. A rename within one
filesystem is atomic (POSIX ``rename(2)``; NFS and Lustre honour it), so a reader sees the old
build or the new one, never half of one. The environment is renamed first and the build folder
second: the manifest, what readers look for, appears last. Two jobs never publish the same path
(one build job per tree), and the campaign's ownership record was written by ``prepare``; so
nothing here needs a lock that holds across nodes.

A kernels-only environment is a venv without pip whose package finds its library next to its
own ``__file__``; its python finds ``pyvenv.cfg`` beside ``bin/``, wherever the folder is, so
the moved environment works unchanged (verify-kernel's probe checks that it does).

On failure, ``keep_logs`` copies the build's logs out of the scratch before it is removed.

Every path written, renamed or removed is confined (``workspace.confine``): inside the work
directory (``keep_logs``: the campaign's logs folder), with no symlink on the way, checked by
``lstat`` and never followed; every removal is ``confine.remove_path``. The label (the job id)
becomes part of a path, so it must be a Slurm job id (``check_job_label``)."""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SlurmError
from ..hashing import MAX_LIBRARY_BYTES
from ..reading import parse_json, read_limited
from ..workspace.confine import (
    check_target,
    copy_tree,
    ensure_dir,
    read_file,
    remove_path,
    rename_path,
    sha256_in,
)
from ..workspace.workdir import Workdir, write_json_atomic

_NOT_PUBLISHED = ("*.o", "*.o.tmp", ".ninja_deps", ".ninja_log")
_NOT_KEPT = ("*.o", "*.o.tmp", "*.so", "src")
_FIX_SPECIAL = ("remove it from the scratch work directory (a build writes only folders, regular "
                "files and symlinks), then rerun the step or resubmit the build job")


def _special(path: str) -> bool:
    """``path`` is neither a folder, a regular file nor a symlink (``lstat``): a FIFO, device
    or socket."""
    mode = os.lstat(path).st_mode
    return not (stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode))


def _refuse_special(top: Path) -> None:
    """A FIFO, device or socket under ``top`` (the scratch folder to publish) is named with the
    fix: it was "copying ... failed: is a named pipe / To fix: free space or fix the
    permissions of the destination", the user sent to the wrong place, and a device
    (``/dev/zero``'s kind) was copied without end (issue 41, the tenth hostile pass). The copy
    (``confine.copy_tree``) refuses one that appears after this look, too. The kit's own walk
    (``hashing.walk``): ``os.walk`` calls itself once per level, and a folder 1,500 levels deep
    in the scratch was a ``RecursionError`` traceback (issue 41, the twenty-second hostile
    pass)."""
    from ..hashing import walk

    for folder, dirs, files in walk(top):
        for name in dirs + files:
            path = os.path.join(folder, name)
            if _special(path):
                raise SlurmError(f"{path} is a FIFO, device or socket, not a build output; "
                                 "kvprefetch publishes only regular files", _FIX_SPECIAL)


@dataclass(frozen=True)
class Published:
    tree: str
    build_dir: Path
    env_dir: Path
    so_path: Path
    so_sha256: str

    def to_dict(self) -> dict[str, str]:
        return {"tree": self.tree, "build_dir": str(self.build_dir),
                "env_dir": str(self.env_dir), "so_path": str(self.so_path),
                "so_sha256": self.so_sha256}



def _read_json(path: Path, shown: Path | None = None, *,
               root: Path | None = None) -> dict[str, Any]:
    """A build's manifest or build.json (size-capped, never a FIFO, nested a few levels:
    ``reading.parse_json``), or a SlurmError naming it (as ``shown``: the scratch's file, of a
    copy read). ``rewrite_paths`` and ``json.dumps`` walk it by calling themselves once per
    level: a build.json nested 700 deep in the scratch was a RecursionError traceback here
    (issue 41, the twenty-second hostile pass)."""
    fix = "rebuild in the scratch work directory; resubmit the build job"
    try:
        # a copy in the campaign (``root``): opened from it down, never through a link
        raw = read_limited(path) if root is None else read_file(root, path, family=SlurmError)
    except (OSError, ValueError) as exc:
        raise SlurmError(f"cannot read {path}: {exc}", fix) from None
    try:
        data = parse_json(raw, shown or path)
    except ValueError as exc:
        raise SlurmError(f"{shown or path} is corrupt: {exc}", fix) from None
    if not isinstance(data, dict):
        raise SlurmError(f"{path} holds no JSON object",
                         "rebuild in the scratch work directory; resubmit the build job")
    return data


def _moved(path: str, pairs: list[tuple[str, str]]) -> str:
    for old, new in pairs:
        if path == old or path.startswith(old + "/"):
            return new + path[len(old):]
    return path


def rewrite_paths(obj: Any, pairs: list[tuple[str, str]]) -> Any:
    """``obj`` (JSON) with every string (and key) under a moved folder pointing at its new place;
    paths elsewhere (the scratch's trees, the toolchain) stay as they were recorded."""
    if isinstance(obj, str):
        return _moved(obj, pairs)
    if isinstance(obj, list):
        return [rewrite_paths(v, pairs) for v in obj]
    if isinstance(obj, dict):
        return {_moved(k, pairs): rewrite_paths(v, pairs) for k, v in obj.items()}
    return obj


# Slurm's job ids are 32-bit (at most 10 digits), an array's task ids are below its
# MaxArraySize: longer digits are no Slurm job id, and a 300-digit SLURM_JOB_ID made a logs
# folder name past 255 bytes, "File name too long" with the fix "use a shorter path" for the
# campaign, which the user would shorten in vain (issue 41, the twentieth hostile pass).
_JOB_ID = re.compile(r"[0-9]{1,10}(_[0-9]{1,10})?")
# A build folder's name with ``.`` before it and ``.publish-<job id>`` after fits in one name.
MAX_KEY_BYTES = 255 - len(".") - len(".publish-") - 21


def check_job_label(label: str, what: str = "SLURM_JOB_ID") -> str:
    """``label`` if it is a Slurm job id (digits; an array task ``<digits>_<digits>``): it
    names folders and temporary names, so anything else (``..``, a ``/``) is refused."""
    if not isinstance(label, str) or not _JOB_ID.fullmatch(label):
        raise SlurmError(f"{what} {label!r} is not a Slurm job id (digits, or <digits>_<digits> "
                         "for an array task); kvprefetch names folders after it, so it takes "
                         "nothing else",
                         "run this step inside the Slurm job that sbatch started (it sets "
                         "SLURM_JOB_ID), or unset SLURM_JOB_ID to label it by the process id")
    return label


def _refuse_link(path: Path) -> None:
    """Refuse ``path`` itself when it is a symlink (``lstat``; a folder everything else is
    confined to)."""
    if os.path.islink(path):
        try:  # swapped back meanwhile: readlink's EINVAL was "slurm failed: Invalid argument"
            to = f" (to {os.readlink(path)})"
        except OSError:
            to = ""
        raise SlurmError(f"refusing to publish into {path}: it is a symlink{to}, and "
                         "kvprefetch never writes, moves or deletes through one",
                         f"remove the symlink {path} (its target is left as it is), then rerun")


def _discard(root: Path, path: Path) -> None:
    """Remove the leftover ``path`` (confined) where it can; a failure here never hides the
    publication's own outcome (the next publish of this job removes it)."""
    with contextlib.suppress(OSError, SlurmError):
        remove_path(root, path, family=SlurmError)


def _rename_into_place(root: Path, tmp: Path, dest: Path, label: str) -> None:
    """``tmp`` becomes ``dest``; a ``dest`` already there (a resubmitted build) is moved aside
    first and removed after (rename cannot replace a non-empty directory). Every path is
    confined to ``root`` with no symlink on the way."""
    old = dest.parent / f".{dest.name}.old-{label}"
    for p in (tmp, dest, old):
        check_target(root, p, what="replace", family=SlurmError)
    remove_path(root, old, family=SlurmError)
    # relative to a descriptor of the folder (confine.rename_path): renames by path followed
    # a folder swapped for a link meanwhile (issue 41, the eleventh hostile pass)
    moved = os.path.lexists(dest)
    if moved:
        rename_path(root, dest, old.name, family=SlurmError)
    try:
        rename_path(root, tmp, dest.name, family=SlurmError)
    except BaseException:
        # the previous build back in its place: a refused rename left it moved aside as
        # .<name>.old-<job> until a rerun (issue 41, the eleventh pass left it open)
        if moved and not os.path.lexists(dest):
            with contextlib.suppress(OSError, SlurmError):
                rename_path(root, old, dest.name, family=SlurmError)
        raise
    _discard(root, old)


# the temporaries publish_build leaves when its job is killed (a time limit, scancel -9, a node
# lost): .<key>.publish-<job> in build/<tree>/, .<tree>.publish-<job> in envs/, and the
# previous build moved aside, .<name>.old-<job>; only these exact shapes are the kit's
_DEBRIS = re.compile(r"\.(?P<name>[^/]+)\.(?:publish|old)-(?P<job>[0-9]+(?:_[0-9]+)?)")


def _job_ended(logs: Path, tree: str, job: str) -> bool:
    """The build job ``job`` of ``tree`` has ended: its script's EXIT trap wrote its exit
    record (``logs/build-<tree>-<job>.exit``, a regular file, never a link), which it does
    last. A job killed without one (SIGKILL, a node lost) is not known to have ended, so its
    debris stays, to be removed by hand (kept: a job still running may be writing it)."""
    from .campaign import EXIT_SUFFIX

    try:
        return stat.S_ISREG(os.lstat(logs / f"build-{tree}-{job}{EXIT_SUFFIX}").st_mode)
    except OSError:
        return False


def remove_debris(root: Path, folder: Path, names: Callable[[str], bool], *, logs: Path,
                  tree: str, label: str) -> list[Path]:
    """Remove from ``folder`` (inside ``root``, opened ``O_NOFOLLOW`` from it down) the
    temporaries an earlier build job of ``tree`` left (``_DEBRIS``, whose name passes
    ``names``), once that job has ended (``_job_ended``); never this job's own (``label``:
    removed by ``publish_build`` itself), never one of a job that may still run, never
    through a link (``confine.remove_path``). They were never removed at all (issue 41, the
    twelfth pass left it open). Returns what was removed."""
    from ..workspace.confine import open_dir

    try:  # best effort: the publish's own checks refuse a folder swapped for a link
        dfd = open_dir(folder, root=root, what="remove from", family=SlurmError)
        try:
            listed = sorted(os.listdir(dfd))
        finally:
            os.close(dfd)
    except (OSError, SlurmError):
        return []
    gone = []
    for entry in listed:
        m = _DEBRIS.fullmatch(entry)
        if m is None or m["job"] == label or not names(m["name"]) \
                or not _job_ended(logs, tree, m["job"]):
            continue
        with contextlib.suppress(OSError, SlurmError):
            remove_path(root, folder / entry, family=SlurmError)
            gone.append(folder / entry)
    return gone


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def publish_build(scratch: Path, dest: Path, tree: str, *, label: str,
                  host: str = "", logs: Path | None = None) -> Published:
    """Publish the newest kernels-only build of ``tree`` in the scratch work directory into the
    work directory ``dest`` (see the module docstring). ``label`` names the temporary folders
    (the job id). ``logs``: the campaign's logs folder, where an earlier job's exit record says
    it has ended, so that its leftovers go (``remove_debris``)."""
    from ..kernels.ops import find_builds

    check_job_label(label, "the label")
    # the work directory as given (the campaign folder is resolved already): a symlinked
    # work/ is refused, never resolved to its target
    dest = Path(os.path.normpath(os.path.abspath(dest)))
    _refuse_link(dest)
    swd, dwd = Workdir(scratch.resolve()), Workdir(dest)
    builds = [b for b in find_builds(swd.root, [tree]) if b.tree == tree]
    if not builds:
        raise SlurmError(f"no kernels-only build of {tree} in the scratch {swd.root}",
                         "read the build's output above; resubmit the build job")
    built = builds[0]
    src_build = built.manifest_path.parent
    if len(os.fsencode(src_build.name)) > MAX_KEY_BYTES:
        # its temporaries (.<key>.publish-<job>, .<key>.old-<job>) are past one name's 255
        # bytes: "File name too long / use a shorter path (the --workdir, -o/--out or campaign
        # folder that named it)" sent the user to the campaign (issue 41, the twenty-fourth pass)
        raise SlurmError(f"the build folder {src_build} in the scratch has a name of "
                         f"{len(os.fsencode(src_build.name))} bytes, more than the "
                         f"{MAX_KEY_BYTES} kvprefetch publishes (its builds are named by a "
                         "short key)", "rebuild with `kvprefetch build --kernels-only` in the "
                         "scratch work directory; resubmit the build job")
    manifest = _read_json(built.manifest_path)
    env = manifest.get("env", {})
    if not isinstance(env, dict):
        # ``"env": 5`` was ``'int' object has no attribute 'get'``, a traceback (issue 41, the
        # seventeenth hostile pass): the scratch's manifest is data like any record
        raise SlurmError(f"{built.manifest_path} is corrupt: its `env` is "
                         f"{type(env).__name__}, not an object",
                         "rebuild in the scratch work directory; resubmit the build job")
    path = env.get("path", "")
    if not isinstance(path, str) or "\x00" in path:
        # a NUL was os.path.realpath's ValueError, a traceback (issue 41, the eighteenth pass)
        raise SlurmError(f"{built.manifest_path} is corrupt: its env's path is "
                         f"{repr(path)[:200]}, not a path",
                         "rebuild in the scratch work directory; resubmit the build job")
    src_env = Path(path)
    real_env = Path(os.path.realpath(src_env))
    # the scratch's environment of this tree, the one the kit's kernels-only build makes and
    # the one published to envs/<tree>: an env of the scratch root (or its build folder) had
    # the whole scratch copied, and a library under both folders was a ValueError traceback
    # in relative_to (issue 41, the eighteenth hostile pass)
    if real_env != Path(os.path.realpath(swd.env(tree))) \
            or not _inside(Path(os.path.realpath(built.so_path)), real_env):
        raise SlurmError(f"the build of {tree} loads {built.so_path}, not a library in an "
                         f"environment of the scratch {swd.root}",
                         "build with `kvprefetch build --kernels-only` in the scratch work "
                         "directory")
    dst_build, dst_env = dwd.build_root(tree) / src_build.name, dwd.env(tree)
    # the manifest records paths as the build saw them: the scratch as given, or resolved
    recorded_build = Path(str(manifest.get("build_so_path") or src_build)).parent
    pairs = [(str(p), str(dst_build)) for p in {src_build, recorded_build}]
    pairs += [(str(p), str(dst_env)) for p in {src_env, real_env}]
    tmp_build = dst_build.parent / f".{dst_build.name}.publish-{label}"
    tmp_env = dst_env.parent / f".{dst_env.name}.publish-{label}"
    for p in (dst_build, dst_env, tmp_build, tmp_env):  # before anything is removed
        check_target(dwd.root, p, what="publish into", family=SlurmError)
    if logs is not None:  # debris of an earlier job of this tree that has ended
        remove_debris(dwd.root, dst_build.parent, lambda name: not name.startswith("."),
                      logs=logs, tree=tree, label=label)
        remove_debris(dwd.root, dst_env.parent, lambda name: name == dst_env.name,
                      logs=logs, tree=tree, label=label)
    for tmp in (tmp_build, tmp_env):
        remove_path(dwd.root, tmp, family=SlurmError)  # debris of an earlier try of this job
        ensure_dir(tmp.parent, root=dwd.root, family=SlurmError)
    try:
        # made and written relative to folders opened O_NOFOLLOW from work/ down: copytree
        # by path wrote whole copies behind a folder of work/ swapped for a link while it ran
        # (issue 41, the eleventh hostile pass: 60 publishes under a swap loop, 136 files and
        # folders written outside)
        for src, tmp, globs in ((src_env, tmp_env, ()), (src_build, tmp_build, _NOT_PUBLISHED)):
            _refuse_special(src)
            copy_tree(dwd.root, src, tmp, skip_globs=globs, family=SlurmError)
        for bj in tmp_env.glob("lib/python*/site-packages/kvprefetch_kernels/build.json"):
            data = _read_json(bj, shown=src_env / bj.relative_to(tmp_env), root=dwd.root)
            write_json_atomic(bj, rewrite_paths(data, pairs), root=dwd.root)
        new = rewrite_paths(manifest, pairs)
        new["published"] = {"from": str(src_build), "env_from": str(src_env), "job": label,
                            "host": host,
                            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        so = Path(_moved(str(built.so_path), pairs))
        copied = tmp_env / so.relative_to(dst_env)
        try:  # the copy in the campaign: never through a link, never without end
            actual = sha256_in(dwd.root, copied, limit=MAX_LIBRARY_BYTES, family=SlurmError)
        except (OSError, SlurmError) as exc:  # the copy is removed below: no "move it away"
            why = exc.cause if isinstance(exc, SlurmError) else \
                f"cannot hash the copy {copied}: {exc.strerror or exc}"
            raise SlurmError(why, "resubmit the build job; if the copy was changed while it "
                             f"was published, let only yourself write {dwd.root}") from None
        if actual != built.so_sha256:
            raise SlurmError(f"the copy {copied} has sha256 {actual}, the manifest says "
                             f"{built.so_sha256}", "resubmit the build job (a bad copy)")
        write_json_atomic(tmp_build / "manifest.json", new, root=dwd.root)
        _rename_into_place(dwd.root, tmp_env, dst_env, label)
        _rename_into_place(dwd.root, tmp_build, dst_build, label)  # the manifest: committed
    finally:
        for tmp in (tmp_build, tmp_env):
            _discard(dwd.root, tmp)
    return Published(tree, dst_build, dst_env, so, built.so_sha256)


def keep_logs(scratch: Path, tree: str, into: Path, *, root: Path) -> Path | None:
    """Copy the build logs of ``tree`` (its ``build/<tree>`` folder without objects, libraries
    and sources) out of the scratch into ``into``, confined to ``root`` (the campaign folder: no
    symlink from it down to ``into``); None when the job never got to build."""
    check_target(root, into, what="keep the build logs in", family=SlurmError)
    src = Workdir(scratch.resolve()).build_root(tree)
    if not src.is_dir():
        return None
    remove_path(root, into, family=SlurmError)
    ensure_dir(into.parent, root=root, family=SlurmError)
    # a FIFO, device or socket is never read, the rest of the logs kept
    copy_tree(root, src, into, skip_globs=_NOT_KEPT, skip_special=True, family=SlurmError)
    return into
