"""What the twenty-second hostile pass of issue 41 left open and a later session closed (the
runner's timeout has its own file, test_runner_timeout.py). Each test fails without its fix."""

from __future__ import annotations

from pathlib import Path

from tests.integration.helpers import kvprefetch_cli_split


def test_a_newline_in_a_name_forges_no_line_of_cleans_listing(fetched_workdir: Path) -> None:
    """A file of the user's in ``build/`` named ``x\\nremoved important`` was listed as "kept
    .../build/x", then a line of its own, "removed important: not created by kvprefetch": a
    deletion that never happened. Each entry is now one line, its newline shown as ``\\n``."""
    build = fetched_workdir / "build"
    build.mkdir(exist_ok=True)
    forged = build / "x\nremoved important"
    forged.write_text("mine\n")
    for extra in ((), ("--dry-run",)):
        res = kvprefetch_cli_split("clean", "--workdir", str(fetched_workdir), *extra)
        assert res.returncode == 0, res.stderr
        lines = (res.stdout + res.stderr).splitlines()
        assert not [ln for ln in lines if ln.startswith("removed important")], lines
        assert any(ln.startswith("kept ") and "x\\nremoved important" in ln for ln in lines), lines
    assert forged.read_text() == "mine\n"
