"""Items of the thirty-sixth and thirty-seventh hostile passes' left-open lists, closed by the
lead (issue 41). Each test failed before its fix:

- ``export-header -o -`` wrote a file named ``-`` where a user reads standard output;
- ``report --readme F --check`` on a file holding no block said "every report block matches
  its JSON": a pass for a CI pointed at the wrong file;
- a work directory whose path holds a newline was refused by the build only after it made its
  environment (build.ninja cannot carry one); the preflight names it now;
- ``doctor`` on a work directory mounted ``nosymfollow`` passed its disk check, and the build
  named the mount only once its first environment could not run.

Nothing is mocked: the CLI runs as a user runs it; the ``nosymfollow`` case mounts a real tmpfs
(root only, skipped elsewhere with its reason)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_reliability import cli, refused


def test_export_header_dash_is_not_a_file_named_dash(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "export-header", "-o", "-"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "not read as standard output" in res.stderr and "./-" in res.stderr, res.stderr
    assert not (tmp_path / "-").exists()


def test_readme_check_on_a_file_with_no_block_fails(tmp_path: Path) -> None:
    target = tmp_path / "NOTES.md"
    target.write_text("# notes\n\nno report block here\n")
    res = cli("report", "--readme", str(target), "--check", timeout=60)
    refused(res, 7, "holds no report, timings or commands block", "point --readme at")
    res = cli("report", "--readme", str(target), timeout=60)
    assert res.returncode == 0 and "nothing to regenerate" in res.stderr, res.stderr
    assert target.read_text() == "# notes\n\nno report block here\n"


def test_doctor_names_a_nosymfollow_work_directory(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (a tmpfs mounted nosymfollow)")
    mnt = tmp_path / "nosymfollow"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1g,nosymfollow", "tmpfs", str(mnt)],
                      capture_output=True, check=False).returncode:
        pytest.skip("cannot mount a tmpfs with nosymfollow here (Linux 5.10 or later, root)")
    try:
        res = cli("doctor", "--mode", "kernels-only", "--workdir", str(mnt / "work"), "--json",
                  timeout=300)
        assert "Traceback" not in res.stderr, res.stderr
        disk = next(c for c in json.loads(res.stdout)["checks"] if c["name"] == "disk")
        assert disk["status"] == "fail", disk
        assert "nosymfollow" in disk["detail"] and "remount,symfollow" in disk["fix"], disk
        assert res.returncode != 0
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_build_refuses_a_newline_in_the_work_directory_before_making_an_env(
        fetched_workdir: Path, tmp_path: Path) -> None:
    wd = tmp_path / "a\nb"
    shutil.copytree(fetched_workdir, wd, symlinks=True)
    res = cli("build", "--yes", "--workdir", str(wd), "--mode", "kernels-only", "--trees",
              "baseline", "--head-sizes", "128", "--block-sizes", "16", "--kv-dtypes", "fp16",
              timeout=300)
    refused(res, 2, "holds a control character", "rename the folder")
    assert not (wd / "envs").exists() and not (wd / "build").exists()
