"""Issue 41, the twenty-fifth hostile pass, tester a (the work directory's commands: two kit
processes at once, hard links, xattrs and ACLs, every git the kit runs). Each test fails
without its fix (checked by reverting ``src`` and running it):

- **A ``git`` planted in ``pristine/git/`` ran on every ``fetch``** (``sources.fetch._gitpython``).
  GitPython runs a bare ``git`` in the repository it reads, and Python's ``subprocess`` looks
  a relative PATH entry up in the child's folder: with an empty entry in ``PATH`` (``PATH=:$PATH``,
  what ``PATH=$EXTRA:$PATH`` gives with ``EXTRA`` unset), ``fetch`` of a work directory fetched
  from git ran ``<workdir>/pristine/git/git cat-file --batch-check`` (1 of 1 by hand; also
  ``fetch --repair``), the kit started in another folder. The seventh pass's rule for ``git
  apply`` (``runner.which``: a relative entry looked up from the kit's own folder, made
  absolute) now holds for GitPython too.
- **Folders came out world-writable under a default ACL** (``confine.DIR_MODE``,
  ``confine.make_dirs``). The kit adds world-write to the umask at start-up, but under a
  parent whose default ACL grants ``o::rwx`` the kernel sets the umask aside and takes the
  mode ``mkdir`` asks for, 0o777: ``trees/``, each tree, ``pristine/``, ``state/`` and
  ``.locks/`` were ``drwxrwxrwx`` after ``fetch`` and ``apply``, against the promise that the
  kit makes nothing world-writable (found by tester a, fixed by the lead). A folder copied
  into a tree now also drops the sticky bit and world-write (``safe_bits``), as files did.
"""

from __future__ import annotations

import os
import shutil
import stat
import struct
import subprocess
import sys
from pathlib import Path

from tests.integration.test_hostile_pass20_a import _env
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: nothing outside the test's folders changes


def _kv(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args],
                          env=env or _env(tmp_path), cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


def test_a_git_planted_in_the_pristine_clone_never_runs(
        tmp_path: Path, vllm_git_repo: tuple[Path, str]) -> None:
    repo, sha = vllm_git_repo
    wd = tmp_path / "work"
    made = _kv(tmp_path, "fetch", "--workdir", str(wd), "--source", str(repo),
               "--allow-commit", sha)
    assert made.returncode == 0, made.stdout + made.stderr
    assert (wd / "pristine" / "git" / ".git").is_dir()
    marker = tmp_path / "planted-git-ran"
    planted = wd / "pristine" / "git" / "git"
    real = shutil.which("git")
    assert real is not None
    planted.write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\nexec {real} \"$@\"\n")
    planted.chmod(0o755)
    env = _env(tmp_path)
    env["PATH"] = ":" + env["PATH"]  # an empty entry: the current folder, as a shell reads it
    home = tmp_path / "elsewhere"  # the kit started in a folder of the user's, not the work dir
    home.mkdir()
    for args in (("fetch",), ("fetch", "--repair")):
        res = _kv(tmp_path, *args, "--workdir", str(wd), env=env, cwd=home)
        assert "Traceback" not in res.stderr, res.stderr
        assert not marker.exists(), f"{args}: ran {marker.read_text()!r}"


def _default_acl_for_everyone(folder: Path) -> None:
    """``setfacl -d -m u::rwx,g::rwx,o::rwx folder``, written as the kernel's own xattr
    (setfacl is not installed here): version 2, then (tag, perm, id) for USER_OBJ, GROUP_OBJ
    and OTHER."""
    entries = b"".join(struct.pack("<HHI", tag, 7, 0xFFFFFFFF) for tag in (0x01, 0x04, 0x20))
    os.setxattr(folder, "system.posix_acl_default", struct.pack("<I", 2) + entries)


def test_nothing_is_world_writable_under_a_default_acl(tmp_path: Path,
                                                       vllm_sdist: Path) -> None:
    parent = tmp_path / "shared"
    parent.mkdir()
    _default_acl_for_everyone(parent)
    os.mkdir(parent / "probe", 0o777)  # the ACL holds here (else this test shows nothing)
    assert stat.S_IMODE((parent / "probe").stat().st_mode) & stat.S_IWOTH
    wd = parent / "work"
    for args in (("fetch", "--source", str(vllm_sdist)), ("apply",)):
        res = _kv(tmp_path, *args, "--workdir", str(wd))
        assert res.returncode == 0, res.stderr
    # a folder of pristine/ planted sticky and world-writable, then a new tree copied from it
    planted = wd / "pristine" / "sdist" / "csrc"
    os.chmod(planted, 0o1777)
    res = _kv(tmp_path, "fetch", "--source", str(vllm_sdist), "--only", "extra",
              "--workdir", str(wd))
    assert res.returncode == 0, res.stderr
    os.chmod(planted, 0o755)
    loose = []
    for top, folders, files in os.walk(wd):
        for name in folders + files:
            mode = os.lstat(os.path.join(top, name)).st_mode
            if not stat.S_ISLNK(mode) and mode & (stat.S_IWOTH | stat.S_ISVTX):
                loose.append(f"{os.path.join(top, name)} {oct(stat.S_IMODE(mode))}")
    assert not loose, loose[:20]
