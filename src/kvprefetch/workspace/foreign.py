"""A folder the kit is to take as its own (a new work directory, a new campaign) must be the
user's: one that already exists and belongs to another user is refused before anything is
written in it.

In a shared sticky folder (``/tmp``) another user can make the empty folder the kit is about to
create (``mkdir /tmp/work`` before ``fetch --workdir /tmp/work``), and the kit took it: every
tree, record, environment and job script it then made lay in a folder that user owns, where
they can rename or replace any of them (no sticky bit protects entries in their own folder),
so the environments' ``python`` that ``bench`` runs and the job scripts ``slurm submit`` hands
to sbatch became theirs to plant (issue 41, the thirty-fifth hostile pass)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from ..errors import ConfigError


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, OverflowError):
        return f"uid {uid}"


def refuse_foreign(folder: Path, what: str) -> None:
    """Raise a ConfigError where ``folder`` exists (not followed) and another user owns it.
    ``what`` names it in the message (``--workdir X``, ``the campaign folder X``)."""
    try:
        st = os.lstat(folder)
    except OSError:
        return  # not there: the kit makes it, as this user
    me = os.geteuid()
    if st.st_uid == me:
        return
    raise ConfigError(
        f"{what} already exists and belongs to {_user(st.st_uid)}, not to you "
        f"({_user(me)}): that user could replace anything kvprefetch puts in it, its "
        "programs and scripts included",
        f"pick a path that does not exist yet in a folder only you can write (e.g. under your "
        f"home), or, if the folder is yours to take, `chown {me} {folder}` first")


def make_own_folder(folder: Path, what: str) -> None:
    """``mkdir -p folder`` for a folder the kit takes as its own, refused (ConfigError) where
    another user owns it, looked at again once it is there: the check before the ``mkdir``
    alone left a window in which another user, in a shared sticky folder, made the folder
    first; ``mkdir -p`` then took theirs as the kit's, and the work directory or campaign lay
    in a folder they own (issue 41, the thirty-sixth hostile pass: a loop making and removing
    the folder as ``nobody`` won 1 ``slurm plan`` of 12)."""
    from .confine import make_dirs

    refuse_foreign(folder, what)
    make_dirs(folder)
    refuse_foreign(folder, what)


def refuse_foreign_link(path: Path, what: str) -> None:
    """Raise a ConfigError where ``path`` is a symlink (not followed) that another user owns,
    root aside: the command line follows a link the user names once (``--workdir``, a
    campaign), and another user's link in a shared sticky folder (``ln -s ~/empty
    /tmp/work`` before ``fetch --workdir /tmp/work``) chose for them which of their folders the
    kit took, and can lead the next command (a ``clean``, a ``submit``) to another of them
    (issue 41, the thirty-seventh hostile pass: a ``slurm plan`` and a ``fetch`` wrote into the
    empty folder ``nobody``'s link named, where the kernel lets root follow it)."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    me = os.geteuid()
    if not os.path.islink(path) or st.st_uid in (me, 0):
        return
    raise ConfigError(
        f"{what} is a symlink that belongs to {_user(st.st_uid)}, not to you ({_user(me)}): "
        "that user chose the folder it leads to, and can change it between two commands",
        f"name the folder itself (`realpath {path}` shows where the link leads now), or a path "
        "in a folder only you can write")
