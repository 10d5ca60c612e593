"""``bench kernel``: stock vs patched decode attention, all variants in ONE process, on the GPU.

Method, per shape of the matrix:
1. One random input set (vLLM's layouts, random block tables) shared by every variant. In cold
   mode it has ``layers_for_cold`` layers' caches so that one pass over them reads more than
   ``l2_factor`` times the L2 (read from the device); in hot mode one layer is read again and again.
2. Per variant, one CUDA graph of ``launches`` decode calls (layer ``i % layers`` for call ``i``),
   each the exact vLLM ``forward_decode`` (v1 or v2 by vLLM's rule unless forced).
3. ``rounds`` rounds; in each, every variant (in a rotated order) replays its graph enough times
   to fill ``target_sample_ms``, timed with CUDA events. A sample is the time per decode call.
4. Per variant: median and spread (quartiles, min/max) of the per-round samples; speedup as the
   per-round ratio baseline/variant (paired within a round), with its median and spread; achieved
   bandwidth (the fewest bytes a call must move over its median time) as a fraction of a
   device-to-device copy measured at the start of the same run.
5. Outputs are poisoned with NaN, every graph is replayed once more, and each variant's outputs
   must equal the baseline's bit for bit.

The pure parts (statistics, launch planning, result rows) are unit-tested; the GPU part runs on
the H200 through ``scripts/device/bench.sh``.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import BenchError
from ..kvinputs import cache_bytes_per_layer, layers_for_cold, make_inputs, min_bytes_moved
from ..ops import PagedOps, forward_decode, v2_workspace
from .matrix import BenchMatrix, BenchShape

DEFAULT_L2_BYTES_IF_UNKNOWN = 50 * 1024 * 1024  # H100/H200 L2, only if torch cannot say


@dataclass(frozen=True)
class KernelBenchConfig:
    mode: str = "cold"
    rounds: int = 21
    target_sample_ms: float = 3.0     # each timed sample lasts at least this long
    target_replay_ms: float = 1.0     # a graph holds enough calls to last about this long
    min_launches: int = 8             # ... but at least this many (unless one call is long)
    max_layers: int = 2048
    l2_factor: float = 4.0
    pool_factor: float = 1.0
    seed: int = 0
    copy_bytes: int = 1 << 31
    memory_fraction: float = 0.85     # of free device memory the caches may take

    def __post_init__(self) -> None:
        if self.mode not in ("cold", "hot"):
            raise BenchError(f"mode must be cold or hot, not '{self.mode}'", "pass --mode cold|hot")
        if self.rounds < 3:
            raise BenchError("fewer than 3 rounds give no spread", "pass --rounds 3 or more")


@dataclass(frozen=True)
class Stats:
    median: float
    p25: float
    p75: float
    min: float
    max: float
    n: int


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
    return [b / v for b, v in zip(baseline, variant)]


@dataclass(frozen=True)
class LaunchPlan:
    layers: int            # distinct KV caches rotated
    launches: int          # decode calls per graph replay
    replays: int           # graph replays per timed sample
    bytes_per_layer: int   # K+V bytes allocated per layer
    est_launch_us: float


def plan_launches(bytes_moved: int, bytes_per_layer: int, l2_bytes: int, copy_bw: float,
                  config: KernelBenchConfig) -> LaunchPlan:
    """How many layers to rotate and how many calls a graph and a sample hold. A call is assumed
    to run at 70% of the copy bandwidth (only for sizing; never reported)."""
    if config.mode == "hot":
        layers = 1
    else:
        layers = layers_for_cold(l2_bytes, bytes_per_layer, config.l2_factor)
        if layers > config.max_layers:
            raise BenchError(f"cold mode needs {layers} layers of {bytes_per_layer} B",
                             "raise --max-layers or lower --l2-factor")
    est = max(bytes_moved / (0.7 * copy_bw), 3e-6)
    by_time = math.ceil(config.target_replay_ms * 1e-3 / est)
    launches = max(layers, min(config.min_launches, by_time), 1)
    replays = max(1, math.ceil(config.target_sample_ms * 1e-3 / (launches * est)))
    return LaunchPlan(layers, launches, replays, bytes_per_layer, est * 1e6)


@dataclass(frozen=True)
class VariantResult:
    name: str
    time_us: Stats
    speedup: Stats | None
    bw_fraction: float
    equal_to_baseline: bool | None
    nan_free: bool


@dataclass(frozen=True)
class ShapeResult:
    shape: BenchShape
    mode: str
    plan: LaunchPlan | None
    bytes_moved: int
    variants: tuple[VariantResult, ...]
    bitwise_equal: bool | None
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = self.shape.to_dict()
        d.update(label=self.shape.label, mode=self.mode, bytes_moved=self.bytes_moved,
                 bitwise_equal=self.bitwise_equal, error=self.error)
        d["plan"] = asdict(self.plan) if self.plan else None
        d["variants"] = {
            v.name: {"time_us": asdict(v.time_us),
                     "speedup": asdict(v.speedup) if v.speedup else None,
                     "bw_fraction": v.bw_fraction, "equal_to_baseline": v.equal_to_baseline,
                     "nan_free": v.nan_free}
            for v in self.variants}
        return d


def build_results(shape: BenchShape, mode: str, plan: LaunchPlan, bytes_moved: int,
                  names: Sequence[str], samples: dict[str, list[float]], copy_bw: float,
                  equal: dict[str, bool], nan_free: dict[str, bool]) -> ShapeResult:
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
    return ShapeResult(shape, mode, plan, bytes_moved, tuple(rows), all_equal)


# ----------------------------------------------------------------------------- GPU part


def device_facts(device: Any = None) -> dict[str, Any]:
    import torch

    dev = torch.device(device or "cuda")
    props = torch.cuda.get_device_properties(dev)
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    return {"name": props.name, "sm_count": props.multi_processor_count,
            "capability": f"{props.major}.{props.minor}",
            "l2_bytes": l2 or DEFAULT_L2_BYTES_IF_UNKNOWN, "l2_reported": bool(l2),
            "total_memory": props.total_memory, "torch": torch.__version__,
            "cuda": torch.version.cuda}


def measure_copy_bandwidth(nbytes: int = 1 << 31, iters: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    import torch

    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e-3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * nbytes / summarize(times).median


class _CudaBackend:
    """CUDA graphs and CUDA events: what every reported number comes from."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.device = "cuda"

    def free_bytes(self) -> int:
        return int(self.torch.cuda.mem_get_info()[0])

    def capture(self, step: Callable[[], None]) -> Callable[[], None]:
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()  # eager warm-up: surfaces launch errors before capture
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        g.replay()
        return g.replay  # the bound method keeps the graph alive

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def time_s(self, fn: Callable[[], None]) -> float:
        start = self.torch.cuda.Event(enable_timing=True)
        end = self.torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) * 1e-3


