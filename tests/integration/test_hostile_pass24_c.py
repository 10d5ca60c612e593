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
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
