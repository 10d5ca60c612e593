"""``kvprefetch vmm``: the virtually contiguous KV cache (vAttention on CUDA VMM).

- ``vmm selftest``: a randomized alloc/step/free run with invariant checks that must end with
  nothing leaked; ``--driver fake`` runs it without a GPU against the strict in-memory driver.
- ``vmm bench``: on a GPU, step latency with and without the mapping worker, and decode
  attention (torch SDPA) over the VMM cache vs a cudaMalloc'd tensor, as one JSON report; with
  ``--paged-workdir`` also vLLM's paged decode of every kernels-only build there (stock and
  patched) on the same shapes, in the same process and run.

Thin over ``kvprefetch.vmm``; torch and cuda-python are imported only when a command runs."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from ..console import emit_json, info, say, step, table
from ..errors import BenchError, KvprefetchError
from .common import dry_run_option, json_option, output_file, refuse_foreign_links

_MAX_SIZE = 2**31 - 1  # as bench kernel's sizes (bench/matrix.py): the kernels' int32


def _sizes(text: str) -> tuple[int, ...]:
    """The sizes of ``text``, order kept, a repeated one once (each size is a row of shapes)."""
    out: dict[int, None] = {}
    for part in text.split(","):
        part = part.strip().lower()
        mult = 1024 if part.endswith("k") else 1
        try:
            n = int(part.rstrip("k")) * mult
        except ValueError:
            raise click.BadParameter(f"'{part}' is not a size like 512, 1k or 16k") from None
        if n <= 0:
            raise click.BadParameter(f"'{part}' must be positive")
        if n > _MAX_SIZE:
            # a 400-digit size made the plan's float arithmetic an OverflowError traceback
            # (issue 41, the nineteenth hostile pass)
            raise click.BadParameter(f"'{part}' is above {_MAX_SIZE} (2**31 - 1), the largest "
                                     "batch or context an int32 holds")
        out[n] = None
    return tuple(out)


# `vmm selftest --ops`'s ceiling: an op takes about 50 us against the fake driver (more
# against CUDA's, which maps real pages), so 10^7 ops is some ten minutes; a longer soak is more
# seeds, each a run of its own. 10**20 ran for as long as asked (issue 41, fourth pass).
MAX_OPS = 10_000_000


def _paged_workdir(param: click.Parameter, value: Path | None) -> Path | None:
    """``--paged-workdir``: the kit loads the kernels-only builds it finds there, so another
    user's link on the way is refused as for ``--workdir`` (issue 41, the thirty-eighth
    hostile pass: it was followed into the folder that user chose)."""
    if value is not None:
        refuse_foreign_links(param, str(value))
    return value


def _require_gpu(error: type[KvprefetchError], command: str, fix: str) -> None:
    """``error`` unless torch sees a CUDA GPU, before any work (issue 41, the ninth hostile
    pass: without one `vmm bench` ran every part, wrote its report of tracebacks and exited 7,
    and `vmm selftest` said "pass driver=FakeVmmDriver()", a Python argument, not an option).
    Where torch cannot be imported at all, the command's own message names it. Before any
    kernel loads, the caches CUDA writes by path are checked (``machine/gpu_folders``)."""
    from ..machine.gpu_folders import refuse_foreign_gpu_folders

    try:
        import torch
    except ImportError:
        return
    if not torch.cuda.is_available():
        raise error(f"vmm {command} needs a CUDA GPU and none is visible to PyTorch", fix)
    refuse_foreign_gpu_folders()


@click.group()
def vmm() -> None:
    """Virtually contiguous KV cache on CUDA's virtual memory API (vAttention)."""


@vmm.command()
@click.option("--driver", "driver_name", type=click.Choice(["cuda", "fake"]), default="cuda",
              show_default=True, help="'fake' runs the bookkeeping against an in-memory driver.")
