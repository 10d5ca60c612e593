"""Issue 41, the twenty-third hostile pass (tester b: campaigns from the command line, reports
and outputs). Each test fails without its fix (checked by reverting ``src`` and running it):

- ``report --index R --out FILE`` and ``report --readme README.md`` with text that has no UTF-8
  bytes: a lone surrogate from a ``\\ud800``/``\\udcff`` escape in a run's ``provenance.json``
  (its ``gpu``, a headline's ``text``), in a timing file's ``machine``, or a run folder whose
  name is not UTF-8 (read with ``surrogateescape``), ended in a ``UnicodeEncodeError`` traceback
  at ``confine.write_file``'s encode (1 run each). Now ``write_file`` (and ``write_if_changed``)
  name the character and its line with the fix, in the caller's family (exit 7), nothing
  written.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_SRC = Path(__file__).resolve().parents[2] / "src"
_DOCS = Path(__file__).resolve().parents[2] / "docs"


def _kit(tmp_path: Path, *args: str, timeout: float = 120,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    full.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path), HOME=str(tmp_path), **(env or {}))
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=full, cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _runs(tmp_path: Path) -> Path:
    """One committed run (provenance.json and the kernel result its headline names)."""
    run = tmp_path / "runs" / "2026-12-01-h200-headline"
    run.mkdir(parents=True)
    src = _DOCS / "results" / "2026-12-01-h200-headline"
    for name in ("provenance.json", "default-matrix.json"):
        shutil.copy(src / name, run / name)
    return run


def _edit(path: Path, **fields: object) -> None:
    doc = json.loads(path.read_text())
    doc.update(fields)
    path.write_text(json.dumps(doc))  # ensure_ascii: a lone surrogate as its \u escape


@pytest.mark.parametrize("where", ["gpu", "headline", "folder"])
def test_an_index_of_text_with_no_utf8_bytes_is_one_message_not_a_traceback(
        tmp_path: Path, where: str) -> None:
    run = _runs(tmp_path)
    if where == "gpu":
        _edit(run / "provenance.json", gpu="H200 \ud800")
    elif where == "headline":
        _edit(run / "provenance.json", headline=[{"text": "fast \udcff"}])
    else:  # a second run in a folder whose name is the byte 0xff
        other = Path(os.fsdecode(bytes(run.parent) + b"/\xff"))
        shutil.copytree(run, other)
    out = tmp_path / "results.md"
    res = _kit(tmp_path, "report", "--index", str(run.parent), "--out", str(out))
    text = res.stdout + res.stderr
    assert res.returncode == 7 and "Traceback" not in text, text
    assert "lone surrogate" in text and "To fix: rename that file or folder" in text, text
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_readme_of_text_with_no_utf8_bytes_is_one_message_not_a_traceback(
        tmp_path: Path) -> None:
    timings = tmp_path / "t.json"
    shutil.copy(next((_DOCS / "timings").glob("*.json")), timings)
    _edit(timings, machine="H200 \udcff")
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- timings t.json -->\n<!-- /timings -->\n")
    before = readme.read_bytes()
    res = _kit(tmp_path, "report", "--readme", str(readme))
    text = res.stdout + res.stderr
    assert res.returncode == 7 and "Traceback" not in text, text
    assert "lone surrogate" in text and "(line " in text, text
    assert readme.read_bytes() == before
