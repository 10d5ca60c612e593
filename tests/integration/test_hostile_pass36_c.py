"""Issue 41, the thirty-sixth hostile pass (tester c: file systems, names, streams and the CLI's
edges, on loop-mounted ext4 images). Each test fails without its fix (checked by reverting
``src`` and running it):

- **An immutable or append-only mark** (``chattr +i``/``+a``, which ext4, xfs and btrfs keep,
  and root cannot write through): ``apply`` over a tree file marked immutable said "make
  trees/.patched.apply/new/csrc/attention writable for this user", a folder that was writable;
  an append-only ``.kvprefetch-owned.json``, an immutable ``state/`` or a marked file in a tree
  being removed said "<bare name>: Operation not permitted / make . writable", naming neither
  the file nor the cause, and after ``clean`` had moved the tree to
  ``.patched.removing.tmp-PID`` the user could not even find the file by its old name. The
  fix names the marked path and ``chattr -i``/``-a`` (``oserrors._marked``), and the folder
  descriptor's acts name whole paths (``confine``: the rename of a record, a removal, a
  rename in place; ``runner``: a log).
- **A work directory on a file system mounted ``nosymfollow``**: a venv's ``bin/python`` is a
  link, which such a mount never follows, so ``build`` said "envs/patched has no bin/python /
  recreate it: rerun with --force", and every rerun made the environment and failed the same
  way. The cause (the mount option) and its fix are named now (``machine/envs.Env._no_python``).

What held (no test needed): the README flow (fetch, apply, diff-upstream --check,
build --dry-run, doctor, clean, slurm plan, report --out) on ext4 images mounted plain,
``noexec,nosymfollow``, ``ro``, with 80 inodes, with ``TMPDIR`` on another image (renames
across devices), ``trees/`` bind-mounted from another image (``fetch --force``'s move to
``backup/``: EXDEV named with ``findmnt``); work directories named with a space, a leading
``-``, ``\\xff\\xfe``, a newline, ``~``, ``$HOME``, ``*``, 255 bytes, 3,779 and 4,051 bytes
deep; ``LC_ALL`` C, POSIX, C.UTF-8 and ``xx_XX.UTF-8`` with non-ASCII and non-UTF-8 names;
stdout and stderr on ``/dev/full``, closed, into a pipe closed after one byte; stdin closed
or ``/dev/zero``; ``COLUMNS`` 0 and 100000, ``TERM=dumb``, ``NO_COLOR``."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.helpers import kvprefetch_cli
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


def _chattr(flag: str, path: Path) -> bool:
    if shutil.which("chattr") is None:
        return False
    return subprocess.run(["chattr", flag, str(path)], capture_output=True,
                          check=False).returncode == 0


def _marked_or_skip(flag: str, path: Path) -> None:
    if os.geteuid() != 0 or not _chattr(flag, path):
        pytest.skip("needs root and a file system that keeps chattr's marks")


def _fix(output: str) -> str:
    return output[output.rindex("To fix:"):]


def test_a_file_or_folder_marked_immutable_or_append_only_is_named_with_chattr(
        fetched_workdir: Path) -> None:
    wd = fetched_workdir
    target = wd / "trees" / "patched" / "csrc" / "attention" / "attention_kernels.cuh"
    before = target.read_bytes()
    _marked_or_skip("+i", target)
    try:
        res = kvprefetch_cli("apply", "--workdir", str(wd))
    finally:
        _chattr("-i", target)
    assert res.returncode == 4, res.output
    assert "Traceback" not in res.output
    fix = _fix(res.output)
    assert f"{target} is marked immutable" in fix and f"chattr -i {target}" in fix, fix
    assert ".patched.apply/new" not in fix, fix  # was: make the stage's folder writable
    assert target.read_bytes() == before

    record = wd / ".kvprefetch-owned.json"
    _marked_or_skip("+a", record)
    try:
        res = kvprefetch_cli("apply", "--workdir", str(wd))
    finally:
        _chattr("-a", record)
    assert res.returncode == 4, res.output
    fix = _fix(res.output)
    assert f"{record} is marked append-only" in fix and f"chattr -a {record}" in fix, fix
    assert "make . writable" not in fix, fix

    state = wd / "state"
    _marked_or_skip("+i", state)
    try:
        res = kvprefetch_cli("clean", "--what", "trees", "--workdir", str(wd))
    finally:
        _chattr("-i", state)
    assert res.returncode == 2, res.output
    fix = _fix(res.output)
    assert f"{state} is marked immutable" in fix and f"chattr -i {state}" in fix, fix

    # a marked file inside a tree that clean has already moved aside: the fix names where it
    # is now, and following it lets the next clean finish
    assert kvprefetch_cli("clean", "--what", "trees", "--workdir", str(wd)).returncode == 0
    res = kvprefetch_cli("fetch", "--workdir", str(wd))
    assert res.returncode == 0, res.output
    marked = wd / "trees" / "baseline" / "setup.py"
    _marked_or_skip("+i", marked)
    try:
        res = kvprefetch_cli("clean", "--what", "trees", "--workdir", str(wd))
        assert res.returncode == 2, res.output
        fix = _fix(res.output)
        assert "is marked immutable" in fix and "make . writable" not in fix, fix
        now = Path(fix.split("`chattr -i ", 1)[1].split("`", 1)[0])
        assert now.name == "setup.py" and ".baseline.removing.tmp-" in now.parent.name, fix
        assert _chattr("-i", now)
    finally:
        for found in wd.glob("trees/*/setup.py"):
            _chattr("-i", found)
    res = kvprefetch_cli("clean", "--what", "trees", "--workdir", str(wd))
    assert res.returncode == 0, res.output
    assert not (wd / "trees" / "baseline").exists()


def test_a_build_on_a_nosymfollow_mount_names_the_mount_not_force(
        fetched_workdir: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("nvcc") is None:
        pytest.skip("needs root (a tmpfs mounted nosymfollow) and nvcc (a build's preflight)")
    mnt = tmp_path / "nosymfollow"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1g,nosymfollow", "tmpfs", str(mnt)],
                      capture_output=True, check=False).returncode:
        pytest.skip("cannot mount a tmpfs with nosymfollow here (Linux 5.10 or later, root)")
    try:
        wd = mnt / "work"
        shutil.copytree(fetched_workdir, wd, symlinks=True)
        assert kvprefetch_cli("apply", "--workdir", str(wd)).returncode == 0
        for _ in range(2):  # the rerun the old message asked for fails the same way
            res = kvprefetch_cli("build", "--yes", "--workdir", str(wd), "--mode",
                                 "kernels-only", "--trees", "patched", "--head-sizes", "128",
                                 "--block-sizes", "16", "--kv-dtypes", "fp16", "--force",
                                 timeout=300)
            # the preflight names the mount before an environment is made (doctor's disk
            # check, test_left_open_38); the env's own check (Env._no_python) stays behind it
            assert res.returncode == 2, res.output
            assert "Traceback" not in res.output
            assert "mounted nosymfollow" in res.output, res.output
            assert "remount,symfollow" in res.output, res.output
            assert "has no bin/python" not in res.output, res.output
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_copy_out_of_inodes_names_the_whole_path_of_what_it_made(
        vllm_sdist: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (a tmpfs with few inodes)")
    mnt = tmp_path / "few-inodes"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m,nr_inodes=400", "tmpfs",
                       str(mnt)], capture_output=True, check=False).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN)")
    try:
        wd = mnt / "work"
        res = kvprefetch_cli("fetch", "--workdir", str(wd), "--source", str(vllm_sdist))
        assert res.returncode == 3, res.output
        assert "Traceback" not in res.output
        line = next(ln for ln in res.output.splitlines() if ln.startswith("error:"))
        # was "config in <wd>/: No space left on device": a folder of the sdist, by its bare
        # name, as if it were in the work directory's top
        named = line.split("failed: ", 1)[1].split(": No space left", 1)[0]
        assert named.startswith(f"{wd}/"), line
        assert "df -i" in res.output, res.output
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
