"""Progress of a long compile: ninja's ``[n/N]`` counters, the time elapsed, and an estimate of
the time left, as one line per tree that the builder prints on every counter and, between
them, on a heartbeat (one nvcc of a full launcher source runs for minutes without a line).

The estimate comes from the last finished build of the same tree and instantiation set (its
manifest's ``seconds``) when there is one, else from the pace of the edges done so far. Pure
apart from the heartbeat thread; the clock is a parameter."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
            data = json.loads(m.read_text())
            secs = float(data["seconds"])
            same = {k: data.get(k) for k in ("head_sizes", "block_sizes", "kv_dtypes")} == \
                {k: selection.get(k) for k in ("head_sizes", "block_sizes", "kv_dtypes")}
        except (OSError, ValueError, KeyError, TypeError):
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

    def update(self, done: int, total: int) -> None:
        self.done, self.total = done, total

    def remaining(self, now: float) -> float | None:
        elapsed = now - self.started
        if self.expected_s is not None:
            return max(0.0, self.expected_s - elapsed)
        if self.total and self.done:
            return elapsed / self.done * (self.total - self.done)
        return None

    def line(self, now: float) -> str:
        elapsed = now - self.started
        count = f"[{self.done}/{self.total}]" if self.total else "[0/?]"
        left = self.remaining(now)
        if left is None:
            eta = "no estimate yet"
        elif left == 0 and self.expected_s is not None:
            eta = f"past the last build's {clock(self.expected_s)}"
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
