"""Issue 41, the fifteenth hostile pass (tester b: campaigns, job scripts, reports and
outputs). Each test fails without its fix (checked by reverting ``src`` and running it):

- ``write_new`` (verify's report, every exit record) made its temporary with ``mktemp`` and
  opened it again by name with bash's ``<>`` (O_CREAT, links followed), then checked by name
  that the open file was that one. A program watching ``results/`` (inotify sees the new name
  at once) that put a dangling link there had ``<>`` create a file outside the campaign
  (22 runs of 30 with a real inotify watcher); one that put a link to a file outside and then,
  between the check's two ``stat``\\ s, a hard link to the same file at the name passed the
  check: the report was written over that file's first bytes, its mode changed, exit 0
  (12 runs of 30). Now one ``dd`` makes, opens and writes the temporary with
  O_CREAT|O_EXCL|O_NOFOLLOW at a name ``mktemp -u`` drew and nothing made before it: the open
  follows no link and opens nothing already there.

The watcher is a bash DEBUG trap that does, before each command of the function, what an
inotify watcher would do with what it can see in ``results/`` (it reads no variable of the
job's shell); everything else, the function the kit writes into each job script and the
files, is real."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from kvprefetch.slurm.scripts import WRITE_NEW_SH
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_FUNC = "\n".join(WRITE_NEW_SH)


def _write_new(target: Path, debug_trap: str) -> subprocess.CompletedProcess[str]:
    """``echo data | write_new TARGET`` in bash, with ``debug_trap`` run before each simple
    command (``set -T`` carries the trap into the function's subshells)."""
    script = (f"{_FUNC}\nset -T\ntrap {shlex.quote(debug_trap)} DEBUG\n"
              f"echo data | write_new {shlex.quote(str(target))}\n")
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                          check=False)


def _watcher(results: Path, seen: Path, plant: str) -> str:
    """The first time a new regular file ``*.tmp-*`` is in ``results/``, replace it by what
    ``plant`` makes at ``$f`` (once: ``seen`` records it)."""
    return (f'for f in {shlex.quote(str(results))}/*.tmp-*; do '
            f'if [ -f "$f" ] && [ ! -L "$f" ] && [ ! -e {shlex.quote(str(seen))} ]; then '
            f': > {shlex.quote(str(seen))}; rm -f -- "$f"; {plant}; fi; done')


def test_write_new_never_creates_a_file_through_a_dangling_link_at_its_temporary(
        tmp_path: Path, outside: Path) -> None:
    """As soon as the temporary shows in ``results/`` it is replaced by a link to a name
    outside that does not exist: ``<>`` created that file (empty) outside the campaign before
    the check refused. Now nothing is made outside."""
    results = tmp_path / "camp" / "results"
    results.mkdir(parents=True)
    made = outside / "created-by-the-job"
    seen = tmp_path / "seen"
    trap = _watcher(results, seen, f'ln -s -- {shlex.quote(str(made))} "$f"')
    res = _write_new(results / "verify.json", trap)
    assert seen.exists(), "the watcher never saw the temporary: the test proves nothing"
    assert not made.exists() and not made.is_symlink(), f"created outside the campaign: {res}"
    # the outside fixture checks the rest of the folder is unchanged


def test_write_new_never_writes_a_file_outside_that_a_hard_link_swapped_in_names(
        tmp_path: Path, outside: Path) -> None:
    """As soon as the temporary shows, it is replaced by a link to a file outside; when the
    job looks the name up with ``stat``, that link is replaced by a hard link to the same file.
    The check compared the open file's inode and link count with the name's inode and a
    literal 1, so it passed: the report was written over the file outside, exit 0. Now the
    file outside is never opened."""
    results = tmp_path / "camp" / "results"
    results.mkdir(parents=True)
    victim = outside / "notes.txt"
    seen = tmp_path / "seen"
    v = shlex.quote(str(victim))
    trap = (_watcher(results, seen, f'ln -s -- {v} "$f"') + "; "
            f'if [[ $BASH_COMMAND == "stat -c"* ]]; then '
            f'for f in {shlex.quote(str(results))}/*.tmp-*; do '
            f'if [ -L "$f" ]; then ln -- {v} "$f.h" && mv -fT -- "$f.h" "$f"; fi; done; fi')
    res = _write_new(results / "verify.json", trap)
    assert seen.exists(), "the watcher never saw the temporary: the test proves nothing"
    assert victim.read_text() == "keep me\n", f"written outside the campaign: {res}"
