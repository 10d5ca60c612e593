"""Every command's --help works in a fresh interpreter with no CUDA toolkit reachable, and
loading every command imports no torch (tests/unit/test_cli_docs.py checks that each command
is documented)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from kvprefetch.runner import run


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


@pytest.mark.parametrize("name", COMMANDS)
def test_command_help_works_without_cuda(name: str) -> None:
    res = run([sys.executable, "-m", "kvprefetch", name, "--help"], env=_no_cuda_env(),
              echo=False, check=False)
    assert res.returncode == 0, res.output
    assert f"Usage: python -m kvprefetch {name}" in res.output
    assert "Traceback" not in res.output


def test_loading_every_command_does_not_import_torch() -> None:
    code = ("import sys, importlib\n"
            "from kvprefetch.cli import COMMANDS\n"
            "for target in COMMANDS.values():\n"
            "    importlib.import_module(target.split(':')[0])\n"
            "print(sorted(m for m in ('torch', 'cuda', 'numpy') if m in sys.modules))\n")
    res = run([sys.executable, "-c", code], env=_no_cuda_env(), echo=False)
    assert res.output.strip().splitlines()[-1] == "[]"
