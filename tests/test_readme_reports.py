"""The report blocks (`<!-- report RESULT.json summary|shapes -->`) of the README and
docs/design.md, and the README's command table (`<!-- commands -->`), are what
`kvprefetch report --readme` renders from the committed result JSON and the commands' help, not
text typed by hand: CI regenerates them and fails on any difference."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprefetch.bench.report import README_BLOCK, refresh_blocks
from kvprefetch.cli import main
from kvprefetch.cli.report import COMMANDS_BLOCK, refresh_commands

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("doc", ["README.md", "docs/design.md"])
def test_report_blocks_are_regenerated_from_their_json(doc: str) -> None:
    path = ROOT / doc
    text = path.read_text()
    blocks = README_BLOCK.findall(text)
    assert blocks, f"{doc} has no report block"
    for _, block_path, _, _, _ in blocks:
        assert (path.parent / block_path).is_file(), block_path
    new, changed = refresh_blocks(text, path.parent)
    assert changed == [] and new == text


def test_readme_command_table_is_generated_from_the_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert COMMANDS_BLOCK.search(text), "the README has no <!-- commands --> block"
    new, changed = refresh_commands(text)
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