@click.option("--ops", default=2000, show_default=True, type=click.IntRange(min=1, max=MAX_OPS),
              help=f"Random operations to run (at most {MAX_OPS:,}).")
@click.option("--seed", default=0, show_default=True)
@click.option("--layout", type=click.Choice(["per-layer", "tensor-slicing"]), default="per-layer",
              show_default=True)
@click.option("--sync", "sync_mapping", is_flag=True, help="No mapping worker (map inline).")
@json_option
def selftest(driver_name: str, ops: int, seed: int, layout: str, sync_mapping: bool,
             as_json: bool) -> None:
    """Random alloc/step/free ops (with preemption on out-of-memory); checks every step's pages
    and that teardown leaves nothing mapped, created or reserved."""
    from ..vmm import KVCacheSpec, Layout, VmmError
    from ..vmm.cache import VirtualKVCache
    from ..vmm.selftest import run_stress

    spec = KVCacheSpec(num_layers=2, num_kv_heads=8, head_dim=128, max_batch=8,
                       max_context=8192, layout=Layout(layout))
    driver: Any = None
    if driver_name == "cuda":
        _require_gpu(VmmError, "selftest", "run it on the GPU machine, or pass `--driver fake` "
                                           "to check the bookkeeping without one")
    if driver_name == "fake":
        from ..vmm.fake import FakeVmmDriver

        driver = FakeVmmDriver(overlap_sleep_s=1e-5)
    with step(f"vmm selftest: {ops} ops, {driver_name} driver, {layout}"):
        cache = VirtualKVCache(spec, driver=driver, async_mapping=not sync_mapping,
                               physical_budget_bytes=48 * 4 * (2 << 20))
        free_before = cache.driver.mem_info()[0]
        try:
            report = run_stress(cache, ops, seed)
        finally:
            cache.teardown()
        stats = cache.stats()  # after teardown: the counters must balance
        leaks: dict[str, int] = {}
        if driver_name == "fake":
            leaks = {k: v for k, v in driver.live().items() if v}
        counters = stats.counters
        if counters["pages_created"] != counters["pages_released"]:
            leaks["handles"] = counters["pages_created"] - counters["pages_released"]
        if counters["pages_mapped"] != counters["pages_unmapped"]:
            leaks["mappings"] = counters["pages_mapped"] - counters["pages_unmapped"]
        if leaks:
            raise VmmError(f"teardown left resources behind: {leaks}",
                           "this is a bug in kvprefetch.vmm; rerun with --debug and report it")
    result = {"report": report, "driver": driver_name, "layout": layout,
              "free_bytes_before": free_before, "leaks": leaks}
    if as_json:
        emit_json(result)
        return
    table(["ops", "steps", "admitted", "finished", "preempted", "OOM", "pages created",
           "leaks"],
          [[report.ops, report.steps, report.admitted, report.finished, report.preempted,
            report.oom_errors, counters["pages_created"], "none"]], title="vmm selftest")


@vmm.command()
@click.option("--out", type=click.Path(), default="vmm-bench.json",  # output_file: a Path
              show_default=True, help="JSON report to write.", callback=output_file)
@click.option("--batches", default="1,8,32,64,128", show_default=True)
@click.option("--contexts", default="512,1k,4k,16k", show_default=True)
# at least one: zero rounds (or fewer) timed nothing and left the medians to a list of none
@click.option("--rounds", type=click.IntRange(min=1, max=10_000), default=9, show_default=True,
              help="Interleaved timing rounds.")
@click.option("--skip-steps", is_flag=True, help="Skip the step-latency part.")
@click.option("--skip-decode", is_flag=True, help="Skip the decode-attention comparison.")
@click.option("--paged-workdir", type=click.Path(path_type=Path, file_okay=False), default=None,
              callback=lambda ctx, param, value: _paged_workdir(param, value),
              help="A workdir with kernels-only builds (kvprefetch build --kernels-only, on this "
                   "machine): also time vLLM's paged decode of each build (stock first) on the "
                   "same shapes. Default: the paged columns say 'not measured'.")
