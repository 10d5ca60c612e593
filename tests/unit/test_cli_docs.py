"""Every command is documented and has a working --help (sqlite-utils' test_docs idea).

The command list is read from `kvprefetch --help` itself, so a new command that is wired into
the CLI but missing from README.md fails here until the README mentions it."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from kvprefetch.cli import main
from kvprefetch.runner import run

README = Path(__file__).resolve().parents[2] / "README.md"


def _no_cuda_env() -> dict[str, str]:
    """This interpreter's environment with no CUDA toolkit reachable: no CUDA_HOME, and a PATH
    of only the interpreter's bin dir and the system dirs (nvcc lives in /usr/local/...)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_HOME", "CUDA_PATH", "KVPREFETCH_WORKDIR")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _listed_commands() -> list[str]:
    out = run([sys.executable, "-m", "kvprefetch", "--help"], env=_no_cuda_env(), echo=False).output
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
def test_command_help_works_without_cuda(name: str) -> None:
    res = run([sys.executable, "-m", "kvprefetch", name, "--help"], env=_no_cuda_env(),
              echo=False, check=False)
    assert res.returncode == 0, res.output
    assert f"Usage: python -m kvprefetch {name}" in res.output
    assert "Traceback" not in res.output


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
        out.append(prefix + (name,))
        if isinstance(cmd, click.Group):
            out += _subcommands(cmd, prefix + (name,))
    return out


def test_every_subcommand_help_works() -> None:
    paths = _subcommands(main, ())
    assert {p[0] for p in paths} == set(COMMANDS)
    runner = CliRunner()
    for path in paths:
        res = runner.invoke(main, [*path, "--help"])
        assert res.exit_code == 0, (path, res.output)
        assert "Usage:" in res.output


def test_loading_every_command_does_not_import_torch() -> None:
    code = ("import sys, importlib\n"
            "from kvprefetch.cli import COMMANDS\n"
            "for target in COMMANDS.values():\n"
            "    importlib.import_module(target.split(':')[0])\n"
            "print(sorted(m for m in ('torch', 'cuda', 'numpy') if m in sys.modules))\n")
    res = run([sys.executable, "-c", code], env=_no_cuda_env(), echo=False)
    assert res.output.strip().splitlines()[-1] == "[]"
