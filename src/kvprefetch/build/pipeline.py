"""The ``build`` command as a pipeline: options -> plan -> execution -> outcomes, for every mode.

``BuildOptions`` holds the options as given; ``prepare_build`` resolves them against the
machine and the work directory (the mode ``auto`` picks, the trees, an interrupted apply
recovered, the preflight, the jobs, the toolkit, torch) into a ``PreparedBuild``: the frozen
plan (``make_plan``), the overlay options and the notices to show. ``execute`` walks the plan,
one mode's tree builder per tree. This is the one module that knows every mode (kernels-only
and full in ``builder``/``plan``, overlay in ``overlay_mode``), so none of those
imports another's dispatcher. The CLI only parses, calls these, and renders."""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import BuildError, ConfigError, KvprefetchError, LockError
from ..kernels.selection import Selection
from ..machine.toolchain import CudaArch, format_arch_list, gencode_flags
from ..workspace.workdir import Workdir, check_tree_name
from .builder import TreeOutcome, build_full_tree, build_kernels_tree
from .kernels_only import namespace_for
from .overlay_mode import build_overlay_tree, overlay_tree_plan
from .plan import (
    MODES,
    BuildPlan,
    TreePlan,
    default_trees,
    env_set_common,
    full_tree_plan,
    kernels_tree_plan,
    kit_python,
    manifest_matches,
    source_hash,
    tree_variant,
)


@dataclass(frozen=True)
class BuildOptions:
    workdir: Path
    arch: str = "9.0a"
    mode: str = "auto"                     # auto | full | kernels-only | overlay
    trees: tuple[str, ...] = ()            # empty: default_trees
    env_backend: str | None = None         # None: uv for overlay where uv is found, else venv
    jobs: int | None = None                # None: sized from cores and memory
    nvcc_threads: int | None = None
    head_sizes: str | None = None
    block_sizes: str | None = None
    kv_dtypes: str | None = None
    torch_from: str | None = None
    editable: bool = True
    deps_dir: Path | None = None
    tree_defines: tuple[str, ...] = ()     # TREE:NAME=VALUE
    cuda_home: str | None = None
    allow_cuda_mismatch: bool = False
    skip_doctor: bool = False
    dry_run: bool = False
    smoke: bool = False                    # full mode: configure + the attention objects only
    smoke_objects: str | None = None       # "v1,v2" (default both)


@dataclass(frozen=True)
class PreparedBuild:
    plan: BuildPlan
    overlay: Any | None                    # overlay.install.OverlayOptions in overlay mode
    notices: tuple[str, ...]


