"""Issue 41, the twenty-fourth hostile pass (tester c: every command, option, input and
environment value, for tracebacks, hangs, wrong messages and wrong writes). Each test fails
without its fix (checked by reverting ``src`` and running it):

- ``report --readme FILE`` regenerated each block of FILE on its own, however many there were:
  a 10 KB file repeating one ``<!-- report RUN seeds -->`` block 300 times kept it busy for
  minutes (about 0.2 s a block), and 20,000 ``<!-- timings T.json -->`` blocks (800 KB, under
  the 4 MiB the command reads) were rewritten into a 200 MB file in 600 MB of memory, a file
  the next ``report --readme`` refuses to read. A file asking for more than 100 blocks is now
  refused before any is read, and a regenerated file over 4 MiB is never written
  (``cli/report._check_markdown_size``).
- A system temp folder (``TMPDIR``) with a little room but not enough sent the user the wrong
  way twice. ``apply`` said "apply to W/trees/patched failed: No space left on device / To fix:
  free space on that file system (`df -h .`), or write to a larger one (the --workdir, -o/--out
  or campaign folder that named it)": the file that did not fit was in apply's scratch folder
  for ``git apply`` in ``TMPDIR``, and a write to a descriptor named no file. ``doctor``'s
  compile probe failed with nvcc's "No space left on device" in the same folder and said "use
  a CUDA toolkit >= 12.8 whose nvcc supports every --arch you pass". Both now name the file
  (``confine.open_new``) and send the user to the temp folder (``oserrors.describe``, which
  ``doctor/tools.check_compile`` asks for nvcc's message).
- A full work directory: ``build`` said "build failed: No space left on device / To fix: free
  space on that file system (`df -h .`)", naming no path, and ``.`` (the user's shell's folder)
  is not the full file system; ``fetch`` the same after its "fetch into W". The lock's marker
  (``locks._opened``), written to a descriptor, named no file; it now names the lock file, and
  the fix its folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("KVPREFETCH_WORKDIR", "KVPREFETCH_CAMPAIGN")}
    env.update(PYTHONPATH=str(_REPO / "src"), TMPDIR=str(tmp_path), HOME=str(tmp_path))
    env.update(extra)
    return env


def _kit(tmp_path: Path, *args: str, timeout: float = 120,
         **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args],
                          env=_env(tmp_path, **extra), capture_output=True, text=True,
                          errors="replace", timeout=timeout, check=False)


def test_report_readme_refuses_a_file_of_thousands_of_blocks(tmp_path: Path) -> None:
    timings = tmp_path / "t.json"
    timings.write_bytes((_REPO / "docs" / "timings" / "2026-12-03-fresh-machine.json")
                        .read_bytes())
    readme = tmp_path / "R.md"
    text = "<!-- timings t.json -->\n<!-- /timings -->\n" * 5000  # 200 KB
    readme.write_text(text)
    res = _kit(tmp_path, "report", "--readme", str(readme))
    # without the fix: exit 0, R.md rewritten to about 50 MB
    assert res.returncode == 7 and "Traceback" not in res.stderr, res.stderr
    assert "5000 report, timings and commands blocks" in res.stderr and "To fix" in res.stderr
    assert readme.read_text() == text
    # the README's own blocks are far fewer: it regenerates as before
    ok = tmp_path / "ok.md"
    ok.write_text("<!-- timings t.json -->\n<!-- /timings -->\n")
    res = _kit(tmp_path, "report", "--readme", str(ok))
    assert res.returncode == 0, res.stderr
    assert "| " in ok.read_text()


@pytest.fixture
def nearly_full_temp(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs (a real mount: root only) with about 100 KiB free: Python's temp folder
    search (a 4-byte file) takes it, a scratch copy does not fit."""
    temp = tmp_path / "temp"
    temp.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(temp)],
                      check=False, capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN)")
    try:
        (temp / "fill").write_bytes(b"\0" * (1960 << 10))
        yield temp
    finally:
        subprocess.run(["umount", "-l", str(temp)], check=False)


def test_apply_with_a_full_temp_folder_names_the_temp_folder(
        tmp_path: Path, fetched_workdir: Path, nearly_full_temp: Path) -> None:
    res = _kit(tmp_path, "apply", "--workdir", str(fetched_workdir),
               TMPDIR=str(nearly_full_temp))
    assert res.returncode == 4 and "Traceback" not in res.stderr, res.stderr
    assert "No space left on device" in res.stderr, res.stderr
    # without the fix: "To fix: free space on that file system (`df -h .`), or write to a
    # larger one (the --workdir, ...)", and no file named
    fix = res.stderr.split("To fix:", 1)[1]
    assert f"system temp folder {nearly_full_temp}" in fix and "TMPDIR" in fix, res.stderr
    assert "--workdir" not in fix
    assert f"{nearly_full_temp}/kvprefetch-apply-" in res.stderr
    res = _kit(tmp_path, "apply", "--workdir", str(fetched_workdir))  # room again: it applies
    assert res.returncode == 0, res.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_doctor_with_a_full_temp_folder_names_the_temp_folder(
        tmp_path: Path, nearly_full_temp: Path) -> None:
    import json

    res = _kit(tmp_path, "doctor", "--mode", "kernels-only", "--workdir", str(tmp_path / "w"),
               "--json", TMPDIR=str(nearly_full_temp))
    check = next(c for c in json.loads(res.stdout)["checks"] if c["name"] == "nvcc-compile")
    assert check["status"] == "fail" and "No space left on device" in check["detail"], check
    # without the fix: "use a CUDA toolkit >= 12.8 whose nvcc supports every --arch you pass"
    assert f"system temp folder {nearly_full_temp}" in check["fix"], check
    assert "CUDA toolkit" not in check["fix"]


def test_a_full_work_directory_names_the_lock_file_it_could_not_write(
        tmp_path: Path) -> None:
    from kvprefetch.workspace.workdir import Workdir

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                      check=False, capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN)")
    try:
        work = disk / "w"
        Workdir(work).ensure()
        (work / ".lock").unlink(missing_ok=True)
        fd = os.open(disk / "fill", os.O_WRONLY | os.O_CREAT)
        try:  # fill it to the last block
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        res = _kit(tmp_path, "fetch", "--workdir", str(work))
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
    assert res.returncode == 3 and "Traceback" not in res.stderr, res.stderr
    # without the fix: "failed: No space left on device / To fix: ... (`df -h .`)"
    assert f"{work}/.lock: No space left on device" in res.stderr, res.stderr
    assert f"`df -h {work}`" in res.stderr
