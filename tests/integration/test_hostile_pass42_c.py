"""Issue 41, the forty-second hostile pass (tester c): the newest checks as an attacker.

- ``foreign._others_may_write`` (``TMPDIR``'s rule: a folder others may write without the
  sticky bit, a group other than the owner's private one included) read the mode alone. With a
  POSIX ACL the mode's group bits are the ACL's mask: a folder of the user's (0775, their
  private group) with ``setfacl -m u:nobody:rwx`` passed as written by the private group only,
  where ``nobody`` could rename the private folders made there and put a link in their place
  (the thirty-ninth pass's way outside). A folder of a group shared with another user was
  refused; the same grant by an ACL was not. The ACL is read now.
- A user whose *primary* group is the owner's private group is a member of it without being
  listed in its members (``gr_mem``): such a group is no longer taken as private.
"""

from __future__ import annotations

import grp
import os
import pwd
import struct
from pathlib import Path

import pytest

from tests.integration.helpers import kvprefetch_cli_split
from tests.integration.test_reliability import _env, outside, refused

__all__ = ["outside"]  # the fixture: nothing outside may change

NOBODY = 65534


def _private_group() -> bool:
    me = pwd.getpwuid(os.geteuid())
    group = grp.getgrgid(me.pw_gid)
    return group.gr_name == me.pw_name and set(group.gr_mem) <= {me.pw_name}


def _grant(folder: Path, uid: int) -> bool:
    """``setfacl -m u:UID:rwx folder`` (no setfacl needed), or False where the file system has
    no ACLs."""
    u = 0xFFFFFFFF
    entries = [(0x01, 7, u), (0x02, 7, uid), (0x04, 5, u), (0x10, 7, u), (0x20, 5, u)]
    raw = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)
    try:
        os.setxattr(folder, "system.posix_acl_access", raw)
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _private_group(), reason="needs a user whose group is their own")
@pytest.mark.parametrize("where", ["tmpdir", "above"])
def test_a_tmpdir_another_user_may_write_by_an_acl_is_refused(
        tmp_path: Path, outside: Path, where: str) -> None:
    old = os.umask(0o002)
    try:
        tmp = tmp_path / "work" / "tmp"
        tmp.mkdir(parents=True)
    finally:
        os.umask(old)
    env = _env() | {"TMPDIR": str(tmp)}
    args = ("doctor", "--mode", "kernels-only", "--workdir", str(tmp_path / "wd"))
    # the private group's folders, no ACL: taken (pass 41 b's rule)
    res = kvprefetch_cli_split(*args, env=env, timeout=600)
    assert "can be written by others" not in res.stderr + res.stdout, res.stderr
    granted = tmp if where == "tmpdir" else tmp.parent
    if not _grant(granted, NOBODY):
        pytest.skip("no POSIX ACLs on this file system")
    assert os.stat(granted).st_mode & 0o7777 == 0o775  # the mode alone says: the private group
    res = kvprefetch_cli_split(*args, env=env, timeout=600)
    # above TMPDIR, the new-folder rule (the lead's, for a work directory or campaign below
    # such a folder) may speak first: either names the ACL
    refused(res, 2, "no sticky bit", f"getfacl {granted}")
    assert ("can be written by others" in res.stderr
            or "another user may write by an ACL" in res.stderr), res.stderr


@pytest.mark.skipif(not _private_group(), reason="needs a user whose group is their own")
def test_a_group_that_is_another_users_primary_group_is_not_private(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvprefetch.errors import ConfigError
    from kvprefetch.workspace import foreign

    old = os.umask(0o002)
    try:
        tmp = tmp_path / "tmp"
        tmp.mkdir()
    finally:
        os.umask(old)
    foreign.refuse_foreign_temp(tmp, "TMPDIR")  # the private group's: taken
    me = pwd.getpwuid(os.geteuid())
    other = pwd.struct_passwd(("p42c-other", "x", NOBODY - 1, me.pw_gid, "", "/", "/bin/sh"))
    real = pwd.getpwall
    monkeypatch.setattr(pwd, "getpwall", lambda: [*real(), other])
    with pytest.raises(ConfigError, match="can be written by others"):
        foreign.refuse_foreign_temp(tmp, "TMPDIR")
