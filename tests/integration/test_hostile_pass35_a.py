"""Issue 41, the thirty-fifth hostile pass (tester a: file systems, mount options and other
users). Each test fails without its fix (checked by reverting ``src`` and running it):

- **Another user's folder taken as the work directory or the campaign.** In a sticky shared
  folder (``/tmp``) another user made the empty folder first (``mkdir /tmp/st/work; chmod 777``,
  as ``nobody``), and ``fetch --workdir /tmp/st/work`` and ``slurm plan --stand-in /tmp/st/camp``
  (as root) took it silently: every tree, record and job script then lay in a folder that user
  owns and can rename entries of (no sticky bit on it), so the job scripts and environments the
  kit runs later were theirs to replace. A new work directory or campaign in an existing folder
  another user owns is now refused before anything is written (``workspace/foreign.py``).
- **A pristine header that is there but not readable** (a work directory another user fetched:
  the sdist's ``attention_kernels.cuh`` is mode 0600) made ``diff-upstream`` and
  ``export-header`` say "no pristine v0.10.2 ... / run `kvprefetch fetch` first", which, as this
  user, fails on the work directory's lock. The message now names the unreadable file and the
  owner's fix.
- **A file that is itself not writable** (``/dev/null`` of mode 0644, seen on this machine as a
  user not root) was told "make /dev writable for this user", which does not fix it: the fix now
  names the file (its mode, or an immutable attribute).

What held (no test needed): the README flow on tmpfs mounted ``nosymfollow``, ``noexec``,
``nodev,nosuid``, ``ro``, small ``size=``/``nr_inodes=``; ``trees/``, ``state/``, ``pristine/``
as mount points of their own; the flow as ``nobody`` on a work directory root made."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kvprefetch.errors import PatchError
from kvprefetch.oserrors import describe
from kvprefetch.sources.patching import pristine_text
from kvprefetch.workspace.workdir import Workdir
from tests.integration.helpers import kvprefetch_cli
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make another "
                                "user's folder (chown) and to take another user's rights")


@needs_root
def test_a_folder_another_user_made_is_not_taken_as_work_directory_or_campaign(
        tmp_path: Path, vllm_sdist: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    planted = {}
    for name in ("work", "camp"):
        d = shared / name
        d.mkdir()
        d.chmod(0o777)
        os.chown(d, NOBODY, NOBODY)  # made first by another user
        planted[name] = d
    res = kvprefetch_cli("fetch", "--workdir", str(planted["work"]), "--source", str(vllm_sdist))
    assert res.returncode != 0, res.output
    assert "belongs to" in res.output and "Traceback" not in res.output, res.output
    assert list(planted["work"].iterdir()) == []
    res = kvprefetch_cli("slurm", "plan", "--stand-in", str(planted["camp"]))
    assert res.returncode != 0, res.output
    assert "belongs to" in res.output and "Traceback" not in res.output, res.output
    assert list(planted["camp"].iterdir()) == []
    # the user's own empty folder is still taken
    mine = shared / "mine"
    mine.mkdir()
    res = kvprefetch_cli("slurm", "plan", "--stand-in", str(mine))
    assert res.returncode == 0, res.output


@needs_root
def test_an_unreadable_pristine_header_is_named_not_sent_to_fetch(
        fetched_workdir: Path) -> None:
    # as another user (the effective uid only, restored after): the work directory's files
    # are root's and not readable to them
    os.seteuid(NOBODY)
    try:
        with pytest.raises(PatchError) as err:
            pristine_text(Workdir(fetched_workdir))
    finally:
        os.seteuid(0)
    assert "cannot be read by this user" in err.value.cause, err.value.cause
    assert "`kvprefetch fetch`" not in (err.value.fix or ""), err.value.fix


def test_a_file_not_writable_itself_is_named_not_its_folder(tmp_path: Path) -> None:
    if shutil.which("chattr") is None:
        pytest.skip("no chattr")
    f = tmp_path / "null"
    f.write_text("")
    if subprocess.run(["chattr", "+i", str(f)], capture_output=True, check=False).returncode:
        pytest.skip("this file system or user cannot set the immutable attribute")
    try:
        with pytest.raises(PermissionError) as err:
            f.open("w").close()
        _cause, fix = describe(err.value)  # while the file is still immutable
    finally:
        subprocess.run(["chattr", "-i", str(f)], check=False)
    assert err.value.errno in (errno.EACCES, errno.EPERM)
    assert f"{f} itself is not writable" in fix, fix
    assert f"make {tmp_path} writable" not in fix, fix
