"""``bench kernel``'s result rows: the launch plan a shape was timed with (``LaunchPlan``), each
variant's statistics (``VariantResult``), one shape's row with its status (``ShapeResult``,
written into the result JSON by ``to_dict``) and ``build_results``, which turns per-round
samples into a row. Pure (unit-tested without a GPU); bench/kernel.py measures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..kernels.kvinputs import kv_bytes_read
from .matrix import BenchShape
from .schema import LaunchPlanFields, ShapeRow
from .schema import VariantResult as VariantFields
from .stats import Stats, paired_speedups, summarize
from .vllm_call import Launch, launch_attn


@dataclass(frozen=True)
class LaunchPlan:
    layers: int            # distinct KV caches rotated
    launches: int          # decode calls per graph replay
    replays: int           # graph replays per timed sample
    bytes_per_layer: int   # K+V bytes allocated per layer
    est_launch_us: float

    def to_dict(self) -> LaunchPlanFields:
        return {"layers": self.layers, "launches": self.launches, "replays": self.replays,
                "bytes_per_layer": self.bytes_per_layer, "est_launch_us": self.est_launch_us}


@dataclass(frozen=True)
class VariantResult:
    name: str
    time_us: Stats
    speedup: Stats | None
    bw_fraction: float
    equal_to_baseline: bool | None
    nan_free: bool


STATUSES = ("measured", "skipped", "failed", "not run")


@dataclass(frozen=True)
class ShapeResult:
    """One shape in one mode. ``status`` is measured, skipped (decided before allocating
    anything: missing instantiation, a vLLM launch limit, not enough memory), failed (an error
    while running it) or not run (an earlier CUDA error left the context unusable); ``error`` is
    the reason for every status but measured."""

    shape: BenchShape
    mode: str
    plan: LaunchPlan | None
    bytes_moved: int
    variants: tuple[VariantResult, ...]
    bitwise_equal: bool | None
    error: str = ""
    status: str = ""  # "" = measured without an error, skipped with one
    timing: str = "graph"
    launch: Launch | None = None  # what the kernel was given (None: not planned that far)
    step: int | None = None       # the step's index in a sample

    def __post_init__(self) -> None:
        if not self.status:
            object.__setattr__(self, "status", "skipped" if self.error else "measured")
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {self.status!r}")
        if (self.status == "measured") == bool(self.error):
            raise ValueError("a measured shape has no error; any other status needs its reason")

    def to_dict(self) -> ShapeRow:
        # The KV the launch reads: the real rows' blocks, one block per pad row.
        kv = (kv_bytes_read(launch_attn(self.shape.attn, self.launch), self.launch.seq_lens)
              if self.launch else kv_bytes_read(self.shape.attn, self.shape.seq_lens))
        variants: dict[str, VariantFields] = {
            v.name: {"time_us": v.time_us.to_dict(),
                     "speedup": v.speedup.to_dict() if v.speedup else None,
                     "bw_fraction": v.bw_fraction, "equal_to_baseline": v.equal_to_baseline,
                     "nan_free": v.nan_free}
            for v in self.variants}
        d: ShapeRow = {**self.shape.to_dict(), "label": self.shape.label, "mode": self.mode,
                       "timing": self.timing, "bytes_moved": self.bytes_moved, "kv_bytes": kv,
                       "bitwise_equal": self.bitwise_equal, "status": self.status,
                       "error": self.error}
        if self.launch is not None:
            d["launch"] = self.launch.to_dict()
        if self.step is not None:
            d["step"] = self.step
        d["plan"] = self.plan.to_dict() if self.plan else None
        d["variants"] = variants
        return d


def build_results(shape: BenchShape, mode: str, plan: LaunchPlan, bytes_moved: int,
                  names: Sequence[str], samples: dict[str, list[float]], copy_bw: float,
                  equal: dict[str, bool], nan_free: dict[str, bool],
                  timing: str = "graph", launch: Launch | None = None) -> ShapeResult:
    """Turn per-round samples (us per call) into a result row; ``names[0]`` is the baseline."""
    base = samples[names[0]]
    rows = []
    for name in names:
        t = summarize(samples[name])
        sp = None if name == names[0] else summarize(paired_speedups(base, samples[name]))
        bw = bytes_moved / (t.median * 1e-6) / copy_bw
        rows.append(VariantResult(name, t, sp, bw, None if name == names[0] else equal[name],
                                  nan_free[name]))
    all_equal = all(equal[n] for n in names[1:]) and all(nan_free.values())
    return ShapeResult(shape, mode, plan, bytes_moved, tuple(rows), all_equal, timing=timing,
                       launch=launch)
