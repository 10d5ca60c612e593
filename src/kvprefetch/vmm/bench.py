"""The H200 measurements for the VMM cache: decode attention over the virtually contiguous cache
against the same kernel over an ordinary ``cudaMalloc``'d tensor, and the device copy bandwidth
that gives the HBM floor. Step latency with and without the worker is in ``steplat.py``; ``main``
runs both and writes one JSON file (``python -m kvprefetch.vmm.bench --out FILE``).

Method (research/ and the device notes): both variants run in one process, interleaved round by
round with the order alternating; each sample is one CUDA-graph replay of ``layers`` SDPA calls,
each over a different layer's K/V so the bytes read per replay exceed the L2 ``l2_factor`` times;
CUDA events time ``reps`` replays; the median over rounds and the spread (min..max over median)
are reported. Inputs are random normal, never zeros; the two variants hold the same values, so
their outputs must be bitwise equal (checked). The measuring tools (CUDA-graph capture, the
interleaved timing, the copy figure, the float64 reference) are ``timing.py``'s.

The kernel is ``torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)`` with
one query token per sequence, ``q [B, Hq, 1, D]`` and ``k, v [B, Hkv, S, D]`` as views of the cache
(``[B, S, H, D]`` transposed). Which backend torch picks is read from ``torch._fused_sdp_choice``.

``paged_decode(batch, context) -> PagedTiming`` is the hook for vLLM's paged kernel: with
``--paged-workdir DIR`` every kernels-only build under DIR (stock and patched) is loaded into this
process and timed on the same attention shape by ``paged.py`` (bench kernel's procedure), right
after the shape's SDPA timing; per shape the report then has each build's time, VMM/paged ratio,
fraction of the copy bandwidth and the bitwise check across builds. Without it the paged columns
say "not measured"."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .layout import KVCacheSpec, Layout
from .shapes import (
    DEFAULT_BATCHES,
    DEFAULT_CONTEXTS,
    DecodeConfig,
    ShapePlan,
    plan_shapes,
)
from .timing import (
    device_facts,
    graph_of,
    measure_copy_bandwidth,
    reference_rel_err,
    sdpa_backend,
    summarize,
    time_interleaved,
)

if TYPE_CHECKING:
    from ..kernels.ops import PagedOps
    from .paged import PagedTiming

PagedDecode = Callable[[int, int], "PagedTiming"]


@dataclass(frozen=True)
class DecodeResult:
    batch: int
    context: int
    layers: int
    kv_bytes_per_call: int
    backend: str
    vmm_ms: float
    malloc_ms: float
    vmm_spread: float          # (max - min) / median over rounds
    malloc_spread: float
    ratio: float               # vmm / malloc (1.0 = identical)
    within_3pct: bool
    vmm_gbps: float
    malloc_gbps: float
    vmm_frac_copy_bw: float
    malloc_frac_copy_bw: float
    bitwise_equal: bool        # default backend: vmm output == malloc output, bit for bit
    default_deterministic: bool | None = None  # malloc graph replayed twice: same bits?
    max_abs_diff: float | None = None          # default backend, vmm vs malloc
    ref_rel_err: float | None = None           # vmm output vs float64 reference (2 sequences)
    vmm_frac_read_bw: float | None = None
    flash_vmm_ms: float | None = None          # the same comparison forced onto FLASH_ATTENTION
    flash_malloc_ms: float | None = None
    flash_ratio: float | None = None
    flash_bitwise_equal: bool | None = None
    flash_ref_rel_err: float | None = None
    flash_error: str | None = None
    paged_status: str = "not measured"         # else bench kernel's: measured, skipped, failed
    paged_error: str = ""
    paged_kernel: str | None = None            # vLLM's v1/v2 choice for the shape
    paged_layers: int | None = None
    paged_ms: float | None = None              # the baseline (stock) build
    paged_spread: float | None = None
    vmm_over_paged: float | None = None        # vmm_ms / paged_ms (baseline)
    paged_frac_copy_bw: float | None = None    # K+V read once / paged_ms / copy bandwidth
    paged_bitwise_equal: bool | None = None    # every build's outputs == baseline's, bit for bit
    paged_builds: dict[str, dict[str, Any]] = field(default_factory=dict)  # per build, as above
    samples: dict[str, list[float]] = field(default_factory=dict)



def run_decode_shape(cfg: DecodeConfig, plan: ShapePlan, copy_gbps: float,
                     paged_decode: PagedDecode | None = None,
                     read_gbps: float | None = None) -> DecodeResult:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from .cache import VirtualKVCache

    b, s, layers = plan.batch, plan.context, plan.layers
    dtype = getattr(torch, cfg.dtype)
    spec = KVCacheSpec(num_layers=layers, num_kv_heads=cfg.kv_heads, head_dim=cfg.head_dim,
                       max_batch=b, max_context=s, dtype=cfg.dtype, layout=Layout.PER_LAYER)
    cache = VirtualKVCache(spec, async_mapping=False, eager_groups=0)
    flash: dict[str, Any] = {}
    try:
        slots = [cache.alloc_reqid() for _ in range(b)]
        cache.step({slot: s for slot in slots})
        g = cache.geometry
        vk = [cache.key(layer) for layer in range(layers)]
        vv = [cache.value(layer) for layer in range(layers)]
        mk = [torch.empty_strided(g.shape, g.strides_elems, dtype=dtype, device="cuda")
              for _ in range(layers)]
        mv = [torch.empty_strided(g.shape, g.strides_elems, dtype=dtype, device="cuda")
              for _ in range(layers)]
        for t_vmm, t_mal in zip(vk + vv, mk + mv, strict=True):
            t_vmm.normal_()
            t_mal.copy_(t_vmm)
        q = torch.randn(b, cfg.q_heads, 1, cfg.head_dim, dtype=dtype, device="cuda")

        def attend(ks: list[Any], vs: list[Any], forced: Any = None) -> Callable[[], Any]:
            def calls() -> Any:
                return [F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2),
                                                       enable_gqa=True)
                        for k, v in zip(ks, vs, strict=True)]

            def fn() -> Any:
                if forced is None:
                    return calls()
                with sdpa_kernel([forced]):
                    return calls()
            return fn

        backend = sdpa_backend(q, vk[0].transpose(1, 2), vv[0].transpose(1, 2))
        graphs: dict[str, Any] = {}
        outs: dict[str, Any] = {}
        graphs["vmm"], outs["vmm"] = graph_of(attend(vk, vv))
        graphs["malloc"], outs["malloc"] = graph_of(attend(mk, mv))
        try:
            graphs["vmm_flash"], outs["vmm_flash"] = graph_of(
                attend(vk, vv, SDPBackend.FLASH_ATTENTION))
            graphs["malloc_flash"], outs["malloc_flash"] = graph_of(
                attend(mk, mv, SDPBackend.FLASH_ATTENTION))
        except RuntimeError as exc:  # flash not eligible here: keep the default comparison
            flash["flash_error"] = str(exc).splitlines()[0][:300]
            graphs.pop("vmm_flash", None)
            outs.pop("vmm_flash", None)
        samples = time_interleaved(graphs, layers, cfg.rounds, cfg.sample_ms)
        torch.cuda.synchronize()
        pairs = list(zip(outs["vmm"], outs["malloc"], strict=True))
        equal = all(torch.equal(x, y) for x, y in pairs)
        max_abs = max(float((x.float() - y.float()).abs().max()) for x, y in pairs)
        n_ref = min(b, 2)
        ref_err = reference_rel_err(q, vk[0], vv[0], outs["vmm"][0], n_ref)
        snap = [o.clone() for o in outs["malloc"]]
        graphs["malloc"].replay()
        torch.cuda.synchronize()
        deterministic = all(torch.equal(x, y) for x, y in zip(snap, outs["malloc"], strict=True))
        vmm_ms, vmm_spread = summarize(samples["vmm"])
        mal_ms, mal_spread = summarize(samples["malloc"])
        if "vmm_flash" in graphs:
            fv, _ = summarize(samples["vmm_flash"])
            fm, _ = summarize(samples["malloc_flash"])
            flash.update(
                flash_vmm_ms=fv, flash_malloc_ms=fm, flash_ratio=fv / fm,
                flash_bitwise_equal=all(torch.equal(x, y) for x, y in
                                        zip(outs["vmm_flash"], outs["malloc_flash"], strict=True)),
                flash_ref_rel_err=reference_rel_err(q, vk[0], vv[0], outs["vmm_flash"][0],
                                                     n_ref))
        del graphs, outs, snap, pairs, vk, vv, mk, mv
        torch.cuda.synchronize()
    finally:
        cache.teardown()
        torch.cuda.empty_cache()
    from .paged import paged_fields

    # After the VMM cache and the cudaMalloc copies are gone: the paged inputs get their memory.
    paged = paged_fields(paged_decode(b, s) if paged_decode is not None else None,
                         vmm_ms, plan.kv_bytes_per_call, copy_gbps)

    def gbps(ms: float) -> float:
        return plan.kv_bytes_per_call / (ms * 1e-3) / 1e9

    ratio = vmm_ms / mal_ms
    return DecodeResult(
        batch=b, context=s, layers=layers, kv_bytes_per_call=plan.kv_bytes_per_call,
        backend=backend, vmm_ms=vmm_ms, malloc_ms=mal_ms, vmm_spread=vmm_spread,
        malloc_spread=mal_spread, ratio=ratio, within_3pct=abs(ratio - 1.0) <= 0.03,
        vmm_gbps=gbps(vmm_ms), malloc_gbps=gbps(mal_ms),
        vmm_frac_copy_bw=gbps(vmm_ms) / copy_gbps, malloc_frac_copy_bw=gbps(mal_ms) / copy_gbps,
        bitwise_equal=equal, default_deterministic=deterministic, max_abs_diff=max_abs,
        ref_rel_err=ref_err,
        vmm_frac_read_bw=gbps(vmm_ms) / read_gbps if read_gbps else None,
        samples=samples, **flash, **paged,
    )


def run_decode(cfg: DecodeConfig, paged_ops: Sequence[PagedOps] = (),
               say: Callable[[str], None] = print,
               partial: dict[str, Any] | None = None,
               checkpoint: Callable[[], None] | None = None) -> dict[str, Any]:
    """All shapes; with ``paged_ops`` (baseline first) vLLM's paged decode of each build too.
    ``partial`` (if given) receives the results so far under "decode", and ``checkpoint`` runs
    after every shape (main writes the JSON there), so a failure or a kill in a late shape keeps
    the early ones."""
    import torch

    from .paged import NO_WORKDIR, PAGED_BLOCK_SIZE, describe_builds, make_paged_decode

    facts = device_facts()
    copy = measure_copy_bandwidth()
    say(f"copy bandwidth {copy['gbps']:.0f} GB/s (read+write), read-only "
        f"{copy['read_gbps']:.0f} GB/s, L2 {facts['l2_bytes'] >> 20} MiB")
    paged_decode = (make_paged_decode(paged_ops, cfg, facts["l2_bytes"], copy["gbps"] * 1e9,
                                      say=say) if paged_ops else None)
    paged = ({"builds": describe_builds(paged_ops), "block_size": PAGED_BLOCK_SIZE}
             if paged_ops else {"builds": [], "not_measured": NO_WORKDIR})
    free, _ = torch.cuda.mem_get_info()
    plans, trimmed = plan_shapes(cfg, facts["l2_bytes"], free)
    for t in trimmed:
        say(f"trimmed {t}")
    results: list[DecodeResult] = []
    if partial is not None:
        partial["decode"] = {"config": asdict(cfg), "device": facts, "copy_bandwidth": copy,
                             "paged": paged, "trimmed": trimmed, "results": [], "partial": True}
    for p in plans:
        r = run_decode_shape(cfg, p, copy["gbps"], paged_decode, copy["read_gbps"])
        results.append(r)
        if partial is not None:
            partial["decode"]["results"].append(asdict(r))
        if checkpoint is not None:
            checkpoint()
        say(f"B={r.batch:4d} S={r.context:6d} L={r.layers:3d} {r.backend:20s} "
            f"vmm {r.vmm_ms * 1e3:9.1f} us  malloc {r.malloc_ms * 1e3:9.1f} us  "
            f"ratio {r.ratio:.4f}  {r.vmm_frac_copy_bw:6.1%} of copy bw  equal={r.bitwise_equal}"
            f" det={r.default_deterministic} flash ratio {r.flash_ratio} "
            f"flash equal={r.flash_bitwise_equal} ref err {r.ref_rel_err:.1e} paged "
            + (f"{r.paged_ms * 1e3:.1f} us vmm/paged {r.vmm_over_paged:.3f} equal="
               f"{r.paged_bitwise_equal}" if r.paged_ms and r.vmm_over_paged
               else f"{r.paged_status} {r.paged_error}"))
    return {"config": asdict(cfg), "device": facts, "copy_bandwidth": copy, "paged": paged,
            "trimmed": trimmed, "results": [asdict(r) for r in results]}


def render_summary(report: dict[str, Any]) -> str:
    """A short plain-text table of a bench report (what the device run prints last)."""
    lines = []
    for r in report.get("step_latency", []):
        drv = r.get("driver_us", {})
        p50 = " ".join(f"{k} {v['p50_us']:.1f}" for k, v in drv.items() if k != "worker_job")
        lines.append(f"step {r['layout']:14s} {r['mode']:5s} compute {r['compute_ms']:4.1f} ms: "
                     f"crossing {r['cross_us_median']:9.1f} us, {r['cross_us_per_page']:6.2f} "
                     f"us/page, {r['cross_us_per_layer']:7.2f} us/layer, wait "
                     f"{r['wait_us_median']:8.1f} us; driver p50 us: {p50}")
    dec = report.get("decode")
    if dec:
        cb = dec["copy_bandwidth"]
        lines.append(f"copy bandwidth {cb['gbps']:.0f} GB/s (read+write), read-only "
                     f"{cb.get('read_gbps', math.nan):.0f} GB/s; device {dec['device']['name']}")
        lines.append(f"{'B':>4} {'S':>6} {'L':>3} {'backend':16s} {'vmm us':>8} {'malloc us':>9} "
                     f"{'ratio':>6} {'spread v/m':>11} {'%copy':>6} {'%read':>6} eq det "
                     f"{'ref err':>7} {'flash r':>7} feq")

        def yn(v: Any) -> str:
            return "-" if v is None else ("y" if v else "N")

        for r in dec["results"]:
            fr = r.get("flash_ratio")
            rd = r.get("vmm_frac_read_bw")
            lines.append(f"{r['batch']:4d} {r['context']:6d} {r['layers']:3d} "
                         f"{r['backend'][:16]:16s} {r['vmm_ms'] * 1e3:8.1f} "
                         f"{r['malloc_ms'] * 1e3:9.1f} {r['ratio']:6.4f} "
                         f"{r['vmm_spread']:5.3f}/{r['malloc_spread']:5.3f} "
                         f"{r['vmm_frac_copy_bw']:6.1%} "
                         f"{'-' if rd is None else format(rd, '6.1%'):>6} "
                         f"{yn(r['bitwise_equal']):>2} {yn(r.get('default_deterministic')):>3} "
                         f"{r.get('ref_rel_err') or math.nan:7.1e} "
                         f"{'-' if fr is None else format(fr, '7.4f'):>7} "
                         f"{yn(r.get('flash_bitwise_equal')):>3}")
        ratios = [r["ratio"] for r in dec["results"]]
        if ratios:
            lines.append(f"ratio vmm/malloc: min {min(ratios):.4f} median "
                         f"{statistics.median(ratios):.4f} max {max(ratios):.4f}; within 3%: "
                         f"{sum(abs(x - 1) <= 0.03 for x in ratios)}/{len(ratios)}")
        fratios = [r["flash_ratio"] for r in dec["results"] if r.get("flash_ratio")]
        if fratios:
            lines.append(f"forced FLASH_ATTENTION ratio vmm/malloc: min {min(fratios):.4f} "
                         f"max {max(fratios):.4f}; within 3%: "
                         f"{sum(abs(x - 1) <= 0.03 for x in fratios)}/{len(fratios)}")
        from .paged import render_paged_lines

        lines += render_paged_lines(dec)
    return "\n".join(lines)


@dataclass(frozen=True)
class BenchRun:
    """What ``run_bench`` measured (the report as written to its JSON file) and what failed."""

    report: dict[str, Any]
    failed: tuple[str, ...]


def run_bench(out: Path, cfg: DecodeConfig, *, steps: bool = True, decode: bool = True,
              paged_workdir: Path | None = None,
              say: Callable[[str], None] | None = None) -> BenchRun:
    """Step latency (unless not ``steps``) and the decode comparison (unless not ``decode``),
    with vLLM's paged decode of every kernels-only build under ``paged_workdir`` when given.
    The JSON report at ``out`` is rewritten atomically after each part, so a run killed half-way
    keeps what it measured; a part that fails is recorded (``*_error``) and the others run."""
    import json
    import sys
    import time

    def _say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    say = say or _say
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "argv": list(sys.argv)}
    from .driver import bindings_version

    report["cuda_bindings"] = bindings_version()

    def write() -> None:  # atomic: a run killed mid-write keeps the previous checkpoint
        # confine.write_file, like every output of the kit's: a new temporary (O_EXCL |
        # O_NOFOLLOW) beside it, never through a planted symlink (issue 41, third pass: a link
        # at `<out>.tmp` had the report written into the file it pointed at)
        from ..workspace.confine import write_file
        from .errors import VmmError

        write_file(Path(out), json.dumps(report, indent=1, default=str), family=VmmError)

    failed = []
    if steps:
        from .steplat import run_step_latency_suite

        try:
            report["step_latency"] = run_step_latency_suite(say=say)
        except Exception as exc:  # noqa: BLE001 - recorded; the decode part still runs
            import traceback

            report["step_latency_error"] = traceback.format_exc()
            failed.append(f"step latency: {exc}")
        write()
    if decode:
        paged_ops: list[PagedOps] = []
        if paged_workdir is not None:
            from .paged import load_paged_ops

            try:
                paged_ops = load_paged_ops(paged_workdir)
                say("paged builds: " + ", ".join(f"{o.name} ({o.namespace})" for o in paged_ops))
            except Exception as exc:  # noqa: BLE001 - recorded; SDPA over VMM still runs
                report["paged_load_error"] = str(exc)
                failed.append(f"paged builds: {exc}")
        try:
            report["decode"] = run_decode(cfg, paged_ops, say=say, partial=report,
                                          checkpoint=write)
        except Exception as exc:  # noqa: BLE001 - recorded with what was measured so far
            import traceback

            report["decode_error"] = traceback.format_exc()
            failed.append(f"decode: {exc}")
    report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write()
    return BenchRun(report, tuple(failed))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvprefetch.vmm.bench``: ``run_bench`` without the kvprefetch CLI."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--batches", default=",".join(map(str, DEFAULT_BATCHES)))
    ap.add_argument("--contexts", default=",".join(map(str, DEFAULT_CONTEXTS)))
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--skip-steps", action="store_true")
    ap.add_argument("--paged-workdir", default=None,
                    help="time vLLM's paged decode of every kernels-only build under it too")
    args = ap.parse_args(argv)
    cfg = DecodeConfig(batches=tuple(int(x) for x in args.batches.split(",")),
                       contexts=tuple(int(x) for x in args.contexts.split(",")),
                       rounds=args.rounds)
    res = run_bench(Path(args.out), cfg, steps=not args.skip_steps, decode=not args.skip_decode,
                    paged_workdir=Path(args.paged_workdir) if args.paged_workdir else None)
    print(render_summary(res.report), flush=True)
    for f in res.failed:
        print(f"FAILED {f}", flush=True)
    return 1 if res.failed else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
