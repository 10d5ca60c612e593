"""``runner.run``'s ``timeout`` holds in wall time, however the child keeps its output: it
was ``proc.wait``'s, which began only once the output was closed, so ``slurm status`` waited for
ever on an ``scontrol`` that never answered (issue 41, the twenty-first and twenty-second
passes left it open). Real programs (sh, sleep): nothing is mocked but the length of the kit's
Slurm timeout in the last test."""

from __future__ import annotations

import gc
import threading
import time
import warnings
from pathlib import Path

import pytest

from kvprefetch import runner
from kvprefetch.errors import CommandError


@pytest.mark.parametrize(("script", "why"), [
    ("echo asked; exec sleep 60", "the child hangs with its output open"),
    ("echo asked; sleep 60 & exit 0", "the child ends; a process below it keeps the output"),
])
def test_a_timeout_holds_while_a_child_keeps_its_output_open(script: str, why: str) -> None:
    t0 = time.monotonic()
    done = runner.run(["sh", "-c", script], echo=False, check=False, timeout=1.0)
    assert time.monotonic() - t0 < 15, why
    assert done.returncode != 0, why
    assert done.output.startswith("asked"), why
    with pytest.raises(CommandError, match="had not finished after 1 s"):
        runner.run(["sh", "-c", script], echo=False, timeout=1.0)


def test_the_output_a_process_below_kept_is_closed_when_it_ends() -> None:
    """The reader thread the run left blocked ends when the process below the child closes the
    output (here 2 s after): the stream is closed then, not left to the garbage collector, whose
    ResourceWarning surfaced as an unraisable exception in whichever test ran 60 s later (CI's
    real-Slurm test, after the test above)."""
    before = set(threading.enumerate())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        done = runner.run(["sh", "-c", "echo asked; sleep 2 & exit 0"], echo=False,
                          check=False, timeout=0.5)
        assert done.returncode == runner.TIMED_OUT
        left = [t for t in threading.enumerate() if t not in before]
        assert left, "no reader was left blocked: this test shows nothing"
        for t in left:
            t.join(20)
        gc.collect()
    leaks = [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)]
    assert not leaks, leaks


def test_a_child_that_ends_in_time_is_as_without_a_timeout() -> None:
    done = runner.run(["sh", "-c", "echo one; echo two; exit 3"], echo=False, check=False,
                      timeout=30.0)
    assert (done.returncode, done.output) == (3, "one\ntwo\n")


def test_slurm_status_gives_up_on_an_scontrol_that_never_answers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job is UNKNOWN, as when the controller does not answer (``_once_unreachable`` then
    asks no more). The 60 s the kit allows is shortened to 1 s here (a constant patched: waiting
    it out is possible but slow); the scontrol is a real program that never answers."""
    from kvprefetch.slurm import cluster

    (tmp_path / "scontrol").write_text("#!/bin/sh\nexec sleep 600\n")
    (tmp_path / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setattr(cluster, "QUERY_TIMEOUT_S", 1.0)
    t0 = time.monotonic()
    [state] = cluster.job_states("bench", "4242")
    assert time.monotonic() - t0 < 15
    assert state.state == "UNKNOWN" and state.reason.startswith(cluster.SCONTROL_FAILED)
    assert "had not finished after 1 s" in state.reason
