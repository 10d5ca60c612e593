"""``kvprefetch bench ncu``: parses the command line into ``bench.ncu``'s ``NcuOptions`` and
shapes, prints the ncu command lines (``--dry-run``) or profiles every build and renders the
per-kernel deltas. Nothing here imports torch."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ...bench.plan import parse_formats, require_baseline_first
from ...console import emit_json, info, table
from ...errors import BenchError
from ..common import dry_run_option, json_option, workdir_option
from .options import output_options, trees_option, usage_errors


@click.command()
@workdir_option
@trees_option
@click.option("--shape", "shape_specs", multiple=True,
              help="BATCHxCONTEXT, repeatable [default: 1x4k, 8x16k, 64x1k].")
@click.option("--preset", default="llama-3.1-8b", show_default=True)
@click.option("--block-size", type=int, default=16, show_default=True)
@click.option("--dtype", default="float16", show_default=True)
@click.option("--kv-cache-dtype", default="auto", show_default=True)
@click.option("--force-kernel", type=click.Choice(["v1", "v2"]), default=None)
@click.option("--launch-skip", type=int, default=20, show_default=True)
@click.option("--launch-count", type=int, default=10, show_default=True)
@click.option("--ncu", "ncu_path", default="ncu", show_default=True, help="The ncu executable.")
@output_options("ncu")
@dry_run_option
@json_option
def ncu(workdir: Path, trees: tuple[str, ...], shape_specs: tuple[str, ...], preset: str,
        block_size: int, dtype: str, kv_cache_dtype: str, force_kernel: str | None,
        launch_skip: int, launch_count: int, ncu_path: str, out: Path | None, name: str,
        formats: str, dry_run: bool, as_json: bool) -> None:
    """Nsight Compute attribution (the seed's recipe: application replay, cold caches, unlocked
    clocks) for every variant on a few shapes; per-kernel deltas of time, DRAM bytes, L2 hit
    rate and long-scoreboard stalls."""
    from ...bench.matrix import shapes_from_specs
    from ...bench.ncu import NcuOptions, launches_needed, ncu_command, run_ncu_bench, target_command
    from ...kernels.ops import find_builds

    shapes = shapes_from_specs(shape_specs or ("1x4k", "8x16k", "64x1k"), preset, block_size,
                               dtype, kv_cache_dtype, force_kernel)
    opts = NcuOptions(launch_skip=launch_skip, launch_count=launch_count, ncu=ncu_path)
    with usage_errors():
        fmts = parse_formats(formats)
    out_dir = out or workdir / "bench"
    builds = find_builds(workdir, trees or None)
    if dry_run:
        cmds = [ncu_command(target_command(sys.executable, b.so_path, b.namespace, s.to_dict(),
                                           launches_needed(s.kernel, opts)),
                            out_dir / f"ncu-{i}-{b.tree}.csv", opts)
                for i, s in enumerate(shapes, 1) for b in builds]
        if as_json:
            emit_json({"shapes": [s.to_dict() for s in shapes],
                       "variants": [b.to_dict() for b in builds], "commands": cmds})
        else:
            from ...runner import quote

            if not builds:
                info("no kernels-only builds found; commands shown per build once there are some")
            for c in cmds:
                click.echo(quote(c))
        return
    if len(builds) < 2:
        raise BenchError(f"need the baseline and a variant, found {[b.tree for b in builds]}",
                         "run `kvprefetch build --kernels-only` first")
    require_baseline_first([b.tree for b in builds])
    from ...bench.report import write_outputs

    doc = run_ncu_bench(builds, shapes, out_dir, opts, progress=info, command=sys.argv)
    paths = write_outputs(doc, out_dir, name, fmts)
    if as_json:
        emit_json(doc)
        return
    rows = [[s["label"], v, d["kernel"], f"{d['speedup']:.3f}" if d["speedup"] else "-",
             f"{d['dram_read']['change']:.3f}" if d["dram_read"]["change"] else "-",
             f"{d['l2_hit']['change']:+.1f}" if d["l2_hit"]["change"] is not None else "-",
             f"{d['long_sb_stall']['change']:+.1f}" if d["long_sb_stall"]["change"] is not None
             else "-"]
            for s in doc["shapes"] for v, ds in s["deltas"].items() for d in ds]
    table(["shape", "variant", "kernel", "speedup", "DRAM ratio", "L2 hit Δpt", "stall Δpt"],
          rows, title="bench ncu")
    info("wrote " + ", ".join(str(p) for p in paths))
