"""``bench decode``: whole-model decode throughput through each tree's compiled kernels, in ONE
process on the GPU, stock against patched.

Method, per workload (a fixed batch x context point, or a serving trace):
1. The scheduler (``decode_serve``) turns the requests into decode steps once; every tree runs
   exactly those steps. The inputs of every step (tokens, positions, slots, sequence lengths,
   block tables), padded to vLLM's CUDA-graph bucket, are built on the device before timing.
2. One model (``decode_model.Decoder``: random weights at the model's shapes, the prompts' K/V
   filled directly) serves every tree; only the paged-attention op differs. Per tree and bucket
   one CUDA graph of the whole step is captured as vLLM V0 captures it (bench/vllm_call.py:
   ``max_seq_len`` = the capture length, min(``max_seq_len_to_capture``, ``max_model_len``),
   the block table of the captured width, pad rows of length 1); a step whose batch has no
   bucket or a sequence longer than that runs eagerly with its real maximum and a block table
   of its own width, as in vLLM, and ``--eager`` runs every step so (vLLM's
   ``enforce_eager``). The buckets are V0's up to the trace's largest batch (vLLM's with
   ``max_num_seqs`` = that batch).
3. ``repeats`` rounds; in each, every tree (in a rotated order) refills the K/V cache with the
   same values and runs the whole trace, each step timed with CUDA events (input copy + replay).
   Tokens/s = real (unpadded) tokens / summed step time. Ratio = a round's stock time over the
   tree's, paired per round; median and range over rounds.
4. Every step's logits (real rows) are folded into a 64-bit checksum (a fixed random integer
   weight per element of the logits' bits, summed): a tree whose checksums differ from stock's
   in any step of any round is reported as not bitwise equal.
5. Attention's share of a step: a few steps of each tree replayed under torch.profiler, the
   durations of the attention kernels (paged attention, the twins, their reduce and prefetch
   kernels) over all kernels.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import BenchError
from ..kernels.ops import PagedOps
from .decode_model import Decoder, DecoderConfig
from .decode_serve import BlockAllocator, LengthDist, Scheduler, Step, blocks_needed
from .schema import SCHEMA_VERSION, DecodeConfig, DecodeDocument, DecodeRow
from .stats import quantile, summarize
from .vllm_call import MAX_SEQ_LEN_TO_CAPTURE, VllmCall, blocks_for, graph_bucket, launch_for

ATTENTION_KERNELS = ("paged_attention", "gqa_decode", "kv_l2_prefetch", "reduce_kernel")
# One step's device inputs: tokens, positions, slots, sequence lengths, block tables.
Inputs = tuple[Any, Any, Any, Any, Any]


@dataclass(frozen=True)
class Workload:
    """A point (``batch`` requests of ``context`` tokens each, decoding ``steps`` tokens in one
    batch) or a serving trace (``requests`` requests from ``dist``, at most ``batch`` at once)."""

    batch: int
    context: int = 0
    steps: int = 32
    dist: LengthDist | None = None
    requests: int = 0

    @property
    def label(self) -> str:
        if self.dist is None:
            ctx = f"{self.context // 1024}k" if self.context % 1024 == 0 else str(self.context)
            return f"b{self.batch} x {ctx}"
        return (f"serve {self.dist.kind} {self.requests} req, batch <= {self.batch}, prompt "
                f"~{self.dist.prompt}, output ~{self.dist.output}")

    def lengths(self) -> list[tuple[int, int]]:
        if self.dist is None:
            return [(self.context - 1, self.steps)] * self.batch
        return self.dist.sample(self.requests)

    def to_dict(self) -> DecodeRow:
        d: DecodeRow = {"batch": self.batch, "context": self.context, "steps": self.steps,
                        "requests": self.requests, "label": self.label}
        if self.dist is not None:
            d["dist"] = asdict(self.dist)
        return d


@dataclass(frozen=True)
class DecodeBenchConfig:
    repeats: int = 5
    warmup_steps: int = 2       # untimed steps per tree before its first timed round
    eager: bool = False
    max_model_len: int = 32768
    max_seq_len_to_capture: int = MAX_SEQ_LEN_TO_CAPTURE  # vLLM's knob (default 8192)
    block_size: int = 16
    seed: int = 0
    profile_steps: int = 3
    memory_headroom: float = 0.9  # use at most this fraction of free device memory

    def to_dict(self) -> DecodeConfig:
        return {"repeats": self.repeats, "warmup_steps": self.warmup_steps, "eager": self.eager,
                "max_model_len": self.max_model_len,
                "max_seq_len_to_capture": self.max_seq_len_to_capture,
                "block_size": self.block_size, "seed": self.seed,
                "profile_steps": self.profile_steps, "memory_headroom": self.memory_headroom}

    def call(self, largest_batch: int) -> VllmCall:
        """vLLM's call for a trace whose largest batch is ``largest_batch`` (its max_num_seqs)."""
        return VllmCall(max_model_len=self.max_model_len,
                        max_seq_len_to_capture=self.max_seq_len_to_capture,
                        max_num_seqs=largest_batch, enforce_eager=self.eager)


