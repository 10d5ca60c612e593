"""``bench kernel``: stock vs patched decode attention, all variants in ONE process, on the GPU.

Method, per shape of the matrix:
1. One random input set (vLLM's layouts, random block tables) shared by every variant. In cold
   mode it has ``layers_for_cold`` layers' caches so that one pass over them reads more than
   ``l2_factor`` times the L2 (read from the device); in hot mode one layer is read again and again;
   in aliased mode one layer whose block tables point into a pool of ``alias_l2_fraction`` of the
   L2, so every KV load is an L2 hit at any batch and context (the L2-resident bound).
   Before allocating, the shape is checked against vLLM's own launch limits and against free
   device memory (``limits.py``); a shape that fails is skipped with its reason in the JSON.
   The shape is a step (its real lengths); what the kernel is given is the step's launch under
   vLLM's call (bench/vllm_call.py, ``step_launch``): graph-timed, the batch padded to its
   capture size with length-1 rows reading block 0, ``max_seq_len`` the capture length, the
   captured block-table width; eager-timed, or where vLLM runs the step eagerly, its real
   values (such a step is timed eagerly even where graph timing was asked, and only once where
   both are: ``timed_once``). ``--call exact`` launches every step at its real values.
2. Per variant, one CUDA graph of ``launches`` decode calls (layer ``i % layers`` for call ``i``;
   ``launches`` is a multiple of ``layers``, so every replay visits every layer equally often and
   the rotation never wraps early), each the exact vLLM ``forward_decode`` (v1 or v2 by vLLM's
   rule unless forced). A CUDA graph holds raw device pointers: every tensor a graph's kernels
   address (inputs, outputs, the v2 workspace) is kept alive with the graph until the shape is
   done. (Each ``torch.cuda.graph`` capture calls ``empty_cache``, which hands any freed block
   back to the driver; a graph replaying into it faults with an illegal memory access.)
3. ``rounds`` rounds; in each, every variant (in a rotated order) replays its graph enough times
   to fill ``target_sample_ms``, timed with CUDA events. A sample is the time per decode call.
   With ``timing="eager"`` nothing is captured: the same ``launches`` decode calls are made
   back to back from Python, as vLLM makes them above its largest captured batch or with
   ``enforce_eager``, so the host path (torch's dispatcher and each tree's launcher) is inside
   the CUDA-event window wherever it is slower than the kernels. The v2 workspace is still
   allocated once per shape (vLLM allocates it per call, the same for every tree), so the
   ratio is the launchers' and kernels' own.
4. Per variant: median and spread (quartiles, min/max) of the per-round samples; speedup as the
   per-round ratio baseline/variant (paired within a round), with its median and spread; achieved
   bandwidth (the fewest bytes a call must move over its median time) as a fraction of a
   device-to-device copy measured at the start of the same run.
5. Outputs are poisoned with NaN, every graph is replayed once more, and each variant's outputs
   must equal the baseline's bit for bit.
6. Graphs and tensors are dropped and the allocator's cache emptied before the next shape. A CUDA
   error poisons the whole context (illegal address, ...), so after one the run stops: the
   remaining shapes are recorded as not run and the partial document is still returned.

The pure parts (statistics: ``stats.py``; result rows: ``kernel_results.py``; launch planning:
``plan_launches`` here) are unit-tested; the GPU part runs on the H200 through
``scripts/device/bench.sh``.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..errors import BenchError, ConfigError
from ..kernels import policy
from ..kernels.kvinputs import (
    alias_pool_blocks,
    cache_bytes_per_layer,
    layers_for_cold,
    make_inputs,
    min_bytes_moved,
)
from ..kernels.ops import PagedOps, forward_decode, v2_workspace
from ..kitinfo import kit_info
from .device import CudaBackend, HostBackend, device_facts, measure_copy_bandwidth, require_gpu
from .kernel_results import LaunchPlan, ShapeResult, build_results
from .limits import memory_refusal, shape_memory, vllm_kernel_limit
from .matrix import MODES, BenchMatrix, BenchShape
from .schema import (
    SCHEMA_VERSION,
    CallFields,
    KernelDocument,
    KernelMeta,
    Kit,
    NotMeasured,
    SampleDocument,
    SampleInfo,
)
from .vllm_call import TIMINGS, Launch, VllmCall, launch_attn, launch_for


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
    alias_l2_fraction: float = 0.25   # aliased mode: the block pool's size, of the L2
    seed: int = 0
    copy_bytes: int = 1 << 31
    memory_fraction: float = 0.85     # of free device memory the caches may take
    timing: str = "graph"             # graph: CUDA-graph replay; eager: back-to-back calls
    call: VllmCall = field(default_factory=VllmCall)  # the launch a step becomes (vllm_call.py)

    def __post_init__(self) -> None:
        if self.timing not in TIMINGS:
            raise BenchError(f"timing must be one of {', '.join(TIMINGS)}, not '{self.timing}'",
                             "pass --timing graph, --timing eager or --timing graph,eager")
        if self.mode not in MODES:
            raise BenchError(f"mode must be one of {', '.join(MODES)}, not '{self.mode}'",
                             "pass --mode cold|hot|aliased")
        if not 0.0 < self.alias_l2_fraction <= 1.0:
            raise BenchError(f"alias_l2_fraction {self.alias_l2_fraction} is not in (0, 1]",
                             "pass a fraction of the L2 such as 0.25")
        if self.rounds < 3:
            raise BenchError("fewer than 3 rounds give no spread", "pass --rounds 3 or more")


def plan_launches(bytes_moved: int, bytes_per_layer: int, l2_bytes: int, copy_bw: float,
                  config: KernelBenchConfig) -> LaunchPlan:
    """How many layers to rotate and how many calls a graph and a sample hold. A call is assumed
    to run at 70% of the copy bandwidth (only for sizing; never reported)."""
    if config.mode in ("hot", "aliased"):
        layers = 1
    else:
        layers = layers_for_cold(l2_bytes, bytes_per_layer, config.l2_factor)
        if layers > config.max_layers:
            raise BenchError(f"cold mode needs {layers} layers of {bytes_per_layer} B",
                             "raise --max-layers or lower --l2-factor")
    est = max(bytes_moved / (0.7 * copy_bw), 3e-6)
    by_time = math.ceil(config.target_replay_ms * 1e-3 / est)
    launches = max(layers, min(config.min_launches, by_time), 1)
    launches = -(-launches // layers) * layers  # whole passes: each layer visited equally often
    replays = max(1, math.ceil(config.target_sample_ms * 1e-3 / (launches * est)))
    return LaunchPlan(layers, launches, replays, bytes_per_layer, est * 1e6)


# ----------------------------------------------------------------------------- GPU part


@dataclass(frozen=True)
class _VariantRun:
    """One variant's captured graph and everything its kernels write to (kept alive together)."""

    name: str
    replay: Callable[[], None]
    out: Any  # every call's output: one tensor, [launches, *query.shape]
    workspace: tuple[Any, Any, Any] | None
    views: tuple[Any, ...] = ()  # out's per-call slices, which the graph's calls were given