def parse_tree_defines(specs: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """``TREE:NAME=VALUE`` (or ``TREE:NAME``) options -> the extra -D flags per tree."""
    out: dict[str, tuple[str, ...]] = {}
    for td in specs:
        if any(ord(c) < 0x20 or ord(c) == 0x7f for c in td):
            # a newline went raw into build.ninja (shlex.quote leaves it): a new ninja rule
            raise ConfigError(f"--tree-define {td!r} holds a control character (a newline, "
                              "tab, escape, ...)",
                              "write the define on one line, TREE:NAME=VALUE, e.g. "
                              "--tree-define pro_off:KVPREFETCH_DEFAULT_MODE=0")
        tree_name, sep, define = td.partition(":")
        if not sep or not define or "=" not in define and not define.isidentifier():
            raise ConfigError(f"--tree-define {td!r} is not TREE:NAME=VALUE",
                              "e.g. --tree-define pro_off:KVPREFETCH_DEFAULT_MODE=0")
        out[tree_name] = out.get(tree_name, ()) + (define,)
    return out


def _recover_trees(wd: Workdir, names: tuple[str, ...]) -> list[str]:
    """An apply killed half-way is rolled back (or completed) before the plan reads the tree."""
    from ..workspace.locks import locked
    from ..workspace.treetxn import recover

    notices = []
    for n in names:
        if wd.tree(n).is_dir():
            with locked(wd.tree_lock(n), f"the tree {n}"):
                done = recover(wd, n)
            if done:
                notices.append(done)
    return notices


def prepare_build(opts: BuildOptions) -> PreparedBuild:
    """Resolve ``opts`` on this machine into the plan (raises a KvprefetchError, before any
    build step, for a missing or edited tree, a bad option or, unless dry run or
    ``skip_doctor``, a failed preflight)."""
    from ..doctor.mode import choose_mode
    from ..doctor.preflight import run_doctor
    from ..kernels.selection import parse_selection
    from ..machine.envs import refuse_precompiled
    from ..machine.toolchain import cuda_home as find_cuda_home
    from ..machine.toolchain import (
        default_jobs,
        find_nvcc,
        host_resources,
        nvcc_version,
        parse_arch_list,
    )

    environ = dict(os.environ)
    refuse_precompiled(environ)
    per_tree_defines = parse_tree_defines(opts.tree_defines)
    archs = parse_arch_list(opts.arch)
    sel = parse_selection(opts.head_sizes, opts.block_sizes, opts.kv_dtypes)
    notices: list[str] = []
    if opts.smoke and opts.mode not in ("auto", "full"):
        raise ConfigError(f"--smoke is a full-mode check; --mode {opts.mode} has none",
                          "use `build --mode full --smoke` (or leave --mode out)")
    choice = choose_mode("full" if opts.smoke else opts.mode, archs, env=environ,
                         workdir=opts.workdir, read_only=opts.dry_run)
    mode = choice.mode
    if opts.mode == "auto" and mode != "full":
        notices.append(f"building {mode} ({choice.reason})")
    wd = Workdir(opts.workdir.resolve())
    names = (tuple(wd.resolve_tree(check_tree_name(t, "--trees")) for t in opts.trees)
             if opts.trees else default_trees(wd))
    if not opts.dry_run:
        notices += _recover_trees(wd, names)
    for n in names:  # a missing, unpatched or corrupt tree fails here, before torch is probed
        tree_variant(wd, n)
    cores, mem = host_resources()
    dj, dt = default_jobs(cores, mem)
    jobs = opts.jobs or dj
    nvcc_threads = opts.nvcc_threads or dt
    nvcc = find_nvcc(environ)
    nv = nvcc_version(nvcc) if nvcc else None
    if not opts.smoke and any(n != "baseline" for n in names):
        from .foresight import lacking

        missing = lacking(archs, nv)
        if missing:
            notices.append(missing)
    home = find_cuda_home(environ)
    env_backend = opts.env_backend
    if env_backend is None:
        from ..overlay.install import default_backend

        env_backend = default_backend() if mode == "overlay" else "venv"
    if not opts.skip_doctor:
        rep = run_doctor(archs, env=environ, workdir=opts.workdir,
                         need_network=(mode == "full" and opts.deps_dir is None), mode=mode,
                         cuda_home_opt=opts.cuda_home,
                         allow_cuda_mismatch=opts.allow_cuda_mismatch,
                         smoke=opts.smoke, torch_from=opts.torch_from,
                         env_backend=env_backend, envs=len(names), read_only=opts.dry_run)
        if not opts.dry_run:
            rep.raise_if_failed()
    smoke = None
    if opts.smoke:
        from .full_smoke import parse_objects, resolve_inputs

        smoke = resolve_inputs(wd, environ, torch_from=opts.torch_from,
                               cuda_home_opt=opts.cuda_home,
                               objects=parse_objects(opts.smoke_objects))
    tinfo = None
    if mode == "kernels-only" and nvcc is not None:
        from .kernels_only import probe_torch

        tinfo = probe_torch(opts.torch_from or sys.executable, environ)
    # Kernels-only: trees build side by side, but never more compile jobs in total than MAX_JOBS
    # (each nvcc of a full launcher source needs several GB).
    parallel = max(1, min(len(names), jobs)) if mode in ("kernels-only", "overlay") else 1
    per_tree = max(1, jobs // parallel)
    overlay = None
    if mode == "overlay":
        from ..overlay.install import OverlayOptions, find_uv

        overlay = OverlayOptions(cuda_home=opts.cuda_home,
                                 allow_cuda_mismatch=opts.allow_cuda_mismatch,
                                 uv=find_uv() if env_backend == "uv" else None,
                                 index_url=environ.get("PIP_INDEX_URL") or None)
    ccache = None
    if mode == "full":
        from ..runner import which

        ccache = which("ccache") or which("sccache")
    plan = make_plan(workdir=opts.workdir, mode=mode, archs=archs, trees=names,
                     env_backend=env_backend, jobs=per_tree, nvcc_threads=nvcc_threads,
                     selection=sel, torch_from=opts.torch_from,
                     nvcc=str(nvcc) if nvcc else None, nvcc_version=nv,
                     cuda_home=str(home) if home else None, torch_info=tinfo,
                     editable=opts.editable, deps_dir=opts.deps_dir, ccache=ccache,
                     tree_defines=per_tree_defines, parallel_trees=parallel, overlay=overlay,
                     smoke=smoke)
    return PreparedBuild(plan, overlay, tuple(notices))


def make_plan(*, workdir: Path, mode: str, archs: tuple[CudaArch, ...], trees: tuple[str, ...],
              env_backend: str, jobs: int, nvcc_threads: int, selection: Selection,
              torch_from: str | None, nvcc: str | None, nvcc_version: tuple[int, int, int] | None,
              cuda_home: str | None, torch_info: Any | None, editable: bool = True,
              deps_dir: Path | None = None, ccache: str | None = None,
              tree_defines: dict[str, tuple[str, ...]] | None = None,
              parallel_trees: int = 1, overlay: Any | None = None,
              smoke: Any | None = None) -> BuildPlan:
    """Compute the plan. ``torch_info`` (kernels-only) is the probe of the torch the envs will
    use, so the compile commands in the plan are the exact ones that will run."""
    if mode not in MODES:
        raise ConfigError(f"unknown build mode {mode!r}", f"use one of {MODES}")
    wd = Workdir(workdir.resolve())
    arch_list = format_arch_list(archs)
    gencode = tuple(gencode_flags(archs, cuda_version=nvcc_version))
    toolchain: dict[str, Any] = {
        "nvcc": nvcc, "nvcc_version": ".".join(map(str, nvcc_version)) if nvcc_version else None,
        "cuda_home": cuda_home, "kit": f"kvprefetch {__version__}", "kit_python": kit_python(),
    }
    notes: list[str] = []
    if smoke is not None:
        # the smoke compiles with its own toolkit (a view of it), not the machine's nvcc
        toolchain.update(nvcc=f"{smoke.cuda_home}/bin/nvcc", nvcc_version=smoke.nvcc_version,
                         cuda_home=smoke.cuda_home, smoke=smoke.to_dict())
        notes.append("smoke: vLLM's real CMake configure, then only the attention objects of "
                     "_C; nothing is linked or installed")
    if any(a.suffix == "a" for a in archs):
        notes.append("vLLM compiles _C (and so paged_attention_v1/v2.cu) for plain sm_90 even "
                     "for 9.0a: the bulk L2 prefetch needs only sm_90")
    tree_plans = []
    for tree in trees:
        state, variant, patch = tree_variant(wd, tree)
        src_hash = source_hash(state)
        # An overlay env (vLLM installed) lives beside the kernels-only one, not in its place:
        # the two kinds differ in options, and either mode may be built after the other.
        env_path = wd.overlay_env(tree) if mode == "overlay" else wd.env(tree)
        py = str(env_path / "bin" / "python")
        namespace = namespace_for(tree)
        env_set = env_set_common(arch_list, jobs, nvcc_threads, cuda_home)
        if mode == "overlay":
            tree_plans.append(overlay_tree_plan(wd, tree, variant, patch, state, src_hash,
                                                env_backend, env_path, py, namespace, env_set,
                                                gencode, selection, jobs, overlay,
                                                (tree_defines or {}).get(tree, ())))
        elif mode == "kernels-only":
            tree_plans.append(kernels_tree_plan(wd, tree, variant, patch, state, src_hash,
                                                 env_backend, env_path, py, namespace, env_set,
                                                 gencode, selection, torch_from, nvcc, nvcc_version,
                                                 cuda_home, torch_info, jobs,
                                                 (tree_defines or {}).get(tree, ())))
        elif smoke is not None:
            from .full_smoke import smoke_tree_plan

            tree_plans.append(smoke_tree_plan(wd, tree, variant, patch, src_hash, env_set,
                                              arch_list, deps_dir, smoke, jobs))
        else:
            tree_plans.append(full_tree_plan(wd, tree, variant, patch, src_hash, env_backend,
                                              env_path, py, namespace, env_set, arch_list,
                                              editable, deps_dir, ccache, nvcc_version))
    fresh = tuple(t.tree for t in tree_plans if manifest_matches(t) is not None)
    return BuildPlan(mode, str(wd.root), arch_list, gencode, jobs, nvcc_threads,
                     selection.to_dict(), toolchain, tuple(tree_plans), tuple(notes),
                     parallel_trees, fresh)


def execute(plan: BuildPlan, *, torch_from: str | None = None, force: bool = False,
            overlay: Any | None = None) -> list[TreeOutcome]:
    """Build every tree of the plan; failures are collected, not raised mid-way, so one tree's
    error never leaves the other half-built without a report."""
    def one(tp: TreePlan) -> TreeOutcome:
        t0 = time.monotonic()
        try:
            if plan.mode == "kernels-only":
                return build_kernels_tree(tp, plan, torch_from, force)
            if plan.mode == "overlay":
                return build_overlay_tree(tp, plan, force, overlay)
            if "smoke" in plan.toolchain:
                from .full_smoke import build_smoke_tree

                out: TreeOutcome = build_smoke_tree(tp, plan, force)
                return out
            return build_full_tree(tp, plan, force)
        except KvprefetchError as exc:
            o = TreeOutcome(tp.tree, "failed", round(time.monotonic() - t0, 1), tp.log_dir)
            o.error, o.error_kind = exc.message, type(exc).__name__
            return o

    workers = plan.parallel_trees if plan.mode in ("kernels-only", "overlay") else 1
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(one, plan.trees))


def raise_for_failures(outcomes: list[TreeOutcome]) -> None:
    """One error for every tree that failed (a LockError when only locks stood in the way)."""
    failed = [o for o in outcomes if o.status == "failed"]
    if failed and all(o.error_kind == "LockError" for o in failed):
        raise LockError("\n".join(f"[{o.tree}] {(o.error or '').split(chr(10) + 'To fix:')[0]}"
                                  for o in failed),
                        "wait for the other build to finish; the lock is released when it exits")
    if failed:
        raise BuildError("build failed for " + ", ".join(o.tree for o in failed) + ":\n"
                         + "\n".join(f"[{o.tree}] {o.error}" for o in failed),
                         "fix the cause above and rerun the same command: finished work is kept")
