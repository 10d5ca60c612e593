"""The statistics of timed samples: ``quantile`` (numpy's default interpolation), ``summarize``
into ``Stats`` (median, quartiles, min, max) and the per-round paired ratio. Pure; every
benchmark's report uses them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .schema import Stats as StatsFields


@dataclass(frozen=True)
class Stats:
    median: float
    p25: float
    p75: float
    min: float
    max: float
    n: int

    def to_dict(self) -> StatsFields:
        return {"median": self.median, "p25": self.p25, "p75": self.p75, "min": self.min,
                "max": self.max, "n": self.n}


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        raise ValueError("no samples")
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(samples: Sequence[float]) -> Stats:
    s = sorted(samples)
    return Stats(median=quantile(s, 0.5), p25=quantile(s, 0.25), p75=quantile(s, 0.75),
                 min=s[0], max=s[-1], n=len(s))


def paired_speedups(baseline: Sequence[float], variant: Sequence[float]) -> list[float]:
    """Per-round ratio baseline_time / variant_time (> 1 means the variant is faster)."""
    if len(baseline) != len(variant):
        raise ValueError("samples must be paired round by round")
    return [b / v for b, v in zip(baseline, variant, strict=True)]
