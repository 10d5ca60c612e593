"""What a newcomer meets first at the command line (issue 42): usage errors say how to fix
them and offer only the current names; a wrong tree name lists the trees there are; the typical
flow in ``kvprefetch --help`` is the README's. In process (click's CliRunner), no process."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprefetch import upstream
from kvprefetch.cli import main
from kvprefetch.errors import PatchError
from kvprefetch.sources.upstream_diff import diff_upstream

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.parametrize("argv", [["apply", "--variant", "bogus"], ["nosuch"], ["--bogus"],
                                  ["bench", "kernel", "--bogus-option"]])
def test_usage_errors_say_how_to_fix_them(argv: list[str]) -> None:
    res = CliRunner().invoke(main, argv)
    assert res.exit_code == 2
    assert "Error:" in res.output and "To fix: correct the command line" in res.output


def test_a_wrong_variant_lists_only_current_names_and_the_old_one_still_works() -> None:
    res = CliRunner().invoke(main, ["apply", "--variant", "bogus"])
    listed = re.search(r"is not one of (.*)\.", res.output)
    assert listed is not None
    assert "seed" not in listed.group(1) and "'paper'" in listed.group(1)
    old = CliRunner().invoke(main, ["apply", "--variant", "seed", "--dry-run", "--workdir",
                                    "/nonexistent-kvprefetch-work"])
    assert "Invalid value" not in old.output and "use --variant paper" in old.output


def _tree(root: Path, name: str) -> None:
    header = root / "trees" / name / upstream.ATTENTION_HEADER
    header.parent.mkdir(parents=True)
    header.write_text("// a tree\n")


def test_diff_upstream_names_the_trees_for_an_unknown_one(tmp_path: Path) -> None:
    with pytest.raises(PatchError) as empty:
        diff_upstream(tmp_path, "patched")
    assert "run `kvprefetch fetch` first" in empty.value.message
    for name in ("baseline", "patched"):
        _tree(tmp_path, name)
    with pytest.raises(PatchError) as typo:
        diff_upstream(tmp_path, "nosuch")
    assert "unknown tree 'nosuch'" in typo.value.message
    assert "baseline, patched" in typo.value.message
    assert "run `kvprefetch fetch` first" not in typo.value.message


def test_help_shows_the_readmes_flow() -> None:
    """The typical flow in --help is the README's (and main.sh's) sequence of commands."""
    help_text = CliRunner().invoke(main, ["--help"]).output
    flow = re.findall(r"^\s+kvprefetch ([a-z-]+)", help_text, re.MULTILINE)
    readme = README.read_text()
    line = re.search(r"`scripts/main.sh` runs `([^`]+)`", readme)
    assert line is not None
    steps = [s.split()[0] for s in re.split(r"\s*→\s*", line.group(1))]
    assert flow == steps == ["fetch", "apply", "diff-upstream", "build", "verify-kernel"]