def kernel_configs(modes: Sequence[str], timings: Sequence[str], call: VllmCall,
                   **common: Any) -> list[KernelBenchConfig]:
    """One config per mode and timing (modes outermost), every one with ``call`` and the
    ``common`` settings (rounds, sample length, ...)."""
    return [KernelBenchConfig(mode=m, timing=t, call=call, **common)
            for m in modes for t in timings]


def step_launch(shape: BenchShape, config: KernelBenchConfig) -> Launch:
    """The launch vLLM makes of ``shape`` under ``config``'s call and timing (a sampled step
    under its own max_model_len). Raises ConfigError where a sequence does not fit
    max_model_len."""
    a = shape.attn
    return launch_for(shape.lens, num_heads=a.num_heads, block_size=a.block_size,
                      call=config.call.for_model_len(shape.max_model_len),
                      timing=config.timing, force=shape.kernel if shape.forced else None)


def check_shape(shape: BenchShape, ops: Sequence[PagedOps], config: KernelBenchConfig,
                plan: LaunchPlan, free_bytes: int, smem_optin_bytes: int,
                alias_blocks: int = 0, launch: Launch | None = None) -> str:
    """"" when the shape can run, else why it is skipped: an instantiation missing from a build,
    a launch vLLM 0.10.2 itself cannot make, or not enough free device memory. ``launch``: what
    the kernel is given (default: the shape itself, the exact call)."""
    a = shape.attn
    lacking = [o.name for o in ops if not o.supports(a.head_size, a.block_size,
                                                     a.kv_cache_dtype, a.dtype)]
    if lacking:
        return f"instantiation not in build(s): {', '.join(lacking)}"
    la = launch_attn(a, launch) if launch else a
    kernel = launch.kernel if launch else shape.kernel
    limit = vllm_kernel_limit(la, kernel, smem_optin_bytes)
    if limit:
        return limit
    need = shape_memory(la, kernel, plan.layers, plan.launches, len(ops), config.pool_factor,
                        alias_blocks, shape.lens)
    return memory_refusal(need, free_bytes, config.memory_fraction)