@dry_run_option
@json_option
def bench(out: Path, batches: str, contexts: str, rounds: int, skip_steps: bool,
          skip_decode: bool, paged_workdir: Path | None, dry_run: bool, as_json: bool) -> None:
    """Step latency with/without the worker, and SDPA decode over the VMM cache vs cudaMalloc
    (Llama-3.1-8B attention: 32 q heads, 8 kv heads, d=128, fp16), optionally against vLLM's
    paged kernel of each build under --paged-workdir. Needs a GPU."""
    from ..bench.matrix import check_shape_count
    from ..errors import ConfigError
    from ..kernels.ops import find_builds
    from ..vmm.bench import render_summary, run_bench
    from ..vmm.paged import NO_WORKDIR, PAGED_BLOCK_SIZE, check_paged_builds, paged_shape
    from ..vmm.shapes import L2_BYTES_IF_UNKNOWN, DecodeConfig, plan_shapes

    cfg = DecodeConfig(batches=_sizes(batches), contexts=_sizes(contexts), rounds=rounds)
    # every batch times every context, as bench decode's: the same ceiling, before any shape is
    # made (`--batches 1,...,20000` kept a dry run planning and drawing for minutes, and two
    # such lists, within the command line's 2 MB, for days: issue 41, 21st hostile pass)
    try:
        check_shape_count(len(cfg.batches) * len(cfg.contexts), "--batches times --contexts")
    except ConfigError as exc:
        raise click.BadParameter(exc.message, param_hint="'--batches' / '--contexts'") from None
    builds = []
    if paged_workdir is not None:  # fail here, before any GPU work, when the builds are missing
        builds = find_builds(paged_workdir)
        check_paged_builds(builds, paged_workdir)
    if dry_run:
        plans, _ = plan_shapes(cfg, L2_BYTES_IF_UNKNOWN, None)
        kernels = [paged_shape(cfg, p.batch, p.context).kernel for p in plans]
        plan = {"out": str(out), "steps": not skip_steps, "decode": not skip_decode,
                "shapes": [dict(asdict(p), paged_kernel=k)
                           for p, k in zip(plans, kernels, strict=True)],
                "assumed_l2_bytes": L2_BYTES_IF_UNKNOWN,
                "paged": ({"workdir": str(paged_workdir), "block_size": PAGED_BLOCK_SIZE,
                           "builds": [b.to_dict() for b in builds]}
                          if builds else {"builds": [], "not_measured": NO_WORKDIR})}
        if as_json:
            emit_json(plan)
            return
        table(["batch", "context", "layers rotated", "KV bytes/call", "GiB per variant",
               "paged kernel"],
              [[p.batch, p.context, p.layers, p.kv_bytes_per_call,
                f"{p.bytes_per_variant / 2**30:.2f}", k if builds else "not measured"]
               for p, k in zip(plans, kernels, strict=True)],
              title="vmm bench plan (dry run)")
        for b in builds:
            info(f"paged build {b.tree}: {b.so_path} (sha256 {b.so_sha256[:16]})")
        return
    if not (skip_steps and skip_decode):  # both skipped: a report of the settings only
        _require_gpu(BenchError, "bench",
                     "run it on the GPU machine; `--dry-run` plans without one")
    with step("vmm bench"):
        res = run_bench(out, cfg, steps=not skip_steps, decode=not skip_decode,
                        paged_workdir=paged_workdir)
    # with --json, stdout holds only the report
    say(render_summary(res.report), err=as_json)
    for f in res.failed:
        say(f"FAILED {f}", err=as_json)
    info(f"report written to {out}")
    if as_json:
        sys.stdout.write(out.read_text() + "\n")
    if res.failed:
        raise BenchError("a part of vmm bench failed (the FAILED lines above)",
                         f"read the tracebacks recorded in {out} (*_error keys)")
