"""Issue 41, the twenty-sixth hostile pass (tester b: campaigns from the command line, reports
and outputs; this pass: renameat2 races during submit, matplotlib after ``rcdefaults``, README
blocks, indexes over many runs). Each test fails without its fix (checked by reverting ``src``
and running it):

- ``report RESULT.json`` run in a folder holding a FIFO named ``matplotlibrc`` (a campaign's
  ``results/``, where the jobs and whoever can write the campaign put files; pass 25 showed
  ``report`` is run there): matplotlib reads ``matplotlibrc`` from the current folder when it is
  imported, before the kit's ``rcdefaults`` can set it aside, and its ``os.path.exists`` check
  lets a FIFO through, so the import waited on it for ever (a hang; killed at 30 s, 1 run; a
  link to ``/dev/zero`` there reads without end). Now ``render.pyplot`` imports matplotlib with
  ``/`` as the current folder, and goes back to the caller's folder after.
- The same import builds matplotlib's font cache when it has none (a new user, an
  ``MPLCONFIGDIR`` of its own) by running ``fc-list`` through ``PATH``: with an empty entry
  (``PATH=:/usr/bin:/bin``) an ``fc-list`` planted in the current folder (the campaign's
  ``results/``) ran (1 run; borderline: the kit's rule, ``runner.which``, reads a relative entry
  from the caller's folder as a shell does, but no shell command of the user's named fc-list).
  The import in ``/`` closes it too; a rebuild at draw time (a font named by the cache gone
  since) would still look there.
- ``report --readme L.md`` where ``L.md`` is a symlink to the README (a wrong-way message):
  refused "L.md is a symlink ... / To fix: move the symlink L.md away, then rerun", after which
  the rerun fails "L.md does not exist"; and ``--check`` on it said "run `kvprefetch report
  --readme L.md`", the command that refuses (1 run each). Now both name the file the link
  points to, and the command they give works.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass24_b import _kit
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

pytest.importorskip("matplotlib")

_DOCS = Path(__file__).resolve().parents[2] / "docs" / "results"
_KERNEL = _DOCS / "2026-12-01-h200-headline" / "default-matrix.json"


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_fifo_matplotlibrc_in_the_current_folder_does_not_hang_report(tmp_path: Path,
                                                                        kind: str) -> None:
    results = tmp_path / "camp" / "results"
    results.mkdir(parents=True)
    shutil.copy(_KERNEL, results / "r.json")
    if kind == "fifo":
        os.mkfifo(results / "matplotlibrc")
    else:
        (results / "matplotlibrc").symlink_to("/dev/zero")
    (tmp_path / "mpl").mkdir()
    proc = _kit(results, "report", "r.json", "--out", "out", timeout=30,
                env={"MPLCONFIGDIR": str(tmp_path / "mpl")})
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert (results / "out" / "r.png").read_bytes().startswith(b"\x89PNG")


def test_the_font_cache_build_runs_no_fc_list_from_the_current_folder(tmp_path: Path) -> None:
    results = tmp_path / "camp" / "results"
    results.mkdir(parents=True)
    shutil.copy(_KERNEL, results / "r.json")
    marker = tmp_path / "fc-list-ran"
    (results / "fc-list").write_text(f"#!/bin/sh\ntouch {marker}\n")
    (results / "fc-list").chmod(0o755)
    (tmp_path / "mpl").mkdir()  # empty: matplotlib builds its font cache on import
    env = {"PATH": ":/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path),
           "MPLCONFIGDIR": str(tmp_path / "mpl"),
           "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.run([sys.executable, "-m", "kvprefetch", "report", "r.json", "--out",
                           "out"], env=env, cwd=results, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()
    assert (results / "out" / "r.png").read_bytes().startswith(b"\x89PNG")


def test_a_readme_that_is_a_symlink_is_sent_to_the_file_it_names(tmp_path: Path) -> None:
    shutil.copy(_KERNEL, tmp_path / "r.json")
    real = tmp_path / "real.md"
    real.write_text("# t\n<!-- report r.json summary -->\nold\n<!-- /report -->\n")
    (tmp_path / "L.md").symlink_to("real.md")
    for extra in ((), ("--check",)):
        proc = _kit(tmp_path, "report", "--readme", "L.md", *extra)
        assert proc.returncode != 0
        assert "Traceback" not in proc.stderr
        assert f"To fix: run `kvprefetch report --readme {real}`" in proc.stderr, proc.stderr
    assert "old" in real.read_text()  # nothing written through the link
    proc = _kit(tmp_path, "report", "--readme", str(real))  # the fix, as given
    assert proc.returncode == 0, proc.stderr
    assert "| patched |" in real.read_text() and (tmp_path / "L.md").is_symlink()