def bench_shape(ops: Sequence[PagedOps], shape: BenchShape, config: KernelBenchConfig,
                l2_bytes: int, copy_bw: float, device: str = "cuda",
                backend: Any = None) -> ShapeResult:
    """Time every variant on one shape (see the module docstring). ``device="cpu"`` runs the same
    steps eagerly with the host clock; only the unit tests use it (and ``backend``, to model a
    CUDA graph's pointer semantics on CPU)."""
    import torch

    from ..verify.numerics import bytes_equal

    be: Any = backend or (CudaBackend() if device == "cuda" else HostBackend())
    try:
        launch = step_launch(shape, config)
    except ConfigError as exc:
        return ShapeResult(shape, config.mode, None, 0, (), None, exc.cause, "skipped",
                           timing=config.timing)
    # The row names what ran: the launch's kernel, timed as the launch runs (a step vLLM runs
    # eagerly is timed eagerly even where graph timing was asked).
    shape = replace(shape, kernel=launch.kernel)
    timing = launch.timing
    a = launch_attn(shape.attn, launch)
    # Bytes of the launch: the real rows' blocks, one block per pad row, every row's q and out.
    bytes_moved = min_bytes_moved(a, launch.seq_lens)
    alias = (alias_pool_blocks(a, l2_bytes, config.alias_l2_fraction)
             if config.mode == "aliased" else 0)
    per_layer = cache_bytes_per_layer(a, config.pool_factor, alias, shape.lens)
    try:
        plan = plan_launches(bytes_moved, per_layer, l2_bytes, copy_bw, config)
    except BenchError as exc:
        return ShapeResult(shape, config.mode, None, bytes_moved, (), None, exc.cause, "skipped",
                           timing=timing, launch=launch)
    reason = check_shape(shape, ops, config, plan, be.free_bytes(), be.smem_optin_bytes(), alias,
                         launch)
    if reason:
        return ShapeResult(shape, config.mode, plan, bytes_moved, (), None, reason, "skipped",
                           timing=timing, launch=launch)
    inputs = make_inputs(a, device=be.device, seed=config.seed, layers=plan.layers,
                         pool_factor=config.pool_factor, alias_blocks=alias,
                         seq_lens=launch.seq_lens, pad_rows=launch.pad_rows)
    runs: list[_VariantRun] = []
    for o in ops:
        # One tensor for every call's output, each call writing its own slice: the identity
        # check below is then one comparison per variant, not one (and a sync) per call.
        o_all = torch.full((plan.launches, *inputs.query.shape), float("nan"),
                           dtype=inputs.query.dtype, device=inputs.query.device)
        o_outs = tuple(o_all.unbind(0))
        ws = None
        if shape.kernel == "v2":
            ws = v2_workspace(a.num_seqs, a.num_heads, a.head_size, a.max_seq_len,
                              inputs.query.dtype, inputs.query.device)

        def step(o: PagedOps = o, o_outs: tuple[Any, ...] = o_outs, ws: Any = ws) -> None:
            for i in range(plan.launches):
                forward_decode(o, inputs.args(i % plan.layers), force=shape.kernel,
                               out=o_outs[i], workspace=ws)

        if timing == "eager":
            step()  # warm-up, as capture's: launch errors surface before timing
            runs.append(_VariantRun(o.name, step, o_all, ws, o_outs))
        else:
            runs.append(_VariantRun(o.name, be.capture(step), o_all, ws, o_outs))
    be.sync()

    names = [r.name for r in runs]
    samples: dict[str, list[float]] = {n: [] for n in names}
    for rnd in range(config.rounds):
        order = list(range(len(runs)))
        order = order[rnd % len(order):] + order[:rnd % len(order)]  # rotate who goes first
        for vi in order:
            def sample(replay: Callable[[], None] = runs[vi].replay) -> None:
                for _ in range(plan.replays):
                    replay()
            seconds = be.time_s(sample)
            samples[names[vi]].append(seconds * 1e6 / (plan.replays * plan.launches))

    # Identity in the same run: poison, replay once, compare bytes with the baseline's (every
    # row, the pad rows' too: they are deterministic in every variant).
    for run in runs:
        run.out.fill_(float("nan"))
    for run in runs:
        run.replay()
    be.sync()
    nan_free = {r.name: not bool(torch.isnan(r.out).any()) for r in runs}
    equal = {r.name: bytes_equal(runs[0].out, r.out) for r in runs[1:]}
    return build_results(shape, config.mode, plan, bytes_moved, names, samples, copy_bw,
                         equal, nan_free, timing, launch)


