"""Accounting: latency histograms (log2 buckets in microseconds plus exact percentiles over the most
recent samples) and the ``VmmStats`` snapshot a cache reports. Pure Python, thread-safe."""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass, field

_SAMPLE_CAP = 100_000


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100], of an already sorted list."""
    if not sorted_values:
        return math.nan
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is outside [0, 100]")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] * (1.0 - frac) + sorted_values[hi] * frac


def bucket_of(us: float) -> int:
    """Bucket ``k`` holds values in ``[2**(k-1), 2**k)`` µs; bucket 0 holds everything
    below 1 µs."""
    if us < 1.0:
        return 0
    return math.floor(math.log2(us)) + 1


@dataclass(frozen=True)
class HistogramSummary:
    name: str
    count: int
    total_us: float
    mean_us: float
    min_us: float
    max_us: float
    p50_us: float
    p90_us: float
    p99_us: float
    buckets: list[tuple[float, int]] = field(default_factory=list)  # (upper bound µs, count)


class LatencyHistogram:
    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._buckets: dict[int, int] = {}
        self._samples: deque[float] = deque(maxlen=_SAMPLE_CAP)
        self.count = 0
        self.total_us = 0.0
        self.min_us = math.inf
        self.max_us = 0.0

    def record(self, seconds: float) -> None:
        us = seconds * 1e6
        if us < 0 or math.isnan(us):
            raise ValueError(f"{self.name}: a latency cannot be {seconds!r} s")
        with self._lock:
            k = bucket_of(us)
            self._buckets[k] = self._buckets.get(k, 0) + 1
            self._samples.append(us)
            self.count += 1
            self.total_us += us
            self.min_us = min(self.min_us, us)
            self.max_us = max(self.max_us, us)

    def summary(self) -> HistogramSummary:
        with self._lock:
            values = sorted(self._samples)
            buckets = [(float(2 ** k) if k else 1.0, c) for k, c in sorted(self._buckets.items())]
            n = self.count
            return HistogramSummary(
                name=self.name, count=n, total_us=self.total_us,
                mean_us=self.total_us / n if n else math.nan,
                min_us=self.min_us if n else math.nan, max_us=self.max_us if n else math.nan,
                p50_us=percentile(values, 50), p90_us=percentile(values, 90),
                p99_us=percentile(values, 99), buckets=buckets,
            )


@dataclass(frozen=True)
class VmmStats:
    """A snapshot of one cache's accounting."""

    layout: str
    page_size: int
    granularity: int
    n_tensors: int
    group_bytes: int
    va_reserved_bytes: int
    mapped_pages: int
    physical_mapped_bytes: int
    pool_pages: int              # live physical handles (mapped + free in the pool)
    pool_free_pages: int         # created, currently unmapped
    pool_bytes: int              # physical memory committed: pool_pages · page_size
    active_slots: int
    slot_groups: list[int]       # mapped groups per slot
    counters: dict[str, int]
    latency: dict[str, HistogramSummary]
