"""Issue 41, the fortieth hostile pass (tester a: the README's flow on a shared machine with
another user at work; pass 39's new code as an attacker). Each test fails without its fix
(checked by reverting ``src`` and running it):

- **A TMPDIR of root's in a folder others may write without the sticky bit let them redirect
  nvcc outside.** ``foreign.refuse_foreign_temp`` looked at the owners of the folders above the
  system temp folder, and at the mode of the folder itself only. With
  ``TMPDIR=/var/tmp/shared/mine`` (``mine`` root's, 0700; ``shared`` root's, 0777, a careless
  shared folder), ``nobody`` read the doctor probe's private folder from nvcc's command line
  (``/proc/<pid>/cmdline``), renamed ``mine`` away, made their own ``mine`` holding a link of
  the private folder's name to a folder of root's, and nvcc, run by ``kvprefetch doctor``, wrote
  its ``tmpxft_*_probe.cpp4.ii`` there (an inotify watch on that folder saw it made, written
  and deleted; won the first try by hand). A folder above the system temp folder that others
  may write without the sticky bit is now refused as the folder itself is, and so is one
  holding a link of root's on the way (``TMPDIR=/var/tmp/shared/link``: the link renamed away
  and another put in its place).

Nothing else is mocked: the CLI runs for real on folders made here."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.integration.helpers import kvprefetch_cli_split, tree_bytes
from tests.integration.test_reliability import _env

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a root folder of 0777)")


@needs_root
@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_tmpdir_in_a_folder_others_can_write_without_the_sticky_bit_is_refused(
        fetched_workdir: Path, tmp_path: Path, mode: int) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)  # root's, writable by others, no sticky bit
    # a group of other users (root's own private group is root: the forty-first pass)
    os.chown(shared, -1, 65534)
    mine = shared / "mine"
    mine.mkdir(mode=0o700)  # root's own, private: passed before
    tree = fetched_workdir / "trees" / "patched"
    before = tree_bytes(tree)
    env = _env()
    env["TMPDIR"] = str(mine)
    res = kvprefetch_cli_split("apply", "--workdir", str(fetched_workdir), "--tree", "patched",
                               "--variant", "prefetch", env=env, timeout=300)
    text = res.stdout + res.stderr
    assert res.returncode == 2, text
    assert "Traceback" not in text and "To fix:" in text, text
    assert str(shared) in text and "no sticky bit" in text, text  # the lead's o+w rule or this
    assert os.listdir(mine) == []  # no private folder made there
    assert stat.S_IMODE(os.stat(shared).st_mode) == mode
    assert tree_bytes(tree) == before


@needs_root
def test_a_tmpdir_reached_through_a_link_in_a_folder_others_can_write_is_refused(
        fetched_workdir: Path, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)  # root's, private, in a folder only root writes
    (shared / "link").symlink_to(mine)  # root's link, but a name others may rename
    tree = fetched_workdir / "trees" / "patched"
    before = tree_bytes(tree)
    env = _env()
    env["TMPDIR"] = str(shared / "link")
    res = kvprefetch_cli_split("apply", "--workdir", str(fetched_workdir), "--tree", "patched",
                               "--variant", "prefetch", env=env, timeout=300)
    text = res.stdout + res.stderr
    assert res.returncode == 2, text
    assert "Traceback" not in text and "To fix:" in text, text
    assert f"{shared}, a folder on its way" in text, text
    assert os.listdir(mine) == []
    assert tree_bytes(tree) == before


@needs_root
def test_a_tmpdir_in_a_sticky_folder_others_can_write_still_works(
        fetched_workdir: Path, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # as /var/tmp and /dev/shm: only the entry's owner renames it
    mine = shared / "mine"
    mine.mkdir(mode=0o700)
    env = _env()
    env["TMPDIR"] = str(mine)
    res = kvprefetch_cli_split("apply", "--workdir", str(fetched_workdir), "--tree", "patched",
                               "--variant", "prefetch", env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert os.listdir(mine) == []
