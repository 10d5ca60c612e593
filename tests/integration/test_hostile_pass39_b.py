"""Issue 41, the thirty-ninth hostile pass (tester b: writers and readers under swaps as
another user, stops, TMPDIR as an attacker's). Each test fails without its fix (checked by
reverting ``src`` and running it):

- **A TMPDIR another user can rename entries of let them redirect ``git apply`` outside.**
  The kit's private folders (``ownership.private_dir``: 0700, a random name) were made in
  whatever ``TMPDIR`` named. With ``TMPDIR`` a folder ``nobody`` owns (0777, and 1777 alike:
  the owner of a sticky folder may rename its entries), ``nobody``, watching ``/proc`` for
  ``git apply --check``, renamed apply's private folder away and put a link in its place to a
  folder of theirs whose ``t`` led to a root-owned vLLM tree outside the work directory: the
  next ``git apply``, started in ``<private>/t`` by path, patched three files of that tree (won
  the first try by hand). The system temp folder is now refused (``foreign.refuse_foreign_temp``,
  called by ``private_dir``) when another user's link is on the way, a folder above it or the
  folder itself belongs to another user, or others may write it without the sticky bit.
- **The private folder's removal chmod'ed the system temp folder.** With the private folder
  replaced by a link, ``shutil.rmtree`` reported the link at the top, and the error handler
  made the folder above it (TMPDIR itself: ``nobody``'s 0777 folder) 0700. The handler now
  changes nothing for an error at the top.

Nothing else is mocked: the CLI runs for real on folders made here."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

import pytest

from tests.integration.helpers import kvprefetch_cli_split, tree_bytes
from tests.integration.test_reliability import _env

_NOBODY = pwd.getpwnam("nobody").pw_uid
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown to nobody)")


def _apply(wd: Path, temp: Path) -> object:
    env = _env()
    env["TMPDIR"] = str(temp)
    return kvprefetch_cli_split("apply", "--workdir", str(wd), "--tree", "patched",
                                "--variant", "prefetch", env=env, timeout=300)


@needs_root
@pytest.mark.parametrize("how", ["nobody-0777", "nobody-1777", "root-0777", "nobody-link"])
def test_a_tmpdir_another_user_can_rename_entries_of_is_refused(
        fetched_workdir: Path, tmp_path: Path, how: str) -> None:
    real = tmp_path / "temp"
    real.mkdir()
    temp = real
    if how.startswith("nobody"):
        os.chown(real, _NOBODY, -1)
    os.chmod(real, 0o1777 if how == "nobody-1777" else 0o777)
    if how == "nobody-link":
        os.chown(real, 0, -1)
        os.chmod(real, 0o700)
        temp = tmp_path / "link"
        temp.symlink_to(real)
        os.lchown(temp, _NOBODY, -1)
    mode = stat.S_IMODE(os.stat(real).st_mode)
    tree = fetched_workdir / "trees" / "patched"
    before = tree_bytes(tree)
    res = _apply(fetched_workdir, temp)
    text = res.stdout + res.stderr  # type: ignore[attr-defined]
    assert res.returncode == 2, text  # type: ignore[attr-defined]
    assert "Traceback" not in text and "To fix:" in text and "TMPDIR" in text, text
    assert os.listdir(real) == []  # no private folder made there
    assert stat.S_IMODE(os.stat(real).st_mode) == mode
    assert tree_bytes(tree) == before


@needs_root
def test_a_tmpdir_of_ones_own_still_works(fetched_workdir: Path, tmp_path: Path) -> None:
    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    res = _apply(fetched_workdir, own)
    assert res.returncode == 0, res.stderr  # type: ignore[attr-defined]
    assert os.listdir(own) == []


def test_removing_a_private_folder_replaced_by_a_link_changes_nothing_above(
        tmp_path: Path) -> None:
    from kvprefetch.workspace import ownership

    temp = tmp_path / "temp"
    temp.mkdir(mode=0o755)
    os.chmod(temp, 0o755)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "kept").write_text("kept\n")
    link = temp / "kvprefetch-apply-x"
    link.symlink_to(elsewhere)
    ownership._remove_private(link)
    assert stat.S_IMODE(os.stat(temp).st_mode) == 0o755
    assert (elsewhere / "kept").read_text() == "kept\n"


@needs_root
def test_a_full_tmpdir_during_the_unpack_is_named_not_the_work_directory(
        tmp_path: Path, vllm_sdist: Path) -> None:
    """tarfile writes the sdist's members through descriptors, so its ENOSPC named no file and
    the message blamed the work directory (``wt/: No space left on device``, "free space on that
    file system (`df -h wt`)"), which has room; the system temp folder is the full one."""
    import subprocess

    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=1777", "tmpfs", str(small)],
                   check=True)
    try:
        env = _env()
        env["TMPDIR"] = str(small)
        wd = tmp_path / "wd"
        res = kvprefetch_cli_split("fetch", "--workdir", str(wd), "--source", str(vllm_sdist),
                                   "--only", "x", env=env, timeout=300)
        text = res.stderr
        assert res.returncode == 3, text
        assert "Traceback" not in text and "To fix:" in text, text
        assert f"free space in the system temp folder {small}" in text, text
        assert os.listdir(small) == []
    finally:
        subprocess.run(["umount", str(small)], check=False)