def progress_line(i: int, n: int, r: ShapeResult, seconds: float) -> str:
    head = f"[{i}/{n}] {r.shape.label} {r.mode}" + (" eager" if r.timing == "eager" else "")
    la = r.launch
    if la is not None and (la.pad_rows or la.max_seq_len != r.shape.attn.max_seq_len):
        head += f" (launch b{la.num_seqs} max_seq_len {la.max_seq_len})"
    if r.status != "measured":
        return f"{head}: {r.status} ({r.error})"
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


def cuda_context_problem() -> str:
    """"" when the CUDA context still works after an error, else why not. Errors such as an
    illegal address are sticky: every later CUDA call fails with them."""
    import torch

    try:
        torch.cuda.synchronize()
        torch.empty(1, device="cuda").add_(1)
        torch.cuda.synchronize()
    except RuntimeError as exc:
        return str(exc).splitlines()[0]
    return ""


def release_cuda_memory() -> None:
    """Drop the finished shape's graphs and tensors and hand the cached blocks back, so the next
    shape's memory check sees the device's real free memory."""
    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def run_shapes(shapes: Sequence[BenchShape], configs: Sequence[KernelBenchConfig],
               measure: Callable[[BenchShape, KernelBenchConfig], ShapeResult],
               context_problem: Callable[[], str], release: Callable[[], None],
               say: Callable[[str], None], time_limit_s: float = 0.0,
               clock: Callable[[], float] = time.monotonic,
               shape_major: bool = False,
               wanted: Callable[[BenchShape, KernelBenchConfig], bool] | None = None,
               ) -> tuple[list[ShapeResult], str]:
    """Every shape in every mode, in order. An exception while measuring a shape marks it failed;
    if the device context is unusable afterwards (``context_problem`` says why), the rest are
    marked not run instead of being attempted. Returns the results and the abort reason ("" if
    none). ``release`` runs after every shape, failed or not. ``time_limit_s`` > 0: no shape is
    started after that many seconds; the rest are marked not run (a device call's budget ends
    with a written document rather than a killed process). ``shape_major``: every config of a
    shape before the next shape (a sample's graph and eager timings of one step side by side, so
    a time limit cuts both alike); otherwise every shape of a config before the next config. Either
    way the rows of one config are in shape order, and each row records its shape's index
    (``step``). ``wanted``: which (shape, config) pairs to run at all (default: every one)."""
    results: list[ShapeResult] = []
    todo = ([(c, i, s) for i, s in enumerate(shapes) for c in configs] if shape_major
            else [(c, i, s) for c in configs for i, s in enumerate(shapes)])
    todo = [t for t in todo if wanted is None or wanted(t[2], t[0])]
    aborted = ""
    start = clock()
    for i, (config, index, shape) in enumerate(todo, 1):
        t0 = time.monotonic()
        late = time_limit_s > 0 and clock() - start > time_limit_s
        if aborted or late:
            r = ShapeResult(shape, config.mode, None, 0, (), None,
                            f"CUDA context unusable after an earlier error: {aborted}" if aborted
                            else f"not started: the time limit of {time_limit_s:g} s was reached",
                            "not run", timing=config.timing)
        else:
            try:
                r = measure(shape, config)
            except RuntimeError as exc:  # CUDA errors, torch.OutOfMemoryError
                r = ShapeResult(shape, config.mode, None, 0, (), None,
                                f"error: {str(exc).splitlines()[0]}", "failed",
                                timing=config.timing)
            if r.status == "failed":
                problem = context_problem()
                if problem:
                    aborted = f"{shape.label} {config.mode}: {problem}"
            release()
        r = replace(r, step=index)
        results.append(r)
        say(progress_line(i, len(todo), r, time.monotonic() - t0))
    return results, aborted


