"""Issue 41, the twenty-second hostile pass (tester d: the generated job scripts as they run on
a node, and the jobs' environment allow-list, ``slurm/job_env.py``). Each test fails without
its fix (checked by reverting ``src`` and running it):

- ``LD_LIBRARY_PATH`` is passed to every job; the job keeps its entries that are absolute and
  outside the campaign (``keep_outside``), split on ``:``. glibc's loader splits it on ``;`` as
  well, and reads an empty or relative entry from the folder each program runs in, so
  ``/usr/lib;.`` (or ``/usr/lib;``) was one absolute entry to the job, kept, while the job's
  ``mv`` (run in the campaign's logs/) loaded a ``libacl.so.1`` planted there (3 runs of 3:
  ``/usr/lib;.``, ``/usr/lib;``, ``;/usr/lib``). Submit's check reads those entries from
  ``/``, where the job's bash starts, and passed them, rightly: only later programs run in the
  campaign. Now the job splits ``LD_LIBRARY_PATH`` on both, and keeps no entry holding either.

Slurm is absent: the job scripts are run by bash as Slurm runs them (from ``/``, with the
environment given)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass18_e import _fake_libacl
from tests.integration.test_hostile_pass20_d import _plan, _run
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


def _env_stub(tmp_path: Path) -> tuple[Path, Path]:
    """The jobs' "interpreter": it writes the LD_LIBRARY_PATH it was given to ``got``."""
    got, py = tmp_path / "got", tmp_path / "python"
    py.write_text(f'#!/bin/bash\nprintf "%s\\n" "${{LD_LIBRARY_PATH-unset}}" >> {got}\n')
    py.chmod(0o755)
    return got, py


def test_a_library_path_entry_after_a_semicolon_never_loads_from_the_campaign(
        tmp_path: Path, outside: Path) -> None:
    """The attack: a ``libacl.so.1`` in the campaign and its logs/, the verify job (its
    ``write_new`` runs ``mv`` in logs/) given an ``LD_LIBRARY_PATH`` whose ``;`` hides an empty
    or relative entry: the planted library is never loaded, and the kit gets the absolute
    entries alone."""
    camp, bad = tmp_path / "camp", outside / "loaded-by-the-job"
    lib = _fake_libacl(tmp_path, bad)
    if lib is None:
        pytest.skip("no C compiler, or this mv does not link libacl.so.1")
    got, py = _env_stub(tmp_path)
    _plan(tmp_path, camp, python=str(py))
    for where in (camp / "logs", camp):
        shutil.copy(lib, where / "libacl.so.1")
    for value in ("/usr/lib;.", "/usr/lib;", ";/usr/lib", "/usr/lib;logs"):
        res = _run(tmp_path, camp, "20-verify.sbatch", LD_LIBRARY_PATH=value)
        assert res.returncode == 0, (value, res.stdout + res.stderr)
        assert not bad.exists(), f"LD_LIBRARY_PATH={value!r}: a library in the campaign loaded"
    assert got.read_text().splitlines() == ["/usr/lib"] * 4
