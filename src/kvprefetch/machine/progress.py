"""Progress of a long compile: ninja's ``[n/N]`` counters, the time elapsed, and an estimate of
the time left, as one line per tree that the builder prints on every counter and, between
them, on a heartbeat (one nvcc of a full launcher source runs for minutes without a line).

The estimate comes from the last finished build of the same tree and instantiation set (its
manifest's ``seconds``) when there is one, else from the pace of the nvcc edges done so far.
Only those count: a tree's build.ninja has a few nvcc edges of many minutes each (a launcher
source with every instantiation) and then a C++ file and the link, seconds each, so the pace
of all edges said "about 57:10 left" one nvcc edge into a tree that took 22 minutes (issue 42).
ninja runs ready edges in the order of build.ninja, which lists the nvcc edges first, so
with one job at a time the first ``heavy`` edges to finish are the nvcc ones; with several
jobs at a time the light ones finish first and are not counted. Pure apart from the heartbeat
thread; the clock is a parameter."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..reading import load_json

HEARTBEAT_S = 30.0


def clock(seconds: float) -> str:
    """``200`` -> ``3:20``; an hour or more as ``1:02:03``."""
    s = max(0, round(seconds))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def previous_seconds(build_root: Path, selection: dict[str, Any]) -> float | None:
    """How long the newest finished build under ``build_root`` (``build/<tree>``) with the same
    instantiation set took, from its manifest; None when there is none."""
    best: tuple[float, float] | None = None
    for m in build_root.glob("*/manifest.json"):
        try:
            data = load_json(m)
            secs = float(data["seconds"])
            if not math.isfinite(secs):
                # 1e999 (JSON's way to say infinity) made every progress line's ETA an
                # OverflowError (round(inf)) that ended the build with a traceback at ninja's
                # first line (issue 41, the seventeenth hostile pass): no duration, no record
                continue
            same = {k: data.get(k) for k in ("head_sizes", "block_sizes", "kv_dtypes")} == \
                {k: selection.get(k) for k in ("head_sizes", "block_sizes", "kv_dtypes")}
        except (OSError, ValueError, KeyError, TypeError, OverflowError):
            # OverflowError: a 400-digit integer, which float() cannot hold, was a traceback
            # at the build's first progress line (issue 41, the nineteenth hostile pass)
            continue
        if same and secs > 0 and (best is None or m.stat().st_mtime > best[0]):
            best = (m.stat().st_mtime, secs)
    return best[1] if best else None


@dataclass
class CompileProgress:
    """One tree's build: what ninja has reported and when the tree's build started."""

    started: float
    expected_s: float | None = None   # a previous build's duration, if known
    done: int = 0
    total: int | None = None
    heavy: int | None = None          # the nvcc edges among ninja's; None: every edge counts
    light_first: bool = False         # several jobs at a time: the light edges finish first

    def update(self, done: int, total: int) -> None:
        self.done, self.total = done, total

    def heavy_done(self) -> tuple[int, int]:
        """(nvcc edges finished, nvcc edges in all), from ninja's count of finished edges."""
        total = self.total or 0
        heavy = total if self.heavy is None else min(self.heavy, total)
        done = self.done
        if self.light_first:
            done -= max(0, total - heavy - 1)  # every light edge but the link, already done
        return max(0, min(done, heavy)), heavy

    def remaining(self, now: float) -> float | None:
        elapsed = now - self.started
        if self.expected_s is not None:
            return max(0.0, self.expected_s - elapsed)
        done, heavy = self.heavy_done()
        if done >= heavy > 0:
            return 0.0  # the nvcc edges are done; what is left takes seconds
        if self.total and done:
            return elapsed / done * (heavy - done)
        return None

    def line(self, now: float) -> str:
        elapsed = now - self.started
        count = f"[{self.done}/{self.total}]" if self.total else "[0/?]"
        left = self.remaining(now)
        if left is None:
            eta = "no estimate yet"
        elif left == 0 and self.expected_s is not None:
            eta = f"past the last build's {clock(self.expected_s)}"
        elif left == 0:
            eta = "the nvcc compiles are done, linking"
        else:
            basis = "as the last build" if self.expected_s is not None else "at this pace"
            eta = f"about {clock(left)} left ({basis})"
        return f"compiling {count} {clock(elapsed)} elapsed, {eta}"


@contextmanager
def heartbeat(fn: Callable[[], None], every: float = HEARTBEAT_S) -> Iterator[None]:
    """Call ``fn`` every ``every`` seconds in a daemon thread while the block runs."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every):
            fn()

    t = threading.Thread(target=loop, name="kvprefetch-progress", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()
