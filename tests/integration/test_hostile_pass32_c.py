"""Issue 41, the thirty-second hostile pass (tester c: stopping real commands mid-run, and
pass 31's new checks attacked). Each test fails without its fix (checked by reverting ``src``
and running it):

- **``slurm plan --python MNT/self/exe`` was planned, with ``MNT`` a bind mount of ``/proc``**
  (or a second ``mount -t proc``). Pass 31's ``values.check_python`` refused a ``--python``
  reached through ``/proc`` by its name or a link's folder, but a mount of the proc file system
  elsewhere has other names: ``MNT/self/exe`` is the kit's Python here and the job's own bash
  on the node, so every job ran ``bash -m kvprefetch`` ("Is a directory", no fix), as pass
  31 found for ``/proc/self/exe``. Now a folder on the way whose ``self`` names this process
  (``values._in_procfs``) is refused as ``/proc`` is. The test makes the mount for real, in a
  private mount namespace (``unshare -m``); it skips where that is not allowed.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass31_b import _env
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


@pytest.mark.parametrize("how", ["bind", "proc"])
@pytest.mark.parametrize("name", ["self/exe", "thread-self/exe"])
def test_a_python_through_a_mount_of_proc_is_refused_at_plan(tmp_path: Path, how: str,
                                                              name: str) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("no unshare here")
    mnt, camp = tmp_path / "mnt", tmp_path / "camp"
    mnt.mkdir()
    mount = f"mount --bind /proc {mnt}" if how == "bind" else f"mount -t proc proc {mnt}"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", mount], capture_output=True,
                           check=False)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount /proc in a private namespace here: {probe.stderr!r}")
    cmd = (f"{mount} && exec {sys.executable} -m kvprefetch slurm plan {camp} --stand-in "
           f"--batch 1 --python {mnt}/{name}")
    res = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", cmd],
                         env=_env(tmp_path), capture_output=True, text=True, timeout=120,
                         check=False, cwd=tmp_path)
    text = res.stdout + res.stderr
    # without the fix: exit 0, a campaign whose every job runs its own bash as python
    assert res.returncode == 2, text
    assert "through /proc" in text and "To fix" in text and "Traceback" not in text, text
    assert not camp.exists()
