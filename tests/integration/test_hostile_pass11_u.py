"""Issue 41, the eleventh hostile pass (tester u: the code passes 9 and 10 added read with an
attacker's eye, kernels without pidfds, signals not yet tried, input shapes nobody tried). Each
test fails without its fix (checked by reverting ``src`` and running it):

- a path, Slurm answer or detail shown in one of the kit's tables was read by rich as markup
  and emoji codes: doctor showed the work directory ``/tmp/w[red]y`` as ``/tmp/wy``, and one
  named ``w[/x]`` stopped doctor with rich's MarkupError, which the command line then blamed on
  a broken rich ("repair or reinstall it").

The autouse ``outside`` fixture checks that a folder outside the work directory is
byte-identical afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_reliability import cli, outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


@pytest.mark.parametrize("name", ["w[/x]", "w[red]y:smile:"])
def test_a_table_shows_a_path_as_it_is_never_as_rich_markup(tmp_path: Path, name: str) -> None:
    """doctor's table names the work directory: ``[/x]`` in it was a MarkupError blamed on
    rich, ``[red]`` and ``:smile:`` vanished from the path shown."""
    wd = tmp_path / name
    res = cli("doctor", "--mode", "kernels-only", "--workdir", str(wd), timeout=120)
    assert "Traceback" not in res.stderr, res.stderr
    assert "rich" not in res.stderr, res.stderr
    assert res.returncode == 0, (res.returncode, res.stderr)
    # the table wraps a long cell: read it without its borders and line breaks
    flat = "".join(res.stdout.replace("│", " ").split())
    assert "".join(f"free at {wd},".split()) in flat, res.stdout
    assert not wd.exists()  # doctor writes nothing
