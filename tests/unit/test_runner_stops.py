"""``runner.stops_held``: a block a stop must not break into (a private folder's removal),
held for the main thread, where signal handlers run and raise."""

from __future__ import annotations

import threading

import pytest

from kvprefetch import runner


def test_a_stop_inside_a_held_block_is_raised_when_the_block_ends() -> None:
    ran: list[str] = []

    def held() -> None:
        with runner.stops_held():
            runner.raise_when_safe(KeyboardInterrupt())  # as a signal's handler does
            ran.append("the rest of the block")

    with pytest.raises(KeyboardInterrupt):
        held()
    assert ran == ["the rest of the block"]


def test_a_worker_threads_held_block_never_holds_the_main_threads_stop() -> None:
    """Two trees build at once, each in a worker thread with its own private folder: a worker
    inside its folder's removal held the main thread's Ctrl-C, which then surfaced in the
    worker when its block ended (the merge of the fifteenth pass). The main thread's stop is
    raised at once, in the main thread."""
    inside, release = threading.Event(), threading.Event()
    raised_in_worker: list[KeyboardInterrupt] = []

    def worker() -> None:
        try:
            with runner.stops_held():
                inside.set()
                release.wait(10)
        except KeyboardInterrupt as exc:  # what must not happen: the main thread's stop here
            raised_in_worker.append(exc)

    t = threading.Thread(target=worker)
    t.start()
    try:
        assert inside.wait(10)
        with pytest.raises(KeyboardInterrupt):
            runner.raise_when_safe(KeyboardInterrupt())
    finally:
        release.set()
        t.join(10)
    assert raised_in_worker == []
    assert runner._DEFERRED == []
