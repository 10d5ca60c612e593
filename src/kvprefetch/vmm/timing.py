"""The vmm bench's measuring tools: the device's facts, the copy and read bandwidth that give the
HBM floor, which SDPA backend torch picks, a call captured as a CUDA graph, graphs timed round
by round with the order alternating, and the float64 reference an output is checked against.
torch is imported inside each function, so importing this module needs no GPU."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from .shapes import L2_BYTES_IF_UNKNOWN


def summarize(samples: Sequence[float]) -> tuple[float, float]:
    """(median, (max - min) / median)."""
    med = statistics.median(samples)
    return med, (max(samples) - min(samples)) / med if med else math.nan


def device_facts() -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(0)
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    free, total = torch.cuda.mem_get_info()
    return {"name": props.name, "sm_count": props.multi_processor_count,
            "capability": f"{props.major}.{props.minor}", "l2_bytes": l2 or L2_BYTES_IF_UNKNOWN,
            "l2_reported": bool(l2), "free_bytes": free, "total_bytes": total,
            "torch": torch.__version__, "cuda": torch.version.cuda}


def measure_copy_bandwidth(nbytes: int = 1 << 31, iters: int = 10) -> dict[str, float]:
    """The copy figure of ``bench kernel`` (``bench.device.measure_copy_bandwidth``: device to
    device, bytes read plus bytes written, median of ``iters``), in GB/s (1e9), and a read-only
    pass (``sum`` over the same bytes as float16, since decode attention mostly reads)."""
    import torch

    from ..bench.device import measure_copy_bandwidth as copy_bytes_per_s

    bps = copy_bytes_per_s(nbytes, iters)
    x = torch.empty(nbytes // 2, dtype=torch.float16, device="cuda").normal_()
    rmed, rspread = _read_ms(x, iters)
    del x
    torch.cuda.empty_cache()
    return {"bytes": nbytes, "median_ms": 2 * nbytes / bps * 1e3, "gbps": bps / 1e9,
            "read_median_ms": rmed, "read_spread": rspread,
            "read_gbps": nbytes / (rmed * 1e-3) / 1e9}


def _read_ms(x: Any, iters: int) -> tuple[float, float]:
    """Median and spread (ms) of ``x.sum()``, timed as bench kernel times (CUDA events)."""
    from ..bench.device import CudaBackend

    def read() -> None:
        x.sum()

    read()
    be = CudaBackend()
    return summarize([be.time_s(read) * 1e3 for _ in range(iters)])


def sdpa_backend(q: Any, k: Any, v: Any) -> str:
    import torch

    try:
        choice = int(torch._fused_sdp_choice(q, k, v, enable_gqa=True))
    except Exception as exc:  # noqa: BLE001 - a private API: report why it could not say
        return f"unknown ({type(exc).__name__})"
    try:
        from torch.nn.attention import SDPBackend

        return str(SDPBackend(choice).name)
    except (ImportError, ValueError):
        return f"backend #{choice}"


def graph_of(fn: Callable[[], Any]) -> tuple[Any, Any]:
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def time_interleaved(graphs: dict[str, Any], calls_per_replay: int, rounds: int,
                     sample_ms: float) -> dict[str, list[float]]:
    """ms per call for each graph, sampled round by round, order alternating."""
    import torch

    names = list(graphs)
    for g in graphs.values():
        g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    graphs[names[0]].replay()
    b.record()
    b.synchronize()
    est = max(a.elapsed_time(b), 1e-3)
    reps = max(3, min(500, math.ceil(sample_ms / est)))
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for n in order:
            a.record()
            for _ in range(reps):
                graphs[n].replay()
            b.record()
            b.synchronize()
            out[n].append(a.elapsed_time(b) / (reps * calls_per_replay))
    return out


def reference_rel_err(q: Any, k: Any, v: Any, out: Any, n: int) -> float:
    """‖out − exact‖/‖exact‖ over the first ``n`` sequences, exact in float64 (GQA expanded)."""
    import torch

    group = q.shape[1] // k.shape[2]
    kk = k[:n].transpose(1, 2).double().repeat_interleave(group, dim=1)
    vv = v[:n].transpose(1, 2).double().repeat_interleave(group, dim=1)
    w = torch.softmax(q[:n].double() @ kk.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
    exact = w @ vv
    return float((out[:n].double() - exact).norm() / exact.norm())
