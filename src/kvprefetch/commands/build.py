"""CLI: build (plan, preflight, execute, summarise) and clean."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from ..console import emit_json, info, table
from .common import dry_run_option, json_option, workdir_option


def _resolve_mode(mode: str, archs: tuple, workdir: Path) -> tuple[str, str | None]:
    """auto -> full where a CUDA >= 12.8 toolkit, a GPU and the network exist, else
    kernels-only. Returns (mode, why)."""
    if mode != "auto":
        return mode, None
    from ..doctor import run_doctor

    rep = run_doctor(archs, env=dict(os.environ), workdir=workdir, need_network=True, mode="full")
    failing = [c for c in rep.checks if c.status == "fail"]
    gpu = [c for c in rep.checks if c.name == "gpu" and c.status == "ok"]
    if not failing and gpu:
        return "full", None
    why = "; ".join(f"{c.name}: {c.detail}" for c in failing) or "no GPU found"
    return "kernels-only", why


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
                   "kernels-only.")
@click.option("--kernels-only", "kernels_only", is_flag=True, help="Same as --mode kernels-only.")
@click.option("--trees", default=None, help="Comma-separated trees (default: baseline,patched[,seed]).")
@click.option("--env-backend", type=click.Choice(["venv", "uv", "conda"]), default=None,
              help="Environment kind [default: uv for --mode overlay where uv is found (it "
                   "hard-links the second env's 9.7 GB of wheels from its cache), else venv].")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="MAX_JOBS (default: sized from cores and memory).")
@click.option("--nvcc-threads", type=click.IntRange(min=1), default=None)
@click.option("--head-sizes", default=None, help="Kernels-only: e.g. 128 or 64,128,256 (default: all 9).")
@click.option("--block-sizes", default=None, help="Kernels-only: subset of 8,16,32 (default: all).")
@click.option("--kv-dtypes", default=None,
              help="Kernels-only: subset of fp16,bf16,fp32,fp8,fp8_e5m2 (default: all).")
@click.option("--torch-from", default=None, metavar="PYTHON",
              help="Kernels-only: the interpreter whose torch the envs inherit (default: this one).")
@click.option("--no-editable", is_flag=True, help="Full mode: pip install . instead of -e .")
@click.option("--deps-dir", type=click.Path(path_type=Path), default=None,
              help="Full mode: local recursive clones cutlass/, flash-attention/, FlashMLA/.")
@click.option("--tree-define", "tree_defines", multiple=True, metavar="TREE:NAME=VALUE",
              help="Kernels-only: an extra -D for one tree's sources, e.g. "
                   "pro_off:KVPREFETCH_DEFAULT_MODE=0 (see csrc/kvprefetch/launch_policy.cuh). Repeatable.")
@click.option("--cuda-home", default=None, metavar="DIR",
              help="Overlay: the CUDA 12.x toolkit to compile with (default: CUDA_HOME, nvcc "
                   "on PATH, /usr/local/cuda-12*).")
@click.option("--allow-cuda-mismatch", is_flag=True,
              help="Overlay: compile with a toolkit whose major version differs from torch "
                   "2.8.0's CUDA 12.8 when no CUDA 12 toolkit exists (recorded and reported).")
@click.option("--skip-doctor", is_flag=True, help="Do not run the preflight checks.")
@click.option("--force", is_flag=True, help="Rebuild even when the manifest matches.")
@dry_run_option
@json_option
def build(workdir: Path, arch: str, mode: str, kernels_only: bool, trees: str | None,
          env_backend: str | None, jobs: int | None, nvcc_threads: int | None, head_sizes: str | None,
          block_sizes: str | None, kv_dtypes: str | None, torch_from: str | None,
          no_editable: bool, deps_dir: Path | None, tree_defines: tuple[str, ...],
          cuda_home: str | None, allow_cuda_mismatch: bool, skip_doctor: bool, force: bool,
          dry_run: bool, as_json: bool) -> None:
    """Build the baseline and patched trees, each into its own environment."""
    from ..builder import execute
    from ..buildplan import default_trees, make_plan, render_plan
    from ..envs import refuse_precompiled
    from ..errors import BuildError
    from ..selection import parse_selection
    from ..toolchain import cuda_home as find_cuda_home
    from ..toolchain import (
        default_jobs,
        find_nvcc,
        host_resources,
        nvcc_version,
        parse_arch_list,
    )
    from ..workdir import Workdir

    refuse_precompiled(os.environ)
    per_tree_defines: dict[str, tuple[str, ...]] = {}
    for td in tree_defines:
        tree_name, sep, define = td.partition(":")
        if not sep or not define or "=" not in define and not define.isidentifier():
            from ..errors import ConfigError
            raise ConfigError(f"--tree-define {td!r} is not TREE:NAME=VALUE",
                              "e.g. --tree-define pro_off:KVPREFETCH_DEFAULT_MODE=0")
        per_tree_defines[tree_name] = per_tree_defines.get(tree_name, ()) + (define,)
    archs = parse_arch_list(arch)
    sel = parse_selection(head_sizes, block_sizes, kv_dtypes)
    mode = "kernels-only" if kernels_only else mode
    mode, why = _resolve_mode(mode, archs, workdir)
    if why:
        info(f"notice: building kernels-only ({why})")
    wd = Workdir(workdir.resolve())
    from ..workdir import check_tree_name

    names = tuple(check_tree_name(t, "--trees") for t in trees.split(",") if t) if trees \
        else default_trees(wd)
    if not dry_run:
        # an apply killed half-way is rolled back (or completed) before the plan reads the tree
        from ..locks import locked
        from ..treetxn import recover

        for n in names:
            if wd.tree(n).is_dir():
                with locked(wd.tree_lock(n), f"the tree {n}"):
                    done = recover(wd, n)
                if done:
                    info(f"notice: {done}")
    from ..buildplan import tree_variant

    for n in names:  # a missing, unpatched or corrupt tree fails here, before torch is probed
        tree_variant(wd, n)
    cores, mem = host_resources()
    dj, dt = default_jobs(cores, mem)
    jobs = jobs or dj
    nvcc_threads = nvcc_threads or dt
    nvcc = find_nvcc(dict(os.environ))
    nv = nvcc_version(nvcc) if nvcc else None
    home = find_cuda_home(dict(os.environ))
    if not skip_doctor:
        from ..doctor import run_doctor

        rep = run_doctor(archs, env=dict(os.environ), workdir=workdir,
                         need_network=(mode == "full" and deps_dir is None),
                         mode=mode,  # type: ignore[arg-type]
                         cuda_home_opt=cuda_home, allow_cuda_mismatch=allow_cuda_mismatch)
        if not dry_run:
            rep.raise_if_failed()
    tinfo = None
    if mode == "kernels-only" and nvcc is not None:
        from ..kernels_build import probe_torch

        tinfo = probe_torch(torch_from or sys.executable, dict(os.environ))
    # Kernels-only: trees build side by side, but never more compile jobs in total than MAX_JOBS
    # (each nvcc of a full launcher source needs several GB).
    parallel = max(1, min(len(names), jobs)) if mode in ("kernels-only", "overlay") else 1
    per_tree = max(1, jobs // parallel)
    overlay = None
    if env_backend is None:
        from ..overlay.build import find_uv

        env_backend = "uv" if mode == "overlay" and find_uv() else "venv"
    if mode == "overlay":
        from ..overlay.build import OverlayOptions, find_uv

        overlay = OverlayOptions(cuda_home=cuda_home, allow_cuda_mismatch=allow_cuda_mismatch,
                                 uv=find_uv() if env_backend == "uv" else None,
                                 index_url=os.environ.get("PIP_INDEX_URL") or None)
    ccache = None
    if mode == "full":
        from ..runner import which
        ccache = which("ccache") or which("sccache")
    plan = make_plan(workdir=workdir, mode=mode, archs=archs, trees=names, env_backend=env_backend,
                     jobs=per_tree, nvcc_threads=nvcc_threads, selection=sel, torch_from=torch_from,
                     nvcc=str(nvcc) if nvcc else None, nvcc_version=nv,
                     cuda_home=str(home) if home else None, torch_info=tinfo,
                     editable=not no_editable, deps_dir=deps_dir, ccache=ccache,
                     tree_defines=per_tree_defines, parallel_trees=parallel, overlay=overlay)
    if dry_run:
        if as_json:
            emit_json(plan)
        else:
            click.echo(render_plan(plan))
        return
    info(render_plan(plan))
    outcomes = execute(plan, torch_from=torch_from, force=force, overlay=overlay)
    if as_json:
        emit_json({"plan": plan, "outcomes": outcomes})
    else:
        table(["tree", "status", "seconds", "library", "log"],
              [[o.tree, o.status, o.seconds, o.so or "-", o.log_dir] for o in outcomes],
              title="kvprefetch build")
    failed = [o for o in outcomes if o.status == "failed"]
    if failed and all(o.error_kind == "LockError" for o in failed):
        from ..errors import LockError
        raise LockError("\n".join(f"[{o.tree}] {(o.error or '').split(chr(10) + 'To fix:')[0]}"
                                  for o in failed),
                        "wait for the other build to finish; the lock is released when it exits")
    if failed:
        raise BuildError("build failed for " + ", ".join(o.tree for o in failed) + ":\n"
                         + "\n".join(f"[{o.tree}] {o.error}" for o in failed),
                         "fix the cause above and rerun the same command: finished work is kept")


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
    from ..cleaning import clean as do_clean

    res = do_clean(workdir, what, dry_run=dry_run, discard_edits=discard_edits)
    if as_json:
        emit_json({"removed": res.removed, "kept": res.kept, "dry_run": dry_run})
    else:
        for r in res.removed:
            click.echo(("would remove " if dry_run else "removed ") + r)
        for k in res.kept:
            click.echo(f"kept {k.path}: {k.reason}", err=True)
