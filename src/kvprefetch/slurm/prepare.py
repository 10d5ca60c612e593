"""The prepare job (``kvprefetch slurm prepare CAMPAIGN``), before any build starts:

- the read-only source cache: the hash-pinned sdist downloaded once into ``<campaign>/cache/``
  (``--source auto``/``sdist``) and made read-only, or the ``--source`` path checked (an sdist
  by its sha256, never modified; a clone by its existence). Every build job then fetches from
  it into its own scratch;
- ``<campaign>/work`` made a kit work directory, and every tree's build folder recorded in its
  ownership record, so that the build jobs (running at once, possibly on different nodes) never
  write that one shared file: no lock has to hold across nodes (flock over NFS does not,
  everywhere). They publish only into their own tree's paths (publish.py).

Both are confined to the campaign folder: a symlinked ``cache/``, ``logs/`` or ``work/`` is
refused (never followed), and a cached file prepare did not download is never deleted."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, FetchError
from ..workspace import ownership
from ..workspace.confine import check_target, ensure_dir, first_symlink
from ..workspace.workdir import Workdir
from .campaign import Campaign


@dataclass(frozen=True)
class Prepared:
    source: str            # what the build jobs fetch from
    downloaded: bool       # the prepare job downloaded it (else it was there, and checked)
    recorded: tuple[str, ...]


def _make_read_only(root: Path, path: Path) -> None:
    """chmod a-w on the regular file ``path`` itself, opened ``O_NOFOLLOW`` relative to its
    folder, which is opened from the campaign ``root`` down without following a link
    (``confine.open_dir``): by path, a ``cache/`` swapped for a link to a folder outside after
    the download's checks had the chmod land on the file of that name there, a user's own
    sdist in another work directory's ``downloads/`` made read-only (issue 41, the
    twenty-second hostile pass: 1 run of 12 under a renameat2 loop)."""
    from ..workspace.confine import open_dir

    dfd = open_dir(path.parent, root=root, what="make read-only the cached sdist in",
                   family=FetchError)
    try:
        fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dfd)
    except OSError as exc:
        raise FetchError(f"cannot open {path}: {exc.strerror or exc}",
                         f"move {path} away, then rerun") from None
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FetchError(f"{path} is not a regular file", f"move {path} away, then rerun")
        if st.st_nlink > 1:
            # a hard link: the chmod would change the file under its other name too, perhaps
            # outside the campaign (issue 41, ninth pass: a user's sdist elsewhere, linked in
            # with `ln`, was made read-only)
            raise FetchError(f"{path} has {st.st_nlink} hard links (the same file under another "
                             "name, perhaps outside the campaign folder); kvprefetch makes its "
                             "cached sdist read-only, which would change that file too",
                             f"replace {path} by a copy (cp --remove-destination FILE {path}) "
                             "or remove it (the prepare job downloads it), then rerun")
        os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    finally:
        os.close(fd)


def source_cache(c: Campaign) -> tuple[str, bool]:
    """The campaign's source, present, checked and read-only; whether it was downloaded now."""
    from .. import upstream
    from ..hashing import sha256_file_of_size
    from ..sources.download import ensure_sdist

    if c.source in ("auto", "sdist"):
        root = Path(c.root)
        target = c.cache / upstream.SDIST_NAME
        # a symlinked cache/ is refused (it chmodded and deleted files of the folder it named)
        check_target(root, target, what="download into", family=FetchError)
        had = os.path.lexists(target)
        # sha256-checked; written under a temp name, then renamed. A file with another hash is
        # refused and left as it is: prepare cannot tell its own download from a user's file
        path = ensure_sdist(c.cache, root=root, may_delete=lambda _p: False)
        _make_read_only(root, path)
        return str(path), not had
    src = Path(c.source)
    if src.is_file():
        # of the sdist's size, or never read: a sparse 15 TB file as the campaign's --source
        # kept the prepare job hashing zeros for hours (issue 41, the twentieth hostile pass)
        try:
            actual = sha256_file_of_size(src, upstream.SDIST_SIZE)
        except OSError as exc:
            raise FetchError(f"cannot read --source {src}: {exc.strerror or exc}",
                             "plan the campaign again with the sdist's path, or --source "
                             "sdist") from None
        if actual != upstream.SDIST_SHA256:
            what = (f"sha256 {actual}" if actual is not None else
                    f"{src.stat().st_size} bytes (the sdist has {upstream.SDIST_SIZE})")
            raise FetchError(f"--source {src} has {what}, not the vLLM "
                             f"{upstream.VLLM_VERSION} sdist's sha256 {upstream.SDIST_SHA256}",
                             "plan the campaign again with the right file, or --source sdist")
    elif not src.is_dir():
        raise FetchError(f"--source {src} is not there (as the jobs see the filesystem)",
                         "put the sdist or clone on a filesystem every node mounts, at the "
                         "same path, and plan again")
    return str(src), False


def record_builds(workdir: Path, trees: list[str]) -> list[str]:
    # as named (the campaign folder is resolved already), never resolved: resolving a work/
    # swapped for a link after check_workdir made the folder the link named the work
    # directory, its tag and ownership record written there (the nineteenth hostile pass)
    wd = Workdir(Path(os.path.normpath(os.path.abspath(workdir))))
    wd.ensure(campaign=True)
    done = []
    for t in trees:
        path = wd.build_root(t)
        if ownership.owned(wd.root, path) is None:
            ownership.record(wd.root, path, "build")
            done.append(t)
    return done


def check_workdir(c: Campaign) -> None:
    """Refuse a symlinked ``<campaign>/work``: the campaign's work directory is a real folder
    inside it (resolving the link took over the folder it named, as a --workdir)."""
    link = first_symlink(Path(c.root), c.workdir)
    if link is not None:
        try:  # swapped back meanwhile: readlink's EINVAL would hide the refusal
            to = f" (to {os.readlink(link)})"
        except OSError:
            to = ""
        raise ConfigError(f"{link} is a symlink{to}; a campaign's work "
                          "folder is a real folder inside the campaign, and kvprefetch never "
                          "writes through a symlink",
                          f"remove the symlink {link} (its target is left as it is), then "
                          "rerun the prepare job")


def prepare(c: Campaign) -> Prepared:
    check_workdir(c)
    source, downloaded = source_cache(c)
    ensure_dir(c.logs, root=Path(c.root))
    return Prepared(source, downloaded, tuple(record_builds(c.workdir, list(c.tree_names))))