def run_kernel_bench(ops: Sequence[PagedOps], matrix: BenchMatrix,
                     configs: Sequence[KernelBenchConfig],
                     progress: Callable[[str], None] | None = None,
                     command: Sequence[str] = (), shapes: Sequence[BenchShape] | None = None,
                     sample: SampleInfo | None = None,
                     time_limit_s: float = 0.0) -> KernelDocument | SampleDocument:
    """The whole run: copy bandwidth first, then every shape in every mode. Returns the JSON
    document (``kind: kernel``) that ``report`` renders; skipped, failed and not-run shapes are in
    ``results`` with their ``status`` and reason, and listed in ``meta.not_measured``.
    ``shapes`` replaces the matrix's (a sampled run: ``sample`` describes the draw, and the
    document's kind is ``sample``, rendered by bench/sample_report.py)."""
    require_gpu("kernel")
    if len(ops) < 2:
        raise BenchError(f"need a baseline and at least one variant, found {[o.name for o in ops]}",
                         "build the baseline and patched trees with `kvprefetch build "
                         "--kernels-only`")
    facts = device_facts()
    say = progress or (lambda m: None)
    copy_bw = measure_copy_bandwidth(configs[0].copy_bytes)
    say(f"device {facts['name']}: L2 {facts['l2_bytes'] / 2**20:.0f} MiB, copy bandwidth "
        f"{copy_bw / 1e12:.2f} TB/s (read+write)")
    t_all = time.monotonic()

    def measure(shape: BenchShape, config: KernelBenchConfig) -> ShapeResult:
        return bench_shape(ops, shape, config, facts["l2_bytes"], copy_bw)

    results, aborted = run_shapes(matrix.shapes() if shapes is None else shapes, configs, measure,
                                  cuda_context_problem, release_cuda_memory, say, time_limit_s,
                                  shape_major=sample is not None, wanted=timed_once(configs))
    meta: KernelMeta = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(time.monotonic() - t_all, 1), "device": facts,
        "copy_bw_bytes_per_s": copy_bw, "baseline": ops[0].name,
        "variants": [{"name": o.name, "namespace": o.namespace,
                      "so_sha256": o.build.so_sha256, "so_path": str(o.build.so_path)}
                     if o.build else {"name": o.name, "namespace": o.namespace} for o in ops],
        "configs": [asdict(c) for c in configs],
        "call": run_call(configs, sample is not None),
        "matrix": matrix.to_dict() if sample is None else None,
        "command": list(command), "aborted": aborted}
    rows = [r.to_dict() for r in results]
    if sample is None:
        return {"kind": "kernel", "schema": SCHEMA_VERSION, "results": rows,
                "meta": {**meta, "not_measured": not_measured(results), "kit": kit_fields()}}
    return {"kind": "sample", "schema": SCHEMA_VERSION, "results": rows,
            "meta": {**meta, "sample": sample,
                     "twin_at": [(h, b, v1) for h, b, v1 in policy.TWIN_AT],
                     "twin_partial_groups": True, "twin_least_guard": True, "wave_guard": True,
                     "not_measured": not_measured(results), "kit": kit_fields()}}


def kit_fields() -> Kit:
    """``meta.kit``: the kit that ran (kitinfo.KitInfo)."""
    k = kit_info()
    return {"version": k.version, "root": k.root, "commit": k.commit, "dirty": k.dirty}


def timed_once(configs: Sequence[KernelBenchConfig]
               ) -> Callable[[BenchShape, KernelBenchConfig], bool]:
    """Which (shape, config) pairs to run: all but the graph timing of a step vLLM runs eagerly
    where an eager timing of the same mode is asked too (the two would be the same launch, timed
    the same way: the eager config's row is the step's one eager row)."""
    eager_modes = {c.mode for c in configs if c.timing == "eager"}

    def wanted(shape: BenchShape, config: KernelBenchConfig) -> bool:
        if config.timing != "graph" or config.mode not in eager_modes:
            return True
        try:
            return step_launch(shape, config).graph
        except ConfigError:
            return True  # bench_shape records why it cannot run
    return wanted


def run_call(configs: Sequence[KernelBenchConfig], per_step_model_len: bool) -> CallFields:
    """``meta.call``: the call model every config of the run shares, and whether each sampled
    step brought its own max_model_len."""
    calls = {c.call for c in configs}
    if len(calls) != 1:
        raise BenchError("the configs of one run have different calls",
                         "build every config of a run with one VllmCall")
    call = calls.pop().to_dict()
    call["per_step_max_model_len"] = per_step_model_len
    return call


def not_measured(results: Sequence[ShapeResult]) -> list[NotMeasured]:
    """The shapes without numbers, each with its status and reason (for ``meta``)."""
    return [{"label": r.shape.label, "mode": r.mode, "timing": r.timing, "status": r.status,
             "reason": r.error} for r in results if r.status != "measured"]
