"""Issue 41, the thirteenth hostile pass (the lead's part): the job scripts' ``write_new`` and
the campaign's scratch. Each test fails without its fix (checked by reverting ``src`` and
running it):

- ``write_new`` (verify's report, every exit record) checked that its subshell had entered the
  campaign's folder with bash's builtin ``pwd -P``, which resolves again, by name, the path
  ``cd -P`` recorded, and ``cd -P`` had resolved that path by name before its chdir: a swap in
  between, and back before the check, left the subshell in a folder outside with the check
  passed. A fresh CI rehearsal saw the eleventh pass's swap-loop test write a ``verify.json``
  outside once; 40,000 writes under the same loop wrote one here. Now the check asks the kernel
  (the external ``pwd``, getcwd).
- ``write_new``'s temporary was opened by noclobber's ``>`` at a guessable name
  (``$$-$RANDOM``): a FIFO put there was opened for writing and the job waited for good (the
  twelfth pass left it open). Now ``mktemp`` makes it and it is opened read-write (which never
  waits) and must be a regular file.

``--scratch campaign`` going is tested in ``test_hostile_pass5.py`` and ``tests/unit``.

The interleavings are forced with a bash DEBUG trap that does what the other process would do
at the one moment it must (a swap loop meets that moment only once in tens of thousands of
writes); everything else, the function the kit writes into each job script and the files, is
real."""

from __future__ import annotations

import subprocess
from pathlib import Path

from kvprefetch.slurm.shell import WRITE_NEW_SH
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_FUNC = "\n".join(WRITE_NEW_SH)


def _write_new(target: Path, debug_trap: str) -> subprocess.CompletedProcess[str]:
    """``echo data | write_new TARGET`` in bash, with ``debug_trap`` run before each simple
    command of the function's subshell (``set -T`` carries the trap into it)."""
    script = f"{_FUNC}\nset -T\ntrap {debug_trap!r} DEBUG\necho data | write_new {target}\n"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                          check=False)


def test_write_new_checks_the_folder_the_kernel_says_its_subshell_is_in(tmp_path: Path) -> None:
    """Between the subshell's ``cd -P results`` and its check, ``results/`` is moved to a folder
    outside the campaign and a new ``results/`` made in its place (what a swap of the folder
    and a link in the middle of ``cd -P`` leaves): the subshell is then outside, and the
    builtin ``pwd -P`` still answered ``.../results``, so the report was written outside."""
    camp, elsewhere = tmp_path / "camp", tmp_path / "elsewhere"
    (camp / "results").mkdir(parents=True)
    elsewhere.mkdir()
    moved = elsewhere / "moved"
    swap = (f'if [ -z "${{SWAPPED:-}}" ] && [[ $BASH_COMMAND == *"pwd -P"* ]]; then '
            f'SWAPPED=1; mv {camp}/results {moved}; mkdir {camp}/results; fi')
    res = _write_new(camp / "results" / "verify.json", swap)
    assert moved.is_dir(), "the swap never ran: the test proves nothing"
    assert list(moved.iterdir()) == [], "written outside the campaign"
    assert res.returncode != 0 and "became a symlink" in res.stderr, res
    assert list((camp / "results").iterdir()) == []


def test_write_new_never_waits_on_a_fifo_put_at_its_temporarys_name(tmp_path: Path) -> None:
    """Just before the temporary is opened, a FIFO replaces it (one process that can write the
    campaign): the job waited for a reader for good. Now the open never waits, the write is
    refused by name, and the FIFO, at the name the subshell made, is removed."""
    results = tmp_path / "camp" / "results"
    results.mkdir(parents=True)
    # the step that opens the temporary: bash's `<>` before the fifteenth pass, `dd` since
    plant = ('if [ -z "${PLANTED:-}" ] && '
             '[[ $BASH_COMMAND == "exec 3"* || $BASH_COMMAND == "dd of="* ]]; then '
             'PLANTED=1; rm -f -- "$tmp"; mkfifo -- "$tmp"; fi')
    try:
        res = _write_new(results / "verify.json", plant)
    except subprocess.TimeoutExpired:
        raise AssertionError("write_new waited on the FIFO for good") from None
    assert res.returncode != 0 and "not a" in res.stderr and "file" in res.stderr, res
    assert list(results.iterdir()) == []


def test_write_new_writes_with_the_umask_and_replaces_a_link_at_its_name(tmp_path: Path) -> None:
    """The plain case, beside the races: the file is written whole, with the mode the umask
    gives (``mktemp`` makes 0600), and a link at its name is replaced, never followed."""
    results, victim = tmp_path / "camp" / "results", tmp_path / "victim.json"
    results.mkdir(parents=True)
    victim.write_text("mine\n")
    (results / "verify.json").symlink_to(victim)
    script = (f"{_FUNC}\numask 022\n"
              f"printf '%s\\n' '{{\"ok\": 1}}' | write_new {results}/verify.json\n")
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                         check=False)
    assert res.returncode == 0, res.stderr
    out = results / "verify.json"
    assert not out.is_symlink() and out.read_text() == '{"ok": 1}\n'
    assert out.stat().st_mode & 0o777 == 0o644
    assert victim.read_text() == "mine\n"
    assert sorted(p.name for p in results.iterdir()) == ["verify.json"]


# The kit's real ``run`` with a ``main`` that has done its work (``SystemExit(0)``, as click
# ends), and a tracer that, at each line ``run`` and ``_interrupted`` then execute, calls the
# handler the kit installed for the next signal of a storm with that frame, as the interpreter
# calls a handler at an instruction of that frame; whether a handler raised is recorded, not
# let through (a tracer's exception would unset it).
_ENDED_STORM = r'''
import json, signal, sys
import kvprefetch.cli as cli
state = {"ended": False}
def done():
    state["ended"] = True
    raise SystemExit(0)
cli.main = done
storm = [signal.SIGTERM] + [signal.SIGINT] * 30
raised = []
def tracer(frame, event, arg):
    if frame.f_globals is not vars(cli) or frame.f_code.co_name not in ("run", "_interrupted"):
        return None
    if event == "line" and state["ended"] and storm:
        s = storm.pop(0)
        try:
            signal.getsignal(s)(s, frame)
        except BaseException as e:
            raised.append([signal.Signals(s).name, type(e).__name__, frame.f_lineno])
    return tracer
sys.settrace(tracer)
try:
    cli.run()
except SystemExit as e:
    sys.settrace(None)
    print(json.dumps({"raised": raised, "code": e.code, "sent": 31 - len(storm)}))
'''


def test_a_stop_after_the_command_ended_is_counted_never_raised() -> None:
    """TERM, INT, INT landing as a real ``apply`` ended gave, once in about 230 runs,
    "SystemExit: 0 ... During handling of the above exception, another exception occurred ...
    kvprefetch.errors.Terminated: 15" and exit 1: the handlers raised in ``run``'s own
    ``except``/``finally``, which only report how the command ended. Now a stop there is
    counted, never raised, and the command's own status stands."""
    import json
    import os
    import sys

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    res = subprocess.run([sys.executable, "-c", _ENDED_STORM], capture_output=True, text=True,
                         timeout=60, env=env, check=False)
    assert "Traceback" not in res.stderr, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["sent"] >= 3, got  # the storm met run's ending lines: the test proves something
    assert got["raised"] == [], got
    assert got["code"] in (0, None), got
