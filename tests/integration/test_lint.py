"""Lint and types are part of the suite (issue 45): ``ruff check`` on the kit's Python (the rules
in pyproject's ``[tool.ruff.lint]``) and ``mypy src`` (strict on workspace/, sources/, builds/
and kernels/) both pass. Each runs in a child interpreter from the repository root, so that
pyproject.toml configures it; both are pinned in the ``test`` extra. mypy reads torch's own
annotations where torch is installed (the kit's venv), so this runs here and not in tests/unit,
which must pass without torch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvprefetch.runner import run

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv", [["ruff", "check", "src", "tests", "scripts"],
                                  ["mypy", "src"]], ids=["ruff", "mypy"])
def test_lint_and_types_are_clean(argv: list[str]) -> None:
    res = run([sys.executable, "-m", *argv], cwd=REPO, echo=False, check=False, timeout=600)
    assert res.returncode == 0, f"`python -m {' '.join(argv)}` failed:\n{res.output}"
