"""CLI: build (plan, preflight, execute, summarise) and clean."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..console import emit_json, info, one_line, say, table
from .common import LibraryChecked, count_range, dry_run_option, json_option, workdir_option


def _check_tree_define(spec: str) -> None:
    from ..builds.pipeline import parse_tree_defines

    parse_tree_defines((spec,))


@click.command()
@workdir_option
@click.option("--arch", default="9.0a", show_default=True,
              help="TORCH_CUDA_ARCH_LIST syntax, e.g. 9.0a or '8.0;9.0a'.")
@click.option("--mode", type=click.Choice(["auto", "full", "kernels-only", "overlay"]),
              default="auto", show_default=True,
              help="overlay (recommended for serving): the released vllm==0.10.2 wheel per "
                   "tree plus the tree's compiled attention kernels, routed in by a vLLM plugin "
                   "(minutes). full: pip-build all of vLLM per tree (hours, needs CUDA >= 12.8 "
                   "and the network or --deps-dir). kernels-only: compile each tree's real paged "
                   "attention into a small extension for kvprefetch's own benchmarks (minutes, "
                   "no GPU needed). auto: full where a toolkit, GPU and network exist, else "
                   "kernels-only (`kvprefetch doctor` says which, and why).")
@click.option("--kernels-only", "kernels_only", is_flag=True, help="Same as --mode kernels-only.")
@click.option("--trees", default=None,
              help="Comma-separated trees (default: baseline, patched and every other "
                   "patched tree, e.g. paper).")
@click.option("--env-backend", type=click.Choice(["venv", "uv", "conda"]), default=None,
              help="Environment kind [default: uv for --mode overlay where uv is found (the "
                   "envs install one at a time and hard-link from one 9.3 GiB copy in uv's "
                   "cache), else venv].")
@click.option("--jobs", type=count_range(1), default=None,
              help="MAX_JOBS (default: sized from cores and memory).")
@click.option("--nvcc-threads", type=count_range(1), default=None)
@click.option("--head-sizes", default=None,
              help="Kernels-only: e.g. 128 or 64,128,256 (default: all 9).")
@click.option("--block-sizes", default=None, help="Kernels-only: subset of 8,16,32 (default: all).")
@click.option("--kv-dtypes", default=None,
              help="Kernels-only: subset of fp16,bf16,fp32,fp8,fp8_e5m2 (default: all).")
@click.option("--torch-from", default=None, metavar="PYTHON",
              help="Kernels-only: the interpreter whose torch the envs inherit (default: this "
                   "one). --smoke: the torch 2.8.0 interpreter vLLM's CMake configures against "
                   "(default: the baseline overlay env).")
@click.option("--no-editable", is_flag=True, help="Full mode: pip install . instead of -e .")
@click.option("--deps-dir", type=click.Path(path_type=Path), default=None,
              help="Full mode: local recursive clones cutlass/, flash-attention/, FlashMLA/.")
@click.option("--tree-define", "tree_defines", multiple=True, metavar="TREE:NAME=VALUE",
              type=LibraryChecked("define", _check_tree_define),
              help="Kernels-only: an extra -D for one tree's sources, e.g. "
                   "pro_off:KVPREFETCH_DEFAULT_MODE=0 (see csrc/kvprefetch/launch_policy.cuh). "
                   "Repeatable.")
@click.option("--cuda-home", default=None, metavar="DIR",
              help="Overlay and --smoke: the CUDA 12.x toolkit to compile with (default: "
                   "CUDA_HOME, nvcc on PATH, /usr/local/cuda-12*).")
@click.option("--allow-cuda-mismatch", is_flag=True,
              help="Overlay: compile with a toolkit whose major version differs from torch "
                   "2.8.0's CUDA 12.8 when no CUDA 12 toolkit exists (recorded and reported).")
@click.option("--smoke", is_flag=True,
              help="Full mode, on any machine: configure vLLM's real CMake project (with "
                   "--deps-dir, against --torch-from's torch 2.8.0) into "
                   "<workdir>/build/<tree>/full-smoke/ and build only the paged-attention "
                   "objects of _C, then check their SASS for UBLKPF. Links nothing.")
@click.option("--smoke-objects", default=None, metavar="v1,v2",
              help="--smoke: which of paged_attention_v1.cu / v2.cu to compile (default both).")
@click.option("--skip-doctor", is_flag=True, help="Do not run the preflight checks.")
@click.option("--force", is_flag=True, help="Rebuild even when the manifest matches.")
@click.option("--yes", "-y", is_flag=True,
              help="Do not ask before a build estimated at more than 10 minutes (it asks only "
                   "when stdin is a terminal; scripts and CI never wait).")
@dry_run_option
@json_option
def build(workdir: Path, arch: str, mode: str, kernels_only: bool, trees: str | None,
          env_backend: str | None, jobs: int | None, nvcc_threads: int | None,
          head_sizes: str | None, block_sizes: str | None, kv_dtypes: str | None,
          torch_from: str | None, no_editable: bool, deps_dir: Path | None,
          tree_defines: tuple[str, ...], cuda_home: str | None, allow_cuda_mismatch: bool,
          smoke: bool, smoke_objects: str | None, skip_doctor: bool, force: bool, yes: bool,
          dry_run: bool, as_json: bool) -> None:
    """Build the baseline and patched trees, each into its own environment."""
    from ..builds.options import BuildOptions
    from ..builds.pipeline import execute, prepare_build, raise_for_failures
    from ..builds.plan import render_plan

    opts = BuildOptions(
        workdir=workdir, arch=arch, mode="kernels-only" if kernels_only else mode,
        trees=tuple(t for t in (trees or "").split(",") if t), env_backend=env_backend,
        jobs=jobs, nvcc_threads=nvcc_threads, head_sizes=head_sizes, block_sizes=block_sizes,
        kv_dtypes=kv_dtypes, torch_from=torch_from, editable=not no_editable,
        deps_dir=deps_dir, tree_defines=tree_defines, cuda_home=cuda_home,
        allow_cuda_mismatch=allow_cuda_mismatch, skip_doctor=skip_doctor, dry_run=dry_run,
        smoke=smoke, smoke_objects=smoke_objects)
    prepared = prepare_build(opts)
    for notice in prepared.notices:
        info(f"notice: {notice}")
    plan = prepared.plan
    if dry_run:
        if as_json:
            emit_json(plan)
        else:
            say(render_plan(plan))
        return
    info(render_plan(plan))
    if not _confirmed(plan, force=force, yes=yes):
        return
    outcomes = execute(plan, prepared.inputs, force=force)
    if as_json:
        emit_json({"plan": plan, "outcomes": outcomes})
    else:
        table(["tree", "status", "seconds", "library", "log"],
              [[o.tree, o.status, o.seconds, o.so or "-", o.log_dir] for o in outcomes],
              title="kvprefetch build")
    raise_for_failures(outcomes)


def stdin_is_terminal() -> bool:
    """Whether someone can answer a question (a test fakes it: CliRunner's stdin never is)."""
    import sys

    return sys.stdin.isatty()


def _confirmed(plan: Any, *, force: bool, yes: bool) -> bool:
    """Say the build's estimate; where it is long and someone is at the terminal (and no
    --yes), ask before starting (builds/foresight.py). False: declined, nothing was built."""
    from dataclasses import replace

    from ..builds.foresight import describe_estimate, estimate_seconds, needs_confirmation
    from ..machine.toolchain import host_resources

    counted = replace(plan, up_to_date=()) if force else plan  # --force rebuilds them all
    if all(t.tree in counted.up_to_date for t in counted.trees) or plan.toolchain.get("smoke"):
        return True
    cores = host_resources()[0]
    seconds = estimate_seconds(counted, cores)
    info(describe_estimate(counted, seconds, cores))
    if not needs_confirmation(seconds, interactive=stdin_is_terminal(), yes=yes):
        return True
    if click.confirm("Start the build?", default=True, err=True):
        return True
    info("build not started: nothing was changed. Narrow it (e.g. --head-sizes 128 "
         "--block-sizes 16 --kv-dtypes fp16), or rerun with --yes to build without asking")
    return False


@click.command()
@workdir_option
@click.option("--what", type=click.Choice(["builds", "envs", "trees", "all"]), default="builds",
              show_default=True)
@click.option("--discard-edits", is_flag=True,
              help="Also remove trees edited since kvprefetch made them, and backup/ (where "
                   "fetch --force keeps edited trees). Without it they are kept and listed.")
@dry_run_option
@json_option
def clean(workdir: Path, what: str, discard_edits: bool, dry_run: bool, as_json: bool) -> None:
    """Remove only what kvprefetch created in --workdir (never through a symlink)."""
    from ..workspace.cleaning import clean as do_clean

    res = do_clean(workdir, what, dry_run=dry_run, discard_edits=discard_edits)
    if as_json:
        emit_json({"removed": res.removed, "kept": res.kept, "dry_run": dry_run})
    else:
        for r in res.removed:
            say(("would remove " if dry_run else "removed ") + one_line(r))
        for k in res.kept:
            say(f"kept {one_line(k.path)}: {k.reason}", err=True)
