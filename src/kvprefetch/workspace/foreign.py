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
from collections.abc import Iterable, Mapping, MutableMapping
from pathlib import Path

from ..errors import ConfigError
from .confine import user_name


def refuse_foreign(folder: Path, what: str) -> None:
    """Raise a ConfigError where ``folder`` exists (not followed) and another user owns it, or
    where a folder above it belongs to a user other than this one or root (``_foreign_above``).
    ``what`` names it in the message (``--workdir X``, ``the campaign folder X``)."""
    _refuse_foreign_above(folder, what)
    try:
        st = os.lstat(folder)
    except OSError:
        return  # not there: the kit makes it, as this user
    me = os.geteuid()
    if st.st_uid == me:
        return
    raise ConfigError(
        f"{what} already exists and belongs to {user_name(st.st_uid)}, not to you "
        f"({user_name(me)}): that user could replace anything kvprefetch puts in it, its "
        "programs and scripts included",
        f"pick a path that does not exist yet in a folder only you can write (e.g. under your "
        f"home), or, if the folder is yours to take, `chown {me} {folder}` first")


def _refuse_foreign_above(folder: Path, what: str) -> None:
    """A folder above a new work directory or campaign that another user (not root) owns
    lets that user rename the kit's folder away and put their own in its place, whatever its
    mode or sticky bit: a work directory made in ``/tmp/theirs/`` was taken without a word
    (issue 41, left open by the thirty-fifth to thirty-seventh hostile passes). Links on the
    way are ``refuse_foreign_link``'s; the folders looked at here are the real ones above, as
    the kernel resolves them. A tagged work directory is never looked at here (team-shared
    work directories are used on purpose).

    A folder above that every user may write without the sticky bit (``o+w``, not ``+t``) lets
    any of them do the same, whoever owns it (pass 40 a's note: a work directory below a root
    folder of 0777 had its environments' ``python`` theirs to plant). A folder writable by its
    group only is the team's, and taken as such."""
    me = os.geteuid()
    real = Path(os.path.realpath(folder))
    for above in real.parents:
        try:
            st = os.lstat(above)
        except OSError:
            continue  # not there yet: the kit makes it, as this user
        uid = st.st_uid
        sticky = st.st_mode & 0o1000
        if not sticky and _acl_lets_others_write(above, uid, groups=False, trusted=(0, me)):
            # an ACL naming another user (setfacl -m u:nobody:rwx) gives them what o+w gives
            # everyone, while the mode shows only the mask: slurm plan below such a folder was
            # taken (issue 41, left open by the forty-second hostile pass). A named group is
            # the team's, as the group bits are.
            raise ConfigError(
                f"{what} would lie below {above}, which another user may write by an ACL and "
                f"which has no sticky bit (`getfacl {above}` shows who): that user can rename "
                "the folder kvprefetch makes there and put their own in its place",
                f"pick a path under folders only you or root can write (e.g. under your home), "
                f"or take that user's entry off the ACL (`setfacl -x u:USER {above}`)")
        if st.st_mode & 0o002 and not sticky:
            raise ConfigError(
                f"{what} would lie below {above}, which every user may write and which has no "
                f"sticky bit (mode {st.st_mode & 0o7777:o}): any of them can rename the folder "
                "kvprefetch makes there and put their own in its place",
                f"pick a path under folders only you or root can write (e.g. under your home), "
                f"or give {above} the sticky bit (`chmod +t {above}`, as /tmp has)")
        if uid in (0, me):
            continue
        raise ConfigError(
            f"{what} would lie in {above}, which belongs to {user_name(uid)}, not to you "
            f"({user_name(me)}) or root: that user can rename the folder kvprefetch makes there "
            "and put their own in its place",
            "pick a path under folders only you or root own (e.g. under your home)")
    # the folders the kit makes take the default ACL of the deepest one there (as their
    # access ACL, the umask ignored): `setfacl -m d:u:nobody:rwx` on the folder above, its own
    # access ACL giving nobody no write, passed, and nobody could rename every folder of the
    # new work directory (issue 41, the forty-third hostile pass)
    deepest = next((p for p in (real, *real.parents) if os.path.isdir(p)), None)
    if deepest is not None and _acl_lets_others_write(
            deepest, os.stat(deepest).st_uid, groups=False, trusted=(0, me),
            xattr="system.posix_acl_default"):
        raise ConfigError(
            f"{what} would lie below {deepest}, whose default ACL lets another user write "
            f"every folder made there (`getfacl {deepest}` shows who): that user could rename "
            "the folders kvprefetch makes and put their own in their place",
            f"pick a path under folders only you or root can write (e.g. under your home), or "
            f"take that user's default entry off the ACL (`setfacl -d -x u:USER {deepest}`)")


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