class _HostBackend:
    """Eager calls and the host clock, for running the same control flow on CPU in the unit
    tests (with in-process reference ops). Its times are meaningless and never reported."""

    device = "cpu"

    def free_bytes(self) -> int:
        return 1 << 40

    def capture(self, step: Callable[[], None]) -> Callable[[], None]:
        step()
        return step

    def sync(self) -> None:
        pass

    def time_s(self, fn: Callable[[], None]) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


def bench_shape(ops: Sequence[PagedOps], shape: BenchShape, config: KernelBenchConfig,
                l2_bytes: int, copy_bw: float, device: str = "cuda") -> ShapeResult:
    """Time every variant on one shape (see the module docstring). ``device="cpu"`` runs the same
    steps eagerly with the host clock; only the unit tests use it."""
    import torch

    from ..numerics import bytes_equal

    be: Any = _CudaBackend() if device == "cuda" else _HostBackend()
    a = shape.attn
    lacking = [o.name for o in ops if not o.supports(a.head_size, a.block_size,
                                                     a.kv_cache_dtype, a.dtype)]
    bytes_moved = min_bytes_moved(a)
    if lacking:
        return ShapeResult(shape, config.mode, None, bytes_moved, (), None,
                           f"instantiation not in build(s): {', '.join(lacking)}")
    per_layer = cache_bytes_per_layer(a, config.pool_factor)
    plan = plan_launches(bytes_moved, per_layer, l2_bytes, copy_bw, config)
    free = be.free_bytes()
    if plan.layers * per_layer > config.memory_fraction * free:
        return ShapeResult(shape, config.mode, plan, bytes_moved, (), None,
                           f"needs {plan.layers * per_layer / 2**30:.1f} GiB of KV cache, "
                           f"{free / 2**30:.1f} GiB free")
    inputs = make_inputs(a, device=be.device, seed=config.seed, layers=plan.layers,
                         pool_factor=config.pool_factor)
    replays, outs = [], []
    for o in ops:
        o_outs = [torch.full_like(inputs.query, float("nan")) for _ in range(plan.launches)]
        ws = None
        if shape.kernel == "v2":
            ws = v2_workspace(a.num_seqs, a.num_heads, a.head_size, a.max_seq_len,
                              inputs.query.dtype, inputs.query.device)

        def step(o: PagedOps = o, o_outs: list[Any] = o_outs, ws: Any = ws) -> None:
            for i in range(plan.launches):
                forward_decode(o, inputs.args(i % plan.layers), force=shape.kernel,
                               out=o_outs[i], workspace=ws)

        replays.append(be.capture(step))
        outs.append(o_outs)
    be.sync()

    names = [o.name for o in ops]
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(config.rounds):
        order = list(range(len(ops)))
        order = order[r % len(order):] + order[:r % len(order)]  # rotate who goes first
        for vi in order:
            def sample(replay: Callable[[], None] = replays[vi]) -> None:
                for _ in range(plan.replays):
                    replay()
            seconds = be.time_s(sample)
            samples[names[vi]].append(seconds * 1e6 / (plan.replays * plan.launches))

    # Identity in the same run: poison, replay once, compare bytes with the baseline's.
    for o_outs in outs:
        for t in o_outs:
            t.fill_(float("nan"))
    for replay in replays:
        replay()
    be.sync()
    nan_free = {n: not any(bool(torch.isnan(t).any()) for t in o_outs)
                for n, o_outs in zip(names, outs)}
    equal = {n: all(bytes_equal(x, y) for x, y in zip(outs[0], o_outs))
             for n, o_outs in zip(names[1:], outs[1:])}
    return build_results(shape, config.mode, plan, bytes_moved, names, samples, copy_bw,
                         equal, nan_free)


