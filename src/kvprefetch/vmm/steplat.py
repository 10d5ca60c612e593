"""``step()`` latency with and without the mapping worker, per page and per layer (GPU).

A decode loop is fast-forwarded to the steps that matter: for each page boundary ``m``, one step
at ``m·tpp`` tokens (no new page needed now; the worker maps page ``m+1`` for the next token) and
one at ``m·tpp + 1`` (the *crossing* step, which needs page ``m+1``). Between steps the GPU runs a
``torch.cuda._sleep`` kernel of ``compute_ms`` and the host waits for it, as a serving loop waits
for sampled tokens. Synchronously (no worker) the crossing step maps ``slots · n_tensors`` pages on
the critical path; with the worker it should find them mapped and return in microseconds, unless
the compute is too short to hide the mapping (``compute_ms=0`` shows that case).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from .layout import KVCacheSpec, Layout
from .stats import percentile


@dataclass(frozen=True)
class StepLatencyResult:
    layout: str
    mode: str                  # "sync" (no worker) or "async"
    compute_ms: float
    slots: int
    layers: int
    tokens_per_group: int
    pages_per_crossing: int
    crossings: int
    cross_us_median: float
    cross_us_p90: float
    pre_us_median: float
    wait_us_median: float      # crossing steps: time spent waiting for the worker
    sync_groups_on_crossings: int
    cross_us_per_page: float
    cross_us_per_layer: float
    driver_us: dict[str, dict[str, float]]


_cycles_per_ms: float | None = None


def gpu_compute(ms: float) -> None:
    """Keep the GPU busy for about ``ms`` and wait for it (the host's per-step sync)."""
    import torch

    global _cycles_per_ms
    if ms <= 0:
        torch.cuda.synchronize()
        return
    if _cycles_per_ms is None:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000_000)
        a.record()
        torch.cuda._sleep(20_000_000)
        b.record()
        b.synchronize()
        _cycles_per_ms = 20_000_000 / max(a.elapsed_time(b), 1e-3)
    torch.cuda._sleep(int(_cycles_per_ms * ms))
    torch.cuda.synchronize()


def run_step_latency(layout: Layout, async_mapping: bool, compute_ms: float, slots: int = 2,
                     layers: int = 32, kv_heads: int = 8, head_dim: int = 128,
                     max_context: int = 16384, crossings: int = 12) -> StepLatencyResult:
    from .cache import VirtualKVCache

    spec = KVCacheSpec(num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim,
                       max_batch=slots, max_context=max_context, layout=layout)
    cache = VirtualKVCache(spec, async_mapping=async_mapping, eager_groups=0)
    try:
        g = cache.geometry
        tpp = g.page_size // g.token_bytes
        crossings = min(crossings, (max_context - 1) // tpp)
        ids = [cache.alloc_reqid() for _ in range(slots)]
        cache.step({i: 1 for i in ids})
        gpu_compute(compute_ms)
        pre, cross, waits = [], [], []
        sync_groups = 0
        for m in range(1, crossings + 1):
            t0 = time.perf_counter()
            cache.step({i: m * tpp for i in ids})
            pre.append((time.perf_counter() - t0) * 1e6)
            gpu_compute(compute_ms)
            t0 = time.perf_counter()
            r = cache.step({i: m * tpp + 1 for i in ids})
            cross.append((time.perf_counter() - t0) * 1e6)
            waits.append(r.wait_us)
            sync_groups += r.sync_groups
            gpu_compute(compute_ms)
        cache.wait()
        st = cache.stats()
    finally:
        cache.teardown()
    pages = slots * g.n_tensors
    cross_sorted = sorted(cross)
    med = statistics.median(cross)
    driver = {n: {"count": h.count, "p50_us": h.p50_us, "p90_us": h.p90_us, "mean_us": h.mean_us}
              for n, h in st.latency.items() if n in ("create", "map", "set_access", "worker_job")}
    return StepLatencyResult(
        layout=layout.value, mode="async" if async_mapping else "sync", compute_ms=compute_ms,
        slots=slots, layers=layers, tokens_per_group=tpp, pages_per_crossing=pages,
        crossings=crossings, cross_us_median=med, cross_us_p90=percentile(cross_sorted, 90),
        pre_us_median=statistics.median(pre), wait_us_median=statistics.median(waits),
        sync_groups_on_crossings=sync_groups, cross_us_per_page=med / pages,
        cross_us_per_layer=med / (slots * layers), driver_us=driver,
    )


def run_step_latency_suite(compute_ms: float = 8.0,
                           say: Callable[[str], None] = print) -> list[dict[str, Any]]:
    out = []
    runs = [(Layout.PER_LAYER, False, compute_ms), (Layout.PER_LAYER, True, compute_ms),
            (Layout.PER_LAYER, True, 0.0), (Layout.PER_LAYER, True, 3 * compute_ms),
            (Layout.TENSOR_SLICING, False, compute_ms), (Layout.TENSOR_SLICING, True, compute_ms)]
    for layout, mode, cms in runs:
        r = run_step_latency(layout, mode, cms)
        out.append(asdict(r))
        say(f"step {r.layout:14s} {r.mode:5s} compute {r.compute_ms:4.1f} ms: crossing step "
            f"{r.cross_us_median:9.1f} us (p90 {r.cross_us_p90:9.1f}), {r.pages_per_crossing} "
            f"pages -> {r.cross_us_per_page:6.2f} us/page, {r.cross_us_per_layer:7.2f} us/layer; "
            f"wait {r.wait_us_median:8.1f} us; sync groups {r.sync_groups_on_crossings}")
    return out
