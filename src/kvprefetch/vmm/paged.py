"""vLLM's paged decode beside SDPA over the VMM cache: the ``paged_decode`` hook of ``bench.py``.

``kvprefetch vmm bench --paged-workdir DIR`` loads every kernels-only build under ``DIR``
(``ops.load_builds``: baseline first, then patched, paper, the rest by name) into the process that
times SDPA over the VMM cache. For each shape of the vmm bench the hook:

- builds vLLM-layout paged inputs of the SAME attention shape (q heads, kv heads, head_dim, dtype,
  batch, context; block size 16; random block tables; ``kvinputs.make_inputs``);
- times every build with ``bench kernel``'s own per-shape procedure (``bench.kernel.bench_shape``
  through ``run_shapes``, which records a failure and checks the CUDA context afterwards): one CUDA
  graph of decode calls per build, layers rotated so a replay reads more than ``l2_factor`` times
  the L2 (as the VMM side does), ``rounds`` rounds in rotated order timed with CUDA events, median
  and spread, each step launched as vLLM's CUDA graph launches it (``bench/vllm_call.py``: the
  batch padded to its bucket, ``max_seq_len`` the capture length), so the kernel is vLLM's own
  v1/v2 choice for that launch (``ops.choose_kernel``, as ``forward_decode`` makes it);
- checks, in the same run, that every build's outputs equal the baseline's bit for bit (outputs
  poisoned with NaN first, every graph replayed once more).

The paged timing runs right after the shape's VMM/cudaMalloc timing (whose memory is released
first), in the same process and run, not interleaved with it. Bandwidth is the K+V bytes one call
reads once (the same bytes as the VMM side's) over the median time, as a fraction of the copy
bandwidth measured at the start of the run.

torch is imported only by the functions that run kernels.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..bench.kernel import KernelBenchConfig, bench_shape, run_shapes
from ..bench.kernel_results import ShapeResult
from ..bench.matrix import BenchShape
from ..errors import BenchError
from ..kernels.kvinputs import AttnShape, canonical_dtype
from ..kernels.ops import BuiltOps, PagedOps, choose_kernel

if TYPE_CHECKING:
    from .shapes import DecodeConfig

PAGED_BLOCK_SIZE = 16     # the block size vLLM uses by default on CUDA
PRESET_LABEL = "vmm-bench"
NOT_MEASURED = "not measured"
NO_WORKDIR = "no --paged-workdir given"


@dataclass(frozen=True)
class PagedBuildTiming:
    """One build on one shape: ms per decode call (median over rounds) and its spread."""

    name: str
    ms: float
    spread: float                      # (max - min) / median over rounds, as the VMM side
    equal_to_baseline: bool | None     # None for the baseline itself
    nan_free: bool


@dataclass(frozen=True)
class PagedTiming:
    """Every build on one shape. ``status`` is bench kernel's: measured, skipped, failed, not run;
    ``error`` says why for all but measured."""

    status: str
    error: str
    label: str
    kernel: str
    layers: int | None
    builds: tuple[PagedBuildTiming, ...]
    bitwise_equal: bool | None         # every build == baseline, bit for bit, and NaN-free


def check_paged_builds(builds: Sequence[BuiltOps] | Sequence[PagedOps], workdir: Path) -> None:
    """The builds must include the stock kernel, first (ratios are quoted against it)."""
    names = [b.tree if isinstance(b, BuiltOps) else b.name for b in builds]
    if not names:
        raise BenchError(f"no kernels-only builds found under {Path(workdir) / 'build'}",
                         "build them on this machine first: kvprefetch fetch; kvprefetch apply; "
                         "kvprefetch build --kernels-only --head-sizes 128 --block-sizes 16 "
                         "--kv-dtypes fp16 (scripts/device/vmm-vs-paged.sh)")
    if names[0] != "baseline":
        raise BenchError(f"the builds under {workdir} are {', '.join(names)}: no baseline",
                         "build the baseline tree too (kvprefetch build --kernels-only "
                         "--trees baseline,patched)")


def load_paged_ops(workdir: Path) -> list[PagedOps]:
    """``ops.load_builds`` (each library's sha256 checked against its manifest), baseline first."""
    from ..kernels.ops import load_builds

    ops = load_builds(workdir)
    check_paged_builds(ops, workdir)
    return ops


def paged_shape(cfg: DecodeConfig, batch: int, context: int,
                block_size: int = PAGED_BLOCK_SIZE) -> BenchShape:
    """The vmm bench's attention shape in vLLM's paged form, with vLLM's v1/v2 choice."""
    attn = AttnShape(num_seqs=batch, num_heads=cfg.q_heads, num_kv_heads=cfg.kv_heads,
                     head_size=cfg.head_dim, block_size=block_size, max_seq_len=context,
                     dtype=canonical_dtype(cfg.dtype))
    return BenchShape(PRESET_LABEL, attn, choose_kernel(context, batch, cfg.q_heads))


def timing_from_result(r: ShapeResult) -> PagedTiming:
    """bench kernel's per-shape row (us per call) as the vmm bench's ms and spread."""
    builds = tuple(
        PagedBuildTiming(name=v.name, ms=v.time_us.median * 1e-3,
                         spread=((v.time_us.max - v.time_us.min) / v.time_us.median
                                 if v.time_us.median else math.nan),
                         equal_to_baseline=v.equal_to_baseline, nan_free=v.nan_free)
        for v in r.variants)
    return PagedTiming(status=r.status, error=r.error, label=r.shape.label, kernel=r.shape.kernel,
                       layers=r.plan.layers if r.plan else None, builds=builds,
                       bitwise_equal=r.bitwise_equal)


def make_paged_decode(ops: Sequence[PagedOps], cfg: DecodeConfig, l2_bytes: int,
                      copy_bytes_per_s: float, *, device: str = "cuda", backend: Any = None,
                      say: Callable[[str], None] | None = None,
                      ) -> Callable[[int, int], PagedTiming]:
    """The hook ``run_decode_shape`` calls as ``paged_decode(batch, context)``. ``device="cpu"``
    (with in-process reference ops) runs bench kernel's eager host-clock stand-in; only the unit
    tests use it, and its times mean nothing. ``ops[0]`` is the baseline (``load_paged_ops``)."""
    if not ops:
        raise BenchError("no paged builds to time", "pass --paged-workdir with kernels-only builds")
    kcfg = KernelBenchConfig(mode="cold", rounds=cfg.rounds, target_sample_ms=cfg.sample_ms,
                             l2_factor=cfg.l2_factor)
    if device == "cuda":
        from ..bench.kernel import cuda_context_problem, release_cuda_memory

        context_problem, release = cuda_context_problem, release_cuda_memory
    else:
        def context_problem() -> str:
            return ""

        def release() -> None:
            return None

    def paged_decode(batch: int, context: int) -> PagedTiming:
        shape = paged_shape(cfg, batch, context)

        def measure(s: BenchShape, c: KernelBenchConfig) -> ShapeResult:
            return bench_shape(ops, s, c, l2_bytes, copy_bytes_per_s, device=device,
                               backend=backend)

        try:
            results, _ = run_shapes([shape], [kcfg], measure, context_problem, release,
                                    say or (lambda _m: None))
        except BenchError as exc:  # run_shapes records RuntimeErrors; keep the SDPA numbers too
            return PagedTiming("failed", exc.message, shape.label, shape.kernel, None, (), None)
        return timing_from_result(results[0])

    return paged_decode


def paged_fields(t: PagedTiming | None, vmm_ms: float, kv_bytes: int,
                 copy_gbps: float) -> dict[str, Any]:
    """The ``DecodeResult`` fields for one shape: the baseline's ms, spread, VMM/paged ratio and
    fraction of the copy bandwidth at the top level, and the same for every build in
    ``paged_builds`` (so VMM/paged is there against stock and against each patched build)."""
    if t is None:
        return {"paged_status": NOT_MEASURED, "paged_error": NO_WORKDIR}
    out: dict[str, Any] = {"paged_status": t.status, "paged_error": t.error,
                           "paged_kernel": t.kernel, "paged_layers": t.layers}
    if t.status != "measured" or not t.builds:
        return out
    builds: dict[str, dict[str, Any]] = {}
    for b in t.builds:
        gbps = kv_bytes / (b.ms * 1e-3) / 1e9
        builds[b.name] = {"ms": b.ms, "spread": b.spread, "vmm_over_paged": vmm_ms / b.ms,
                          "gbps": gbps, "frac_copy_bw": gbps / copy_gbps,
                          "equal_to_baseline": b.equal_to_baseline, "nan_free": b.nan_free}
    base = builds[t.builds[0].name]
    out.update(paged_ms=base["ms"], paged_spread=base["spread"],
               vmm_over_paged=base["vmm_over_paged"], paged_frac_copy_bw=base["frac_copy_bw"],
               paged_bitwise_equal=t.bitwise_equal, paged_builds=builds)
    return out


def describe_builds(ops: Sequence[PagedOps]) -> list[dict[str, Any]]:
    """What the report records about each loaded build (its library and hash)."""
    return [{"name": o.name, "namespace": o.namespace,
             **({"so_path": str(o.build.so_path), "so_sha256": o.build.so_sha256}
                if o.build else {})} for o in ops]


def render_paged_lines(dec: dict[str, Any]) -> list[str]:
    """The paged part of ``render_summary``: one row per shape, then the ratio ranges."""
    results = dec.get("results", [])
    if not any(r.get("paged_status", NOT_MEASURED) != NOT_MEASURED for r in results):
        why = next((r.get("paged_error") for r in results if r.get("paged_error")), NO_WORKDIR)
        return [f"vLLM paged decode: {NOT_MEASURED} ({why})"]
    names: list[str] = []
    for r in results:
        names += [n for n in r.get("paged_builds", {}) if n not in names]
    lines = [(f"vLLM paged decode (block {PAGED_BLOCK_SIZE}), same shapes: us per call, "
              "vmm/paged, fraction of copy bandwidth")]
    lines.append(f"{'B':>4} {'S':>6} {'k':2} {'vmm us':>8} {'%copy':>6} "
                 + " ".join(f"{n[:10] + ' us':>13} {'vmm/' + n[:6]:>10} {'%copy':>6}"
                            for n in names) + " eq")
    for r in results:
        head = f"{r['batch']:4d} {r['context']:6d} {r.get('paged_kernel') or '-'!s:2} " \
               f"{r['vmm_ms'] * 1e3:8.1f} {r['vmm_frac_copy_bw']:6.1%} "
        if r.get("paged_status") != "measured":
            lines.append(head + f"{r.get('paged_status', NOT_MEASURED)}: {r.get('paged_error')}")
            continue
        cells = []
        for n in names:
            b = r["paged_builds"].get(n)
            cells.append("-".rjust(32) if b is None else
                         f"{b['ms'] * 1e3:13.1f} {b['vmm_over_paged']:10.4f} "
                         f"{b['frac_copy_bw']:6.1%}")
        eq = r.get("paged_bitwise_equal")
        lines.append(head + " ".join(cells) + f" {'-' if eq is None else 'y' if eq else 'N'}")
    for n in names:
        ratios = [r["paged_builds"][n]["vmm_over_paged"] for r in results
                  if n in r.get("paged_builds", {})]
        lines.append(f"vmm/paged[{n}]: min {min(ratios):.3f} median "
                     f"{statistics.median(ratios):.3f} max {max(ratios):.3f} over {len(ratios)} "
                     "shapes")
    measured = [r for r in results if r.get("paged_status") == "measured"]
    lines.append(f"paged outputs bitwise equal across builds: "
                 f"{sum(bool(r.get('paged_bitwise_equal')) for r in measured)}/{len(measured)}")
    return lines