def progress_line(i: int, n: int, r: ShapeResult, seconds: float) -> str:
    head = f"[{i}/{n}] {r.shape.label} {r.mode}"
    if r.error:
        return f"{head}: skipped ({r.error})"
    assert r.plan is not None
    parts = [f"L={r.plan.layers} calls={r.plan.launches}x{r.plan.replays}"]
    for v in r.variants:
        if v.speedup is None:
            parts.append(f"{v.name} {v.time_us.median:.1f} us ({v.bw_fraction:.0%} of copy bw)")
        else:
            parts.append(f"{v.name} {v.speedup.median:.3f}x [{v.speedup.min:.3f}-"
                         f"{v.speedup.max:.3f}]")
    parts.append("bitwise equal" if r.bitwise_equal else "OUTPUTS DIFFER")
    return f"{head}: " + " | ".join(parts) + f" ({seconds:.1f} s)"


def run_kernel_bench(ops: Sequence[PagedOps], matrix: BenchMatrix,
                     configs: Sequence[KernelBenchConfig],
                     progress: Callable[[str], None] | None = None,
                     command: Sequence[str] = ()) -> dict[str, Any]:
    """The whole run: copy bandwidth first, then every shape in every mode. Returns the JSON
    document (``kind: kernel``) that ``report`` renders."""
    import torch

    if not torch.cuda.is_available():
        raise BenchError("bench kernel needs a CUDA GPU and none is visible",
                         "run it on the GPU machine (scripts/device/bench.sh)")
    if len(ops) < 2:
        raise BenchError(f"need a baseline and at least one variant, found {[o.name for o in ops]}",
                         "build the baseline and patched trees with `kvprefetch build "
                         "--kernels-only`")
    facts = device_facts()
    say = progress or (lambda m: None)
    copy_bw = measure_copy_bandwidth(configs[0].copy_bytes)
    say(f"device {facts['name']}: L2 {facts['l2_bytes'] / 2**20:.0f} MiB, copy bandwidth "
        f"{copy_bw / 1e12:.2f} TB/s (read+write)")
    shapes = matrix.shapes()
    total = len(shapes) * len(configs)
    results = []
    t_all = time.monotonic()
    i = 0
    for config in configs:
        for shape in shapes:
            i += 1
            t0 = time.monotonic()
            try:
                r = bench_shape(ops, shape, config, facts["l2_bytes"], copy_bw)
            except RuntimeError as exc:  # a CUDA/launch error on one shape; keep the others
                torch.cuda.synchronize()
                r = ShapeResult(shape, config.mode, None, 0, (), None,
                                f"error: {str(exc).splitlines()[0]}")
            # Free this shape's caches and graph pools before the next (up to 17 GB each).
            gc.collect()
            torch.cuda.empty_cache()
            results.append(r)
            say(progress_line(i, total, r, time.monotonic() - t0))
    return {
        "kind": "kernel", "schema": 1,
        "meta": {
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "seconds": round(time.monotonic() - t_all, 1), "device": facts,
            "copy_bw_bytes_per_s": copy_bw, "baseline": ops[0].name,
            "variants": [{"name": o.name, "namespace": o.namespace,
                          **({"so_sha256": o.build.so_sha256, "so_path": str(o.build.so_path)}
                             if o.build else {})} for o in ops],
            "configs": [asdict(c) for c in configs], "matrix": matrix.to_dict(),
            "command": list(command),
        },
        "results": [r.to_dict() for r in results],
    }
