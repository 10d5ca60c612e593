"""``kvprefetch bench ncu``: the command line parsed into one ``NcuBenchOptions``
(bench/ncu_plan.py, which holds the defaults, the checks and the plan), then the plan's ncu
command lines printed (``--dry-run``, ``--json``) or every build profiled and the per-kernel
deltas rendered. Nothing here imports torch."""

from __future__ import annotations

from typing import Any

import click

from ...bench.ncu_plan import (
    NCU_LAUNCH_COUNT,
    NCU_LAUNCH_SKIP,
    NcuBenchOptions,
    NcuBenchPlan,
    plan_ncu_bench,
    run_ncu_plan,
)
from ...console import emit_json, info, say, table
from ..common import BoundedNumber, dry_run_option, json_option, workdir_option
from .options import output_options, trees_option, usage_errors

_D = NcuBenchOptions  # the defaults the help shows are the library's


@click.command()
@workdir_option
@trees_option
@click.option("--shape", "shapes", multiple=True,
              help="BATCHxCONTEXT, repeatable [default: 1x4k, 8x16k, 64x1k].")
@click.option("--preset", default=_D.preset, show_default=True)
@click.option("--block-size", type=int, default=_D.block_size, show_default=True)
@click.option("--dtype", default=_D.dtype, show_default=True)
@click.option("--kv-cache-dtype", default=_D.kv_cache_dtype, show_default=True)
@click.option("--force-kernel", type=click.Choice(["v1", "v2"]), default=_D.force_kernel)
@click.option("--launch-skip", type=BoundedNumber(NCU_LAUNCH_SKIP),
              default=_D.launch_skip, show_default=True)
@click.option("--launch-count", type=BoundedNumber(NCU_LAUNCH_COUNT),
              default=_D.launch_count, show_default=True)
@click.option("--ncu", "ncu", default=_D.ncu, show_default=True, help="The ncu executable.")
@output_options(_D.name)
@dry_run_option
@json_option
def ncu(dry_run: bool, as_json: bool, **options: Any) -> None:
    """Nsight Compute attribution (the seed's recipe: application replay, cold caches, unlocked
    clocks) for every variant on a few shapes; per-kernel deltas of time, DRAM bytes, L2 hit
    rate and long-scoreboard stalls."""
    with usage_errors():
        plan = plan_ncu_bench(NcuBenchOptions(**options))
    if dry_run:
        _show_plan(plan, as_json)
        return
    run = run_ncu_plan(plan, progress=info)
    if as_json:
        emit_json(run.doc)
        return
    rows = [[s["label"], v, d["kernel"], f"{d['speedup']:.3f}" if d["speedup"] else "-",
             f"{d['dram_read']['change']:.3f}" if d["dram_read"]["change"] else "-",
             f"{d['l2_hit']['change']:+.1f}" if d["l2_hit"]["change"] is not None else "-",
             f"{d['long_sb_stall']['change']:+.1f}" if d["long_sb_stall"]["change"] is not None
             else "-"]
            for s in run.doc["shapes"] for v, ds in s["deltas"].items() for d in ds]
    table(["shape", "variant", "kernel", "speedup", "DRAM ratio", "L2 hit Δpt", "stall Δpt"],
          rows, title="bench ncu")
    info("wrote " + ", ".join(str(p) for p in run.paths))


def _show_plan(plan: NcuBenchPlan, as_json: bool) -> None:
    if as_json:
        emit_json(plan.to_dict())
        return
    from ...runner import quote

    if not plan.builds:
        info("no kernels-only builds found; commands shown per build once there are some")
    for c in plan.commands():
        say(quote(c))
