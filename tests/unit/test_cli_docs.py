"""Every command is documented and has a working --help (sqlite-utils' test_docs idea).

The command list is read from `kvprefetch --help` itself (run in-process), so a new command that is
wired into the CLI but missing from README.md fails here until the README mentions it."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from kvprefetch.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"


def _listed_commands() -> list[str]:
    # in-process (tests/integration/test_cli_help.py runs each --help in a fresh interpreter
    # without CUDA)
    out = CliRunner().invoke(main, ["--help"]).output
    section = out.split("\nCommands:\n", 1)[1]
    names = [m.group(1) for m in re.finditer(r"^  ([a-z][a-z0-9-]*)\s", section, re.MULTILINE)]
    assert names, out
    return names


COMMANDS = _listed_commands()


def test_help_lists_the_known_commands() -> None:
    # a sanity floor, not the source of truth: the issues' commands are all there
    for name in ("fetch", "apply", "diff-upstream", "export-header", "build", "clean", "doctor",
                 "verify-kernel"):
        assert name in COMMANDS


@pytest.mark.parametrize("name", COMMANDS)
def test_command_is_in_the_readme(name: str) -> None:
    assert f"kvprefetch {name}" in README.read_text(), (
        f"`kvprefetch {name}` is a command (see `kvprefetch --help`) but README.md never "
        "mentions it")


def _subcommands(group: click.Group, prefix: tuple[str, ...]) -> list[tuple[str, ...]]:
    ctx = click.Context(group)
    out = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None
        out.append((*prefix, name))
        if isinstance(cmd, click.Group):
            out += _subcommands(cmd, (*prefix, name))
    return out


def test_every_subcommand_help_works() -> None:
    paths = _subcommands(main, ())
    assert {p[0] for p in paths} == set(COMMANDS)
    runner = CliRunner()
    for path in paths:
        res = runner.invoke(main, [*path, "--help"])
        assert res.exit_code == 0, (path, res.output)
        assert "Usage:" in res.output
