"""Issue 41, the seventh hostile pass: what still gave a wrong-way message or ran another
program than the one it checked. Each test fails without its fix (checked with the fixes
stashed):

- the kit's output piped into a reader that is gone (``kvprefetch clean --json | head -1``,
  ``fetch --dry-run | true``): "clean failed: Broken pipe / To fix: check the path and its
  file system" (exit 2 or 3), blaming a path for the reader. Now the same quiet exit 1 as
  click's own handling of ``--help | head -1``;
- a relative entry on ``PATH`` (``PATH=.:…``): ``runner.which`` found ``./git`` in the current
  folder and handed the relative name to a child that starts in the tree, so ``apply`` ran
  (or failed to find) ``./git`` inside the work directory's tree: "./git: No such file or
  directory / check the path". Now the program found is made absolute where it was found, the
  one the echo names and the one that runs (and since the twenty-sixth pass a relative entry
  is left out: the current folder may be the work directory);
- a result whose text field (a model's name) holds a newline and ``<!-- /report -->``:
  ``report --readme`` wrote it into the README's block, which then ended early; every later
  run copied the rest of the block outside it again (the README grew by a copy a run). Now a
  block's lines must be table rows without a comment marker or a control character, or the
  README is left as it was and the result's file is named.

The autouse ``outside`` fixture checks that a folder outside the work directory is
byte-identical afterwards."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import copy_workdir
from tests.integration.test_reliability import _env, outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


def _closed_reader(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run the kit with its stdout a pipe whose reader has already gone."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=env,
                              stdout=write_end, stderr=subprocess.PIPE, text=True,
                              timeout=300, check=False)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("args", [["clean", "--dry-run", "--json"], ["fetch", "--dry-run"]],
                         ids=["clean-json", "fetch-dry-run"])
def test_output_into_a_pipe_whose_reader_is_gone_is_a_quiet_exit(
        tmp_path: Path, fetched_template: Path, args: list[str]) -> None:
    """`… | head -1` is no fault of a path or a file system, and no traceback."""
    wd = copy_workdir(fetched_template, tmp_path / "work")
    res = _closed_reader([*args, "--workdir", str(wd)], _env())
    assert res.returncode == 1, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr and "Exception ignored" not in res.stderr, res.stderr
    assert "Broken pipe" not in res.stderr and "check the path" not in res.stderr, res.stderr
    help_res = _closed_reader(["--help"], _env())  # click's own: the same exit
    assert help_res.returncode == res.returncode


def test_a_relative_path_entry_runs_the_program_it_found_not_one_in_the_tree(
        tmp_path: Path, fetched_template: Path) -> None:
    """With PATH=.:… apply checked ./git in the current folder, then ran ./git in the tree.
    Since the twenty-sixth pass a relative entry is left out altogether (the current folder is
    often the work directory): a ``git`` there never runs, and the PATH's own ``git`` does."""
    git = shutil.which("git")
    assert git is not None
    wd = copy_workdir(fetched_template, tmp_path / "work")
    here = tmp_path / "here"
    here.mkdir()
    marker = tmp_path / "here-git-ran"
    (here / "git").write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\nexec {git} \"$@\"\n")
    (here / "git").chmod(0o755)
    env = dict(_env(), PATH=".:" + os.environ["PATH"])
    env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in sys.path if p)
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "apply", "--workdir", str(wd),
                          "--variant", "prefetch"], env=env, cwd=here, capture_output=True,
                         text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    assert "No such file" not in res.stderr
    assert (wd / "trees" / "patched" / "csrc" / "attention" / "kvprefetch").is_dir()
    assert not marker.exists(), marker.read_text()


_RUN = "docs/results/2026-12-03-h200-vllm-call-decode"


@pytest.mark.parametrize("name", ["evil\n<!-- /report -->\nINJECTED", "a <!-- b", "red\x1b[31m",
                                  "x\u2028y"], ids=["marker", "comment", "ansi", "separator"])
def test_a_result_text_field_cannot_break_out_of_its_readme_block(
        tmp_path: Path, name: str) -> None:
    """A model name with a block's end marker grew the README by a copy on every run."""
    repo = Path(__file__).resolve().parents[2]
    shutil.copytree(repo / _RUN, tmp_path / _RUN)
    result = tmp_path / _RUN / "decode-llama-3.1-8b-8000.json.gz"
    with gzip.open(result, "rt") as f:
        doc = json.load(f)
    doc["meta"]["model"]["name"] = name
    with gzip.open(result, "wt") as f:
        json.dump(doc, f)
    readme = tmp_path / "README.md"
    readme.write_text(f"top\n<!-- report {_RUN} decode -->\nold\n<!-- /report -->\ntail\n")
    before = readme.read_bytes()
    for _ in range(2):
        res = subprocess.run([sys.executable, "-m", "kvprefetch", "report", "--readme",
                              str(readme)], env=_env(), capture_output=True, text=True,
                             timeout=300, check=False)
        assert res.returncode == 7, (res.returncode, res.stderr)
        assert "Traceback" not in res.stderr and "To fix:" in res.stderr, res.stderr
        assert "decode-llama-3.1-8b-8000" in res.stderr or _RUN in res.stderr, res.stderr
    assert readme.read_bytes() == before