def links_on_the_way(path: Path, limit: int = 40) -> list[tuple[Path, int]]:
    """Each symlink the kernel meets resolving ``path`` (as typed, from the working folder),
    with its owner's uid, in order: the named path's parts, then each link's target's, a
    ``..`` taken after the link before it (as the kernel does). Stops at the first part not
    there, and after ``limit`` links (a loop)."""
    # an absolute path asks nothing of the working folder: one deleted after the shell entered
    # it (os.getcwd() raising) refused every command naming its --workdir or campaign in full
    # (issue 41, the thirty-eighth hostile pass), as none did before this check
    whole = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    todo = list(Path(whole).parts[1:])
    here = Path("/")
    found: list[tuple[Path, int]] = []
    while todo and len(found) < limit:
        name = todo.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            here = here.parent
            continue
        try:
            st = os.lstat(here / name)
            target = os.readlink(here / name) if os.path.islink(here / name) else None
        except OSError:
            break
        if target is None:
            here = here / name
            continue
        found.append((here / name, st.st_uid))
        todo = list(Path(target).parts[1:] if target.startswith("/") else Path(target).parts) \
            + todo
        if target.startswith("/"):
            here = Path("/")
    return found


def refuse_foreign_link(path: Path, what: str) -> None:
    """Raise a ConfigError where a symlink on the way to ``path`` (the path itself, a folder
    above it, or a part of a link's target) belongs to another user, root aside: the command
    line follows the links of a path the user names (``--workdir``, a campaign), and another
    user's link in a shared sticky folder (``ln -s ~/empty /tmp/work`` before ``fetch --workdir
    /tmp/work``) chose for them which of their folders the kit took, and can lead the next
    command (a ``clean``, a ``submit``) to another of them (issue 41, the thirty-seventh hostile
    pass: a ``slurm plan`` and a ``fetch`` wrote into the empty folder ``nobody``'s link named,
    where the kernel lets root follow it; a link higher up the path, which it left open, after
    it)."""
    me = os.geteuid()
    for link, uid in links_on_the_way(path):
        if uid in (me, 0):
            continue
        raise ConfigError(
            f"{what}: {link} is a symlink that belongs to {user_name(uid)}, not to you "
            f"({user_name(me)}): that user chose the folder it leads to, and can change it between "
            "two commands",
            f"name the folder itself (`realpath {path}` shows where the path leads now), or a "
            "path in a folder only you can write")


