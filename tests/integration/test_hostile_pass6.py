"""Issue 41, the sixth hostile pass: what still wrote outside the work directory, or gave a
traceback or a wrong-way message. Each test fails without its fix (checked with the fixes
stashed):

- ``TMPDIR`` empty, relative, a FIFO or a file: the kit handed it to nvcc as it was, and nvcc
  builds its temporaries' names by plain concatenation; ``TMPDIR= kvprefetch build --dry-run``
  (doctor's compile probe) left about 2.5 MB of ``/tmpxft_*`` files in ``/``, and a FIFO or a
  file made doctor say "use a CUDA toolkit >= 12.8". Now ``runner.run`` refuses a child
  ``TMPDIR`` that is not an absolute path to a writable directory, naming it.

The autouse ``outside`` fixture checks that a folder outside the work directory is
byte-identical afterwards."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.integration.helpers import kvprefetch_cli_split
from tests.integration.test_reliability import _env, outside, refused

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc"
                                 if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


def _root_tmpxft() -> set[str]:
    return {n for n in os.listdir("/") if n.startswith("tmpxft")}


@pytest.mark.skipif(_NVCC is None, reason="doctor's compile probe needs nvcc")
@pytest.mark.parametrize("kind", ["empty", "relative", "fifo", "file"])
def test_a_tmpdir_that_is_no_writable_folder_is_refused_before_nvcc_runs(
        tmp_path: Path, kind: str) -> None:
    """An empty TMPDIR made nvcc write its temporaries into / during a dry run."""
    value = {"empty": "", "relative": "tmp", "fifo": str(tmp_path / "fifo"),
             "file": str(tmp_path / "file")}[kind]
    if kind == "fifo":
        os.mkfifo(value)
    if kind == "file":
        Path(value).write_text("x\n")
    (tmp_path / "cwd").mkdir()
    before = _root_tmpxft()
    env = {**_env(), "TMPDIR": value}
    for args in (["doctor"], ["build", "--dry-run"]):
        res = kvprefetch_cli_split(*args, "--workdir", str(tmp_path / "wd"), env=env,
                                   cwd=tmp_path / "cwd", timeout=300)
        refused(res, 2, f"TMPDIR={value!r}", "unset TMPDIR")
    assert _root_tmpxft() <= before, "nvcc wrote its temporaries into /"
    assert list((tmp_path / "cwd").iterdir()) == []
