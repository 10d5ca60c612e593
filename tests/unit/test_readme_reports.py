"""The README's report blocks (`<!-- report RESULT.json summary|shapes -->`) are what
`kvprefetch report --readme` renders from the committed result JSON, not numbers typed by hand:
CI regenerates them and fails on any difference."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from kvprefetch.bench.report import README_BLOCK, refresh_blocks
from kvprefetch.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_readme_blocks_are_regenerated_from_their_json() -> None:
    text = (ROOT / "README.md").read_text()
    blocks = README_BLOCK.findall(text)
    assert blocks, "the README has no report block"
    for _, path, _, _, _ in blocks:
        assert (ROOT / path).is_file(), path
    new, changed = refresh_blocks(text, ROOT)
    assert changed == [] and new == text


def test_check_finds_an_edited_figure_and_readme_fixes_it(tmp_path: Path) -> None:
    """A figure typed over in a copy of the README fails `--check` (exit code of the bench
    family, the block named); `--readme` rewrites it to the JSON's, touching nothing else."""
    text = (ROOT / "README.md").read_text()
    m = next(README_BLOCK.finditer(text))
    first_row = m[4].splitlines()[2]
    edited_row = first_row.replace("|", "| 9.999x |", 1)
    copy = tmp_path / "README.md"
    copy.write_text(text.replace(first_row, edited_row, 1))
    for _, path, _, _, _ in README_BLOCK.findall(text):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    runner = CliRunner()
    res = runner.invoke(main, ["report", "--readme", str(copy), "--check", "--json"])
    assert res.exit_code != 0
    assert json.loads(res.stdout)["changed"] == [m[2]]
    assert "kvprefetch report --readme" in res.output
    assert copy.read_text() != text  # --check changed nothing
    res = runner.invoke(main, ["report", "--readme", str(copy)])
    assert res.exit_code == 0, res.output
    assert copy.read_text() == text