def refuse_foreign_temp(folder: Path, what: str) -> None:
    """Raise a ConfigError where another user can rename an entry of the system temp folder
    ``folder`` (TMPDIR), in which the kit makes its private folders (``ownership.private_dir``):
    a link of another user's on the way, a folder above it that another user (not root) owns,
    the folder itself another user's, or it or a folder above it one others may write without
    the sticky bit. A private folder is 0700, but its name is the parent's entry (and the
    folder's own name its parent's): with ``TMPDIR`` a folder ``nobody`` owns
    (0777 or 1777), ``nobody`` renamed apply's private folder away once ``git apply --check``
    had started and put a link in its place, and the next ``git apply``, started in the folder
    by path, patched a tree outside the work directory that the link led to (issue 41, the
    thirty-ninth hostile pass). ``/tmp`` (root's, sticky) passes."""
    refuse_foreign_link(folder, what)
    _refuse_foreign_above(folder, what)
    me = os.geteuid()
    try:
        st = os.stat(folder)
    except OSError:
        return  # tempfile made sure it is there; a folder gone meanwhile fails where it is used
    if st.st_uid not in (0, me):
        raise ConfigError(
            f"{what} belongs to {user_name(st.st_uid)}, not to you ({user_name(me)}) or root: that "
            "user can rename the private folders kvprefetch makes there (where git apply and "
            "the compilers write) and put their own or a link in their place",
            "set TMPDIR to a folder of your own (e.g. `mkdir -m 700 ~/tmp; export "
            "TMPDIR=~/tmp`), or unset it to use /tmp, then rerun")
    if _others_may_write(st, folder):
        raise ConfigError(
            f"{what} can be written by others and has no sticky bit (mode "
            f"{st.st_mode & 0o7777:o}{_acl_note(folder)}): any of them can rename the private "
            "folders kvprefetch makes there and put their own or a link in their place",
            "set TMPDIR to a folder of your own (e.g. `mkdir -m 700 ~/tmp; export "
            "TMPDIR=~/tmp`), or unset it to use /tmp, then rerun")
    # a folder above it that others may write without the sticky bit lets any of them rename
    # the system temp folder itself (or a folder on its way) and put their own in its place,
    # whoever owns it: with TMPDIR=/var/tmp/shared/mine (mine root's and 0700, shared root's
    # and 0777), nobody read the probe's folder from nvcc's command line, renamed `mine` away,
    # made their own with a link of that name to a folder of root's, and nvcc wrote its
    # tmpxft_* files there (issue 41, the fortieth hostile pass: owners alone were looked at
    # above the folder, its mode only at the folder itself). A link of root's or the user's on
    # the way is a name in its folder as well (TMPDIR=/var/tmp/shared/link: renamed away, and
    # another user's link put in its place), so the folders holding such links count too.
    above_all = list(Path(os.path.realpath(folder)).parents)
    for link, _uid in links_on_the_way(folder):
        held = Path(os.path.realpath(link.parent))
        above_all += [held, *held.parents]
    for above in dict.fromkeys(above_all):
        try:
            st = os.stat(above)
        except OSError:
            continue
        mode = st.st_mode
        if _others_may_write(st, above):
            raise ConfigError(
                f"{what}: {above}, a folder on its way, can be written by others and has no "
                f"sticky bit (mode {mode & 0o7777:o}{_acl_note(above)}): any of them can rename "
                "the folder or link of the way there and put their own or a link in its place, "
                "and with it the private folders kvprefetch makes (where git apply and the "
                "compilers write)",
                "set TMPDIR to a folder of your own under folders only you or root can write "
                "(e.g. `mkdir -m 700 ~/tmp; export TMPDIR=~/tmp`), or unset it to use /tmp, "
                "then rerun")


def _others_may_write(st: os.stat_result, folder: Path) -> bool:
    """Whether users other than the folder's owner may rename its entries: it is writable by
    others, or by a group other than its owner's private one, and has no sticky bit. A user's
    private group (named as the user, with no other member) is the user: under ``umask 002``
    (the default of RHEL and Fedora for such users) ``mkdir -p ~/work/tmp`` makes each folder
    0775, and ``TMPDIR`` there was refused as "can be written by others" (issue 41, the
    forty-first hostile pass: a regression of the fortieth, which looked at the folders above
    too)."""
    import grp
    import pwd

    if st.st_mode & 0o1000 or not st.st_mode & 0o022:
        return False
    if st.st_mode & 0o002 or _acl_lets_others_write(folder, st.st_uid):
        return True
    try:
        owner = pwd.getpwuid(st.st_uid)
        group = grp.getgrgid(st.st_gid)
    except KeyError:
        return True
    # a user whose primary group it is belongs to it unlisted in its members
    return not (owner.pw_gid == st.st_gid and group.gr_name == owner.pw_name
                and set(group.gr_mem) <= {owner.pw_name}
                and all(p.pw_gid != st.st_gid or p.pw_uid == st.st_uid for p in pwd.getpwall()))


