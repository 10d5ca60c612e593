"""The pure parts of the VMM benchmark: shape planning, L2 rotation, summaries and the printed
table (the GPU parts run on the H200 through scripts/device/vmm.sh)."""

from __future__ import annotations

import math
from dataclasses import asdict

import pytest

from kvprefetch.vmm.bench import DecodeResult, render_summary
from kvprefetch.vmm.shapes import DecodeConfig, layers_to_rotate, plan_shapes
from kvprefetch.vmm.steplat import StepLatencyResult
from kvprefetch.vmm.timing import summarize

MiB = 1 << 20


def test_layers_to_rotate_exceeds_l2_by_the_factor() -> None:
    assert layers_to_rotate(2 * MiB, 60 * MiB, 4.0, 128) == 120
    assert layers_to_rotate(8 << 30, 60 * MiB, 4.0, 128) == 1
    assert layers_to_rotate(1, 60 * MiB, 4.0, 128) == 128          # capped
    for per_layer in (3 * MiB, 17 * MiB, 100 * MiB):
        n = layers_to_rotate(per_layer, 60 * MiB, 4.0, 128)
        assert n * per_layer >= 240 * MiB > (n - 1) * per_layer


def test_plan_shapes_counts_bytes_and_trims_what_does_not_fit() -> None:
    cfg = DecodeConfig(batches=(1, 128), contexts=(512, 16384))
    plans, trimmed = plan_shapes(cfg, 60 * MiB, None)
    assert [(p.batch, p.context) for p in plans] == [(1, 512), (1, 16384), (128, 512),
                                                     (128, 16384)]
    big = plans[-1]
    assert big.kv_bytes_per_call == 2 * 128 * 16384 * 8 * 128 * 2
    assert big.bytes_per_variant == big.layers * 2 * 128 * 16384 * 2048
    small = plans[0]  # 512 tokens = 1 MB per slot, padded to one 2 MB page per tensor
    assert small.bytes_per_variant == small.layers * 2 * 2 * MiB
    plans, trimmed = plan_shapes(cfg, 60 * MiB, free_bytes=20 << 30)
    assert (128, 16384) not in [(p.batch, p.context) for p in plans]
    assert len(trimmed) == 1 and "B=128 S=16384" in trimmed[0]


def test_summarize() -> None:
    med, spread = summarize([1.0, 1.1, 0.9, 1.0])
    assert med == 1.0 and spread == pytest.approx(0.2)
    assert math.isnan(summarize([0.0, 0.0])[1])


def test_render_summary_of_a_full_report() -> None:
    step = StepLatencyResult(
        layout="per-layer", mode="sync", compute_ms=8.0, slots=2, layers=32,
        tokens_per_group=1024, pages_per_crossing=128, crossings=12, cross_us_median=5000.0,
        cross_us_p90=6000.0, pre_us_median=20.0, wait_us_median=0.0,
        sync_groups_on_crossings=24, cross_us_per_page=39.06, cross_us_per_layer=78.1,
        driver_us={"map": {"count": 10, "p50_us": 4.0, "p90_us": 5.0, "mean_us": 4.2}},
    )
    dec = DecodeResult(
        batch=8, context=4096, layers=2, kv_bytes_per_call=128 * MiB, backend="FLASH_ATTENTION",
        vmm_ms=0.0401, malloc_ms=0.0400, vmm_spread=0.01, malloc_spread=0.02, ratio=1.0025,
        within_3pct=True, vmm_gbps=3300.0, malloc_gbps=3310.0, vmm_frac_copy_bw=0.77,
        malloc_frac_copy_bw=0.78, bitwise_equal=True, default_deterministic=True,
        ref_rel_err=2.5e-4, vmm_frac_read_bw=0.71, flash_ratio=1.001, flash_bitwise_equal=True,
    )
    report = {"step_latency": [asdict(step)],
              "decode": {"copy_bandwidth": {"gbps": 4300.0, "read_gbps": 4650.0},
                         "device": {"name": "NVIDIA H200"},
                         "results": [asdict(dec)]}}
    text = render_summary(report)
    assert "crossing    5000.0 us" in text and "39.06 us/page" in text and "map 4.0" in text
    assert "FLASH_ATTENTION" in text and "1.0025" in text and "77.0%" in text
    assert "within 3%: 1/1" in text and "read-only 4650 GB/s" in text
    row = next(line for line in text.splitlines() if "FLASH_ATTENTION" in line and "4096" in line)
    assert row.split()[-6:] == ["71.0%", "y", "y", "2.5e-04", "1.0010", "y"]
    assert "forced FLASH_ATTENTION ratio vmm/malloc: min 1.0010" in text
