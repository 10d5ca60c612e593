"""The persistent mapping thread's submit/wait protocol (real threads, no mocks)."""

from __future__ import annotations

import threading
import time

import pytest

from kvprefetch.vmm.worker import MappingWorker


def test_init_runs_once_on_the_worker_thread() -> None:
    seen: list[int] = []
    w = MappingWorker(lambda: seen.append(threading.get_ident()))
    try:
        assert seen == [w.thread_ident] and seen[0] != threading.get_ident()
    finally:
        w.stop()


def test_wait_never_misses_a_just_submitted_job() -> None:
    # The reference implementation set its "running" flag inside the new thread, so a wait that
    # came first returned at once. Here busy is set by submit() itself.
    w = MappingWorker(lambda: None)
    try:
        for i in range(200):
            done = threading.Event()

            def job(done: threading.Event = done) -> None:
                time.sleep(0.0005)
                done.set()

            w.submit(job)
            assert w.wait() is None
            assert done.is_set(), f"wait returned before job {i} finished"
        assert w.jobs_run == 200
    finally:
        w.stop()


def test_job_errors_come_back_exactly_once() -> None:
    w = MappingWorker(lambda: None)
    try:
        w.submit(lambda: (_ for _ in ()).throw(RuntimeError("boom")))
        err = w.wait()
        assert isinstance(err, RuntimeError) and str(err) == "boom"
        assert w.wait() is None
    finally:
        w.stop()


def test_submit_while_busy_is_refused() -> None:
    w = MappingWorker(lambda: None)
    gate = threading.Event()
    try:
        w.submit(gate.wait)
        with pytest.raises(RuntimeError, match="already has a job"):
            w.submit(lambda: None)
        gate.set()
        assert w.wait() is None
    finally:
        gate.set()
        w.stop()


def test_init_failure_is_raised_by_the_constructor() -> None:
    def bad() -> None:
        raise OSError("no context")

    with pytest.raises(OSError, match="no context"):
        MappingWorker(bad)


def test_stop_finishes_the_running_job_and_refuses_more() -> None:
    w = MappingWorker(lambda: None)
    out: list[int] = []
    w.submit(lambda: (time.sleep(0.01), out.append(1)))
    w.stop()
    assert out == [1] and not w.alive
    with pytest.raises(RuntimeError, match="stopped"):
        w.submit(lambda: None)