def _acl_lets_others_write(folder: Path, owner: int, *, groups: bool = True,
                           trusted: tuple[int, ...] = (),
                           xattr: str = "system.posix_acl_access") -> bool:
    """Whether ``folder``'s access ACL grants write to a named user other than its owner (and
    ``trusted``), or (``groups``) to a named group, past its mask: with an ACL, the mode's
    group bits are the mask, and a folder of root's (0775, group root, root's private group)
    with ``u:nobody:rwx`` passed as written by root's private group alone, where nobody could
    rename the private folders made there (issue 41, the forty-second hostile pass). An ACL
    that cannot be read is taken as none (no ACL support: the mode says all). ``xattr``: the
    default ACL, that the folders made in ``folder`` take as theirs."""
    import struct

    try:
        raw = os.getxattr(folder, xattr)
    except OSError:
        return False
    entries = [struct.unpack_from("<HHI", raw, i) for i in range(4, len(raw) - 7, 8)]
    mask = next((perm for tag, perm, _ in entries if tag == 0x10), 0o7)
    return any(perm & mask & 0o2
               and ((groups and tag == 0x08)
                    or (tag == 0x02 and uid != owner and uid not in trusted))
               for tag, perm, uid in entries)


def _acl_note(folder: Path) -> str:
    """``", and an ACL (getfacl FOLDER)"`` where ``folder`` has an access ACL, for a message
    whose mode alone (0775, a private group) would not say who else may write."""
    try:
        os.getxattr(folder, "system.posix_acl_access")
    except OSError:
        return ""
    return f", and an ACL: `getfacl {folder}` shows who may write it"


def refuse_foreign_chosen(folder: Path, what: str, fix: str) -> None:
    """Raise a ConfigError (with ``fix``) where another user chose ``folder``, a folder a
    library or a child writes by path, named by a variable of the user's environment (a cache,
    a config folder): a link of another user's on the way, a folder above it of theirs, or the
    folder itself theirs. The rule of ``TMPDIR`` (``refuse_foreign_temp``) for the other
    folders the kit's own process and its children write in: ``XDG_CACHE_HOME`` through
    ``nobody``'s link had matplotlib's font cache and uv's cache written in the folder the link
    chose (issue 41, the fortieth hostile pass)."""
    try:
        refuse_foreign_link(folder, what)
        _refuse_foreign_above(folder, what)
    except ConfigError as exc:
        raise ConfigError(exc.cause, fix) from None
    me = os.geteuid()
    try:
        uid = os.stat(folder).st_uid
    except OSError:
        return  # not there: made by this user
    if uid not in (0, me):
        raise ConfigError(f"{what} belongs to {user_name(uid)}, not to you ({user_name(me)}) or "
                          "root: that user can replace what is written and read back there", fix)


def refuse_foreign_folders(folders: Iterable[tuple[str, Path]], environ: Mapping[str, str],
                           whose: str, also: str = "") -> None:
    """``refuse_foreign_chosen`` for each (variable, folder) that a library writes by path,
    named "``whose`` FOLDER (from VAR=value)", the fix "set VAR to a folder of your own (or
    unset it)``also``, then rerun": matplotlib's, vLLM's and the GPU's folders."""
    for var, folder in folders:
        refuse_foreign_chosen(folder, f"{whose} {folder} (from {var}={environ.get(var, '')})",
                              f"set {var} to a folder of your own (or unset it){also}, then "
                              "rerun")


def absolute_folder_vars(names: Iterable[str], environ: MutableMapping[str, str]) -> None:
    """Each of ``names`` set to a relative folder in ``environ`` named absolute, from the
    current folder, where the user meant it: a library that reads it from another folder
    (matplotlib imported in `/`, ``bench ncu``'s child run there) made it below `/` while the
    check looked at the user's folder (issue 41, the forty-first hostile pass)."""
    for var in names:
        value = environ.get(var)
        if value and not os.path.isabs(value):
            environ[var] = os.path.abspath(value)