def plan_steps(work: Workload, block_size: int) -> tuple[list[Step], int]:
    """The workload's decode steps and the KV blocks they need (scratch block included)."""
    lengths = work.lengths()
    num_blocks = blocks_needed(lengths, work.batch, block_size)
    sched = Scheduler(lengths, work.batch, BlockAllocator(num_blocks, block_size))
    return list(sched.steps()), num_blocks


def step_mode(step: Step, call: VllmCall) -> int | None:
    """The graph bucket a step replays in, or None when it runs eagerly."""
    if call.eager_reason(step.batch, step.max_seq_len):
        return None
    return graph_bucket(step.batch, call.buckets)


def checksum_weights(vocab: int, device: Any, seed: int = 12345) -> Any:
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(1, 2**31 - 1, (vocab,), generator=g, dtype=torch.int64).to(device)


def logits_checksum(logits: Any, weights: Any) -> Any:
    """A 0-d int64 tensor: the logits' 16-bit patterns times the weights, summed (wrapping)."""
    import torch

    bits = logits.contiguous().view(torch.int16).to(torch.int64)
    return (bits * weights).sum()


class StepInputs:
    """Every step's inputs on the device, padded to its bucket (the pad rows as vLLM pads:
    sequence length 1, block table row of block 0, the K/V written to the scratch block); a
    graph step's block table of the captured width, an eager step's of its own."""

    def __init__(self, steps: Sequence[Step], call: VllmCall, scratch: int, block_size: int,
                 vocab: int, device: Any, seed: int) -> None:
        import torch

        self.call = call
        self.modes = [step_mode(s, call) for s in steps]
        self.rows = [s.batch if m is None else m for s, m in zip(steps, self.modes, strict=True)]
        self.batches = [s.batch for s in steps]
        self.max_lens = [s.max_seq_len for s in steps]
        self.seq_lens = [s.seq_lens for s in steps]
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.items: list[Inputs] = []
        for s, rows, mode in zip(steps, self.rows, self.modes, strict=True):
            pad = rows - s.batch
            max_blocks = blocks_for(call.capture_len if mode is not None else s.max_seq_len,
                                    block_size)
            tokens = torch.randint(0, vocab, (rows,), generator=g, dtype=torch.int64)
            positions = torch.tensor(list(s.positions) + [0] * pad, dtype=torch.int64)
            slots = torch.tensor(list(s.slots) + [scratch * block_size] * pad, dtype=torch.int64)
            seq_lens = torch.tensor(list(s.seq_lens) + [1] * pad, dtype=torch.int32)
            tables = torch.zeros((rows, max_blocks), dtype=torch.int32)
            for i, row in enumerate(s.block_tables):
                tables[i, :len(row)] = torch.tensor(row, dtype=torch.int32)
            self.items.append((tokens.to(device), positions.to(device), slots.to(device),
                               seq_lens.to(device), tables.to(device)))


class TreeRunner:
    """One tree's step function: graphs per bucket (captured on first use), eager otherwise."""

    def __init__(self, model: Decoder, ops: PagedOps, capture_len: int, max_blocks: int,
                 device: Any) -> None:
        self.model, self.ops, self.capture_len = model, ops, capture_len
        self.max_blocks, self.device = max_blocks, device
        self.graphs: dict[int, tuple[Any, Inputs, Any]] = {}

    def _static(self, rows: int) -> Inputs:
        import torch

        d = self.device
        scratch = (self.model.k_caches[0].shape[0] - 1) * self.model.block_size
        return (torch.zeros(rows, dtype=torch.int64, device=d),
                torch.zeros(rows, dtype=torch.int64, device=d),
                torch.full((rows,), scratch, dtype=torch.int64, device=d),
                torch.ones(rows, dtype=torch.int32, device=d),
                torch.zeros((rows, self.max_blocks), dtype=torch.int32, device=d))

    def graph(self, rows: int) -> tuple[Any, Inputs, Any]:
        """The captured step of ``rows`` rows: (graph, its static inputs, its logits)."""
        import torch

        if rows in self.graphs:
            return self.graphs[rows]
        static = self._static(rows)
        m = self.model
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up, eager: the launchers' first-call set-up
            for _ in range(2):
                m.step(self.ops, *static, max_seq_len=self.capture_len)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()  # its own memory pool: buckets replay in any order
        with torch.cuda.graph(graph):
            logits = m.step(self.ops, *static, max_seq_len=self.capture_len)
        self.graphs[rows] = (graph, static, logits)
        return self.graphs[rows]

    def run(self, inputs: Inputs, mode: int | None, max_len: int) -> Any:
        """One step; returns the logits (padded rows included)."""
        if mode is None:
            return self.model.step(self.ops, *inputs, max_seq_len=max_len)
        graph, static, logits = self.graph(mode)
        for dst, src in zip(static, inputs, strict=True):
            dst.copy_(src)
        graph.replay()
        return logits


