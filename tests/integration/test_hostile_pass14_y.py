"""Issue 41, the fourteenth hostile pass (tester y: Slurm campaigns, reports and output
folders). Each test fails without its fix (checked by reverting ``src`` and running it):

- ``write_new`` (verify's report, every exit record) opened its ``mktemp`` temporary by name
  with ``<>``, which follows a link: a link put at the temporary's name between ``mktemp`` and
  the open (a program that watches the folder, inotify, sees the new name at once) had the job
  write over the start of a file outside the campaign, ``chmod`` it, and rename the link into
  place as the report, exit 0. A hard link to a file outside put at the name did the same. Now
  what was opened must be the file at that name, with that one name, or the write is refused.

The interleavings are forced with a bash DEBUG trap that does what the other process would do
at the one moment it must (as ``test_hostile_pass13_c``); everything else, the function the kit
writes into each job script and the files, is real."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from kvprefetch.slurm.scripts import WRITE_NEW_SH
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_FUNC = "\n".join(WRITE_NEW_SH)


def _write_new(target: Path, debug_trap: str) -> subprocess.CompletedProcess[str]:
    """``echo data | write_new TARGET`` in bash, with ``debug_trap`` run before each simple
    command of the function's subshell (``set -T`` carries the trap into it)."""
    script = (f"{_FUNC}\nset -T\ntrap {shlex.quote(debug_trap)} DEBUG\n"
              f"echo data | write_new {shlex.quote(str(target))}\n")
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                          check=False)


@pytest.mark.parametrize("plant", ["ln -s", "ln"])
def test_write_new_never_writes_through_a_link_put_at_its_temporary(
        tmp_path: Path, outside: Path, plant: str) -> None:
    """Just before the temporary is opened, it is replaced by a symbolic link (or a hard link)
    to a file outside the campaign: the report was written over that file's first bytes and the
    link renamed into place as ``verify.json``, exit 0. Now the write is refused naming the
    temporary, and nothing is left in ``results/``."""
    results = tmp_path / "camp" / "results"
    results.mkdir(parents=True)
    victim = outside / "notes.txt"
    trap = (f'if [ -z "${{PLANTED:-}}" ] && [[ $BASH_COMMAND == "exec 3"* ]]; then '
            f'PLANTED=1; rm -f -- "$tmp"; {plant} -- {shlex.quote(str(victim))} "$tmp"; fi')
    res = _write_new(results / "verify.json", trap)
    assert victim.read_text() == "keep me\n", "written outside the campaign"
    assert res.returncode != 0, res
    assert "refusing to write" in res.stderr and "new file of its own" in res.stderr, res.stderr
    assert list(results.iterdir()) == []
