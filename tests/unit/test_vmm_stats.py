"""Latency histograms of the VMM cache (pure logic)."""

from __future__ import annotations

import math
import threading

import pytest

from kvprefetch.vmm.stats import LatencyHistogram, bucket_of, percentile


def test_percentile_interpolates() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert percentile([1.0, 3.0], 0) == 1.0 and percentile([1.0, 3.0], 100) == 3.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match="percentile 101 is outside"):
        percentile([1.0], 101)


def test_buckets_are_powers_of_two_microseconds() -> None:
    assert bucket_of(0.5) == 0
    assert bucket_of(1.0) == 1 and bucket_of(1.99) == 1
    assert bucket_of(2.0) == 2 and bucket_of(1023.0) == 10 and bucket_of(1024.0) == 11


def test_histogram_summary() -> None:
    h = LatencyHistogram("map")
    for us in (3, 5, 40, 41, 1000):
        h.record(us * 1e-6)
    s = h.summary()
    assert s.count == 5
    assert s.min_us == pytest.approx(3) and s.max_us == pytest.approx(1000)
    assert s.mean_us == pytest.approx(1089 / 5)
    assert s.p50_us == pytest.approx(40)
    assert sum(c for _, c in s.buckets) == 5
    assert dict(s.buckets)[64.0] == 2          # 40 and 41 µs in [32, 64)
    with pytest.raises(ValueError, match="a latency cannot be"):
        h.record(-1.0)


def test_empty_histogram_summary_is_nan_not_an_error() -> None:
    s = LatencyHistogram("x").summary()
    assert s.count == 0 and math.isnan(s.p50_us) and math.isnan(s.mean_us)


def test_histogram_is_thread_safe() -> None:
    h = LatencyHistogram("t")

    def work() -> None:
        for _ in range(5000):
            h.record(1e-6)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = h.summary()
    assert s.count == 20000 and sum(c for _, c in s.buckets) == 20000
