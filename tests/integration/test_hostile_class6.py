"""Issue 41, class 6 ("smaller, same spirit") and the "every writer" rule: dry runs and
read-only commands write nothing; a killed ``clean`` leaves nothing that needs ``--force``;
tamper detection sees ``_version.py``, a nested ``build/``, a ``.so`` and a new symlink;
messages that sent the user the wrong way; and every file the kit writes goes through
``confine.write_file``. Each test failed on the code before its change (checked with
``PYTHONPATH`` at an export of that commit). docs/reliability.md lists them.

Like test_hostile.py, every case checks that a folder outside the work directory is
byte-identical afterwards (the autouse ``outside`` fixture of test_reliability.py)."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

from tests.integration.test_reliability import _remount, cli, outside, small_tmpfs

__all__ = ["outside", "small_tmpfs"]  # fixtures: the outside folder, a real tmpfs


def _snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` (root included) with its type, mode, mtime and content: a
    write, a rename, a new or removed entry, even a rewrite with the same bytes, all show."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in ["", *dirnames, *filenames]:
            p = Path(dirpath, name) if name else Path(dirpath)
            if not name and p != root and p.name in dirnames:
                continue
            st = os.lstat(p)
            key = p.relative_to(root).as_posix()
            if stat.S_ISREG(st.st_mode):
                what: object = hashlib.sha256(p.read_bytes()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                what = os.readlink(p)
            else:
                what = None
            out[key] = (stat.S_IFMT(st.st_mode), st.st_mode, st.st_mtime_ns, st.st_size, what)
    return out


def _changed(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


# --------------------------------------------------------------- 1. dry runs write nothing

READ_ONLY_COMMANDS = [
    ("fetch", "--dry-run", "--source", "sdist"),
    ("fetch", "--dry-run", "--source", "sdist", "--force", "--extra-tree", "x"),
    ("apply", "--dry-run"),
    ("build", "--dry-run", "--kernels-only", "--arch", "9.0a", "--head-sizes", "128"),
    ("clean", "--dry-run", "--what", "all", "--discard-edits"),
    ("diff-upstream",),
    ("diff-upstream", "--check"),
    ("doctor", "--kernels-only", "--arch", "9.0a"),
]


def test_dry_runs_and_read_only_commands_write_nothing(small_tmpfs: Path,
                                                       fetched_template: Path) -> None:
    """`build --dry-run` rewrote the ownership record and compiled doctor's nvcc probe in the
    work directory's tmp/; `doctor` and `diff-upstream --check` did the same, and
    `apply --dry-run` wrote its pid into the tree's lock. Each read-only command runs twice:
    on the work directory as it is (nothing may change, not even an mtime), then with the
    tmpfs remounted read-only (root ignores file modes, a read-only mount it cannot)."""
    _remount(small_tmpfs, "size=4g")  # a limit, not an allocation: doctor's disk check passes
    work = small_tmpfs / "work"
    shutil.copytree(fetched_template, work, symlinks=True)
    assert cli("apply", "--workdir", str(work)).returncode == 0
    before = _snapshot(work)
    for argv in READ_ONLY_COMMANDS:
        res = cli(argv[0], "--workdir", str(work), *argv[1:])
        assert res.returncode == 0, (argv, res.stderr)
        assert _changed(before, _snapshot(work)) == [], argv
    _remount(small_tmpfs, "ro")
    try:
        for argv in READ_ONLY_COMMANDS:
            res = cli(argv[0], "--workdir", str(work), *argv[1:])
            assert res.returncode == 0, (argv, res.stderr)
        # a new work directory is not even created by a dry run
        res = cli("fetch", "--workdir", str(small_tmpfs / "new"), "--dry-run", "--source", "sdist")
        assert res.returncode == 0, res.stderr
    finally:
        _remount(small_tmpfs, "rw")
    assert _changed(before, _snapshot(work)) == []
    assert not (small_tmpfs / "new").exists()