def kernel_choices(steps_in: StepInputs, num_heads: int, block_size: int) -> dict[str, int]:
    """How many steps vLLM's rule sends to v1 and v2 (with the launch the kernel is given)."""
    out = {"v1": 0, "v2": 0}
    for lens in steps_in.seq_lens:
        out[launch_for(lens, num_heads=num_heads, block_size=block_size, call=steps_in.call,
                       timing="graph").kernel] += 1
    return out


def attention_share(runner: TreeRunner, steps_in: StepInputs, picks: Sequence[int]) -> float | None:
    """Attention kernels' share of the kernel time of the steps ``picks`` (torch.profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        return None  # no kernels to time
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in picks:
            runner.run(steps_in.items[i], steps_in.modes[i], steps_in.max_lens[i])
        torch.cuda.synchronize()
    total = attn = 0.0
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        dur = float(e.device_time if hasattr(e, "device_time") else e.cuda_time)
        total += dur
        if any(k in e.name for k in ATTENTION_KERNELS):
            attn += dur
    return attn / total if total > 0 else None


def run_workload(model: Decoder, trees: Sequence[PagedOps], work: Workload,
                 steps: Sequence[Step], cfg: DecodeBenchConfig,
                 progress: Callable[[str], None] = print) -> DecodeRow:
    """Time every tree over the workload's steps (the model's caches hold its blocks)."""
    import torch

    mc = model.cfg
    call = cfg.call(max(s.batch for s in steps))
    capture_len = call.capture_len
    scratch = model.k_caches[0].shape[0] - 1
    inputs = StepInputs(steps, call, scratch, cfg.block_size, mc.vocab, model.device, cfg.seed)
    weights = checksum_weights(mc.vocab, model.device)
    runners = [TreeRunner(model, t, capture_len, blocks_for(capture_len, cfg.block_size),
                          model.device) for t in trees]
    tokens = sum(inputs.batches)
    times: dict[str, list[float]] = {t.name: [] for t in trees}
    step_ms: dict[str, list[float]] = {t.name: [] for t in trees}
    sums: dict[str, list[Any]] = {t.name: [] for t in trees}
    for r in runners:  # capture every bucket the trace uses, and warm up
        for i in range(min(cfg.warmup_steps, len(steps))):
            r.run(inputs.items[i], inputs.modes[i], inputs.max_lens[i])
        for rows in sorted({m for m in inputs.modes if m is not None}):
            r.graph(rows)
    torch.cuda.synchronize()
    n = len(runners)
    for rnd in range(cfg.repeats):
        for k in range(n):
            r = runners[(rnd + k) % n]
            model.fill_cache(cfg.seed)
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in steps]
            checks = torch.zeros(len(steps), dtype=torch.int64, device=model.device)
            torch.cuda.synchronize()
            for i, (start, end) in enumerate(events):
                start.record()
                logits = r.run(inputs.items[i], inputs.modes[i], inputs.max_lens[i])
                end.record()
                checks[i] = logits_checksum(logits[:inputs.batches[i]], weights)
            torch.cuda.synchronize()
            ms = [s.elapsed_time(e) for s, e in events]
            times[r.ops.name].append(sum(ms))
            step_ms[r.ops.name].extend(ms)
            sums[r.ops.name].append(checks.cpu())
        progress(f"  round {rnd + 1}/{cfg.repeats}: " + ", ".join(
            f"{name} {tokens / (t[-1] * 1e-3):.0f} tok/s" for name, t in times.items()))
    base = trees[0].name
    mid = len(steps) // 2
    picks = list(range(mid, min(mid + cfg.profile_steps, len(steps))))
    result: DecodeRow = {
        **work.to_dict(), "steps_run": len(steps), "tokens": tokens,
        "graph_steps": sum(m is not None for m in inputs.modes),
        "kernels": kernel_choices(inputs, mc.num_heads, cfg.block_size),
        "max_seq_len": max(inputs.max_lens), "trees": {}}
    for r in runners:
        name = r.ops.name
        t = times[name]
        ratio = [b / x for b, x in zip(times[base], t, strict=True)]
        lat = sorted(step_ms[name])
        equal = all(bool(torch.equal(a, b)) for a, b in zip(sums[name], sums[base], strict=True))
        result["trees"][name] = {
            "tokens_per_s": tokens / (statistics.median(t) * 1e-3),
            "time_ms": summarize(t).to_dict(),
            "ratio": summarize(ratio).to_dict() if name != base else None,
            "step_ms": {"mean": statistics.fmean(lat), "p50": quantile(lat, 0.5),
                        "p99": quantile(lat, 0.99)},
            "attention_share": attention_share(r, inputs, picks) if picks else None,
            "bitwise_equal": equal if name != base else None,
        }
    for r in runners:
        r.graphs.clear()
    del runners, inputs
    gc.collect()
    torch.cuda.synchronize()
    return result


def workload_memory(cfg: DecoderConfig, num_blocks: int, block_size: int, batch: int) -> int:
    """Bytes the workload's K/V cache, inputs and activations need beside the weights (the
    activations and graph pools roughly: a few step-sized buffers per bucket and tree)."""
    kv = num_blocks * cfg.kv_bytes_per_block(block_size)
    act = 64 * batch * max(cfg.hidden, cfg.intermediate, cfg.vocab) * 4
    return kv + act + 256 * 2**20


def run_decode_bench(trees: Sequence[PagedOps], model_cfg: DecoderConfig,
                     workloads: Sequence[Workload], cfg: DecodeBenchConfig,
                     command: Sequence[str] = (),
                     progress: Callable[[str], None] = print) -> DecodeDocument:
    """The whole run: one model, every workload, every tree; a ``decode`` result document."""
    import torch

    from .device import device_facts, require_gpu

    require_gpu("decode")
    if len(trees) < 2:
        raise BenchError("bench decode needs the baseline and at least one other tree",
                         "build them with `kvprefetch build --kernels-only`")
    for t in trees:
        if not t.supports(model_cfg.head_dim, cfg.block_size, "auto", model_cfg.dtype):
            raise BenchError(f"{t.name} has no kernels for head {model_cfg.head_dim}, block "
                             f"{cfg.block_size}, {model_cfg.dtype}",
                             f"build with --head-sizes {model_cfg.head_dim} --block-sizes "
                             f"{cfg.block_size}")
    started = time.time()
    facts = device_facts(command="decode")
    free = torch.cuda.mem_get_info()[0]
    if model_cfg.weight_bytes() > cfg.memory_headroom * free:
        raise BenchError(f"{model_cfg.name}'s weights ({model_cfg.weight_bytes() / 2**30:.1f} "
                         f"GiB) do not fit in {free / 2**30:.1f} GiB free",
                         "use --layers to run fewer layers, or a smaller model")
    model = Decoder(model_cfg, 0, cfg.block_size, "cuda", cfg.seed, cfg.max_model_len)
    results: list[DecodeRow] = []
    for w in workloads:
        steps, num_blocks = plan_steps(w, cfg.block_size)
        model.drop_cache()
        need = workload_memory(model_cfg, num_blocks, cfg.block_size, w.batch)
        avail = cfg.memory_headroom * torch.cuda.mem_get_info()[0]
        if need > avail:
            results.append({**w.to_dict(), "status": "skipped",
                            "reason": f"needs {need / 2**30:.1f} GiB of K/V cache and buffers, "
                                      f"{avail / 2**30:.1f} GiB free"})
            progress(f"{w.label}: skipped ({results[-1]['reason']})")
            continue
        model.alloc_cache(num_blocks, cfg.seed)
        progress(f"{w.label}: {len(steps)} steps, {num_blocks} KV blocks")
        res = run_workload(model, trees, w, steps, cfg, progress)
        res["status"] = "ok"
        results.append(res)
    model.free()
    return {"kind": "decode", "schema": SCHEMA_VERSION, "meta": {
        "device": facts, "model": model_cfg.to_dict(), "config": cfg.to_dict(),
        "trees": [t.name for t in trees], "baseline": trees[0].name,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1), "command": list(command)},
        "results": results}
