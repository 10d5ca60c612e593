"""The ``build`` command as a pipeline: options -> plan -> execution -> outcomes, for every mode.

``BuildOptions`` holds the options as given; ``prepare_build`` resolves them against the
machine and the work directory (the mode ``auto`` picks, the trees, an interrupted apply
recovered, the mode's preflight, the jobs, what the mode probes) into a ``PreparedBuild``: the
frozen plan (``make_plan``), what the mode resolved (``ModeInputs``) and the notices to show.
``execute`` walks the plan, one ``sequence.build_tree`` per tree with the mode's steps. The
mode comes from the registry (``modes``); nothing here asks which mode it holds. The CLI only
parses, calls these, and renders."""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .. import __version__
from ..errors import BuildError, ConfigError, KvprefetchError, LockError
from ..kernels.selection import Selection
from ..machine.toolchain import CudaArch, format_arch_list, gencode_flags
from ..workspace.workdir import Workdir, check_tree_name
from .library import namespace_for
from .modes import mode_named, mode_of, smoke_mode_request
from .modes.base import BuildMode, TreeContext
from .options import BuildOptions, ModeInputs
from .plan import (
    BuildPlan,
    TreePlan,
    default_trees,
    env_set_common,
    kit_python,
    manifest_matches,
    source_hash,
    tree_variant,
)
from .sequence import TreeOutcome, build_tree

if TYPE_CHECKING:
    from ..doctor.report import DoctorReport


@dataclass(frozen=True)
class PreparedBuild:
    plan: BuildPlan
    inputs: ModeInputs                     # what the mode resolved; execute reads it again
    notices: tuple[str, ...]


_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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
        # NAME becomes nvcc's -DNAME[=VALUE]: a C macro name, an identifier of ASCII letters,
        # digits and _ not starting with a digit (an empty one, `patched:=1`, passed the plan
        # and failed only in nvcc; issue 41, fourth pass)
        if not sep or not _C_IDENTIFIER.fullmatch(define.partition("=")[0]):
            raise ConfigError(f"--tree-define {td!r} is not TREE:NAME=VALUE with NAME a C "
                              "macro name (letters, digits and _, not starting with a digit)",
                              "e.g. --tree-define pro_off:KVPREFETCH_DEFAULT_MODE=0")
        out[tree_name] = (*out.get(tree_name, ()), define)
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
    from ..kernels.selection import parse_selection
    from ..machine.envs import refuse_precompiled
    from ..machine.foresight import lacking
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
    choice = choose_mode(smoke_mode_request(opts.mode, opts.smoke), archs, env=environ,
                         workdir=opts.workdir, read_only=opts.dry_run)
    mode = mode_named(choice.mode, smoke=opts.smoke)
    if choice.fallback:
        notices.append(f"building {choice.mode} ({choice.reason})")
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
    if mode.says_what_archs_lack and any(n != "baseline" for n in names):
        missing = lacking(archs, nv)
        if missing:
            notices.append(missing)
    home = find_cuda_home(environ)
    env_backend = opts.env_backend or mode.default_env_backend()
    if not opts.skip_doctor:
        rep = mode.preflight(opts, archs, environ, env_backend=env_backend, envs=len(names))
        if not opts.dry_run:
            rep.raise_if_failed()
        notices += _preflight_refusal(rep)
    inputs = mode.resolve(opts, wd, environ, env_backend=env_backend, nvcc=nvcc)
    # Kernels-only and overlay: trees build side by side, but never more compile jobs in total
    # than MAX_JOBS (each nvcc of a full launcher source needs several GB).
    parallel = max(1, min(len(names), jobs)) if mode.compiles_kernels else 1
    per_tree = max(1, jobs // parallel)
    plan = make_plan(workdir=opts.workdir, mode=mode, archs=archs, trees=names,
                     env_backend=env_backend, jobs=per_tree, nvcc_threads=nvcc_threads,
                     selection=sel, nvcc=str(nvcc) if nvcc else None, nvcc_version=nv,
                     cuda_home=str(home) if home else None, inputs=inputs,
                     tree_defines=per_tree_defines, parallel_trees=parallel)
    return PreparedBuild(plan, inputs, tuple(notices))


def _preflight_refusal(rep: DoctorReport) -> list[str]:
    """A dry run's word on the preflight the real build stops at (cause and fix), shown with
    the plan: a dry run still plans (a plan is worth reading on a machine that cannot build
    it) and keeps its exit status, as ``bench e2e --dry-run``'s "would refuse" does.
    ``build --dry-run --mode overlay --cuda-home /dev/zero`` (or any path that is no CUDA
    toolkit) printed its plan, exit 0, without a word, while the same command without
    ``--dry-run`` stopped at once on the preflight (issue 41, the twenty-second hostile
    pass)."""
    try:
        rep.raise_if_failed()
    except ConfigError as exc:
        return [f"the build would refuse: {exc.cause}\nTo fix: {exc.fix}"]
    return []


def make_plan(*, workdir: Path, mode: BuildMode, archs: tuple[CudaArch, ...],
              trees: tuple[str, ...], env_backend: str, jobs: int, nvcc_threads: int,
              selection: Selection, nvcc: str | None,
              nvcc_version: tuple[int, int, int] | None, cuda_home: str | None,
              inputs: ModeInputs, tree_defines: dict[str, tuple[str, ...]] | None = None,
              parallel_trees: int = 1) -> BuildPlan:
    """Compute the plan. ``inputs`` holds what the mode probed (kernels-only: the torch the
    envs will use, so the compile commands in the plan are the exact ones that will run)."""
    wd = Workdir(workdir.resolve())
    arch_list = format_arch_list(archs)
    gencode = tuple(gencode_flags(archs, cuda_version=nvcc_version))
    toolchain = mode.plan_toolchain({
        "nvcc": nvcc, "nvcc_version": ".".join(map(str, nvcc_version)) if nvcc_version else None,
        "cuda_home": cuda_home, "kit": f"kvprefetch {__version__}", "kit_python": kit_python(),
    }, inputs)
    notes = mode.plan_notes(inputs)
    if any(a.suffix == "a" for a in archs):
        notes.append("vLLM compiles _C (and so paged_attention_v1/v2.cu) for plain sm_90 even "
                     "for 9.0a: the bulk L2 prefetch needs only sm_90")
    tree_plans = []
    for tree in trees:
        state, variant, patch = tree_variant(wd, tree)
        env_path = mode.env_path(wd, tree)
        tree_plans.append(mode.tree_plan(TreeContext(
            wd=wd, tree=tree, variant=variant, patch=patch, state=state,
            src_hash=source_hash(state), env_backend=env_backend, env_path=env_path,
            python=str(env_path / "bin" / "python"), namespace=namespace_for(tree),
            env_set=env_set_common(arch_list, jobs, nvcc_threads, cuda_home),
            arch_list=arch_list, gencode=gencode, selection=selection, jobs=jobs,
            defines=(tree_defines or {}).get(tree, ()), nvcc=nvcc, nvcc_version=nvcc_version,
            cuda_home=cuda_home, inputs=inputs)))
    fresh = tuple(t.tree for t in tree_plans if manifest_matches(t) is not None)
    return BuildPlan(mode.plan_mode, str(wd.root), arch_list, gencode, jobs, nvcc_threads,
                     selection.to_dict(), toolchain, tuple(tree_plans), tuple(notes),
                     parallel_trees, fresh)


def execute(plan: BuildPlan, inputs: ModeInputs, *, force: bool = False) -> list[TreeOutcome]:
    """Build every tree of the plan; failures are collected, not raised mid-way, so one tree's
    error never leaves the other half-built without a report."""
    mode = mode_of(plan)

    def one(tp: TreePlan) -> TreeOutcome:
        t0 = time.monotonic()
        try:
            return build_tree(tp, plan, inputs, force, mode.tree_steps)
        except KvprefetchError as exc:
            o = TreeOutcome(tp.tree, "failed", round(time.monotonic() - t0, 1), tp.log_dir)
            o.error, o.error_kind = exc.message, type(exc).__name__
            return o

    workers = plan.parallel_trees if mode.compiles_kernels else 1
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(one, plan.trees))


def raise_for_failures(outcomes: list[TreeOutcome]) -> None:
    """One error for every tree that failed (a LockError when only locks stood in the way)."""
    failed = [o for o in outcomes if o.status == "failed"]
    if failed and all(o.error_kind == "LockError" for o in failed):
        # each lock's own fix: one in a symlinked folder, or a FIFO in its place, is no other
        # build's to wait for (issue 41, the twelfth hostile pass: "wait for the other build
        # to finish" for a symlinked envs/)
        split = [(o.error or "").partition("\nTo fix: ") for o in failed]
        fixes = {fix for _, _, fix in split if fix}
        if len(fixes) == 1:
            raise LockError("\n".join(f"[{o.tree}] {cause}"
                                      for o, (cause, _, _) in zip(failed, split, strict=True)),
                            fixes.pop())
        raise LockError("\n".join(f"[{o.tree}] {o.error}" for o in failed),
                        "follow each tree's own fix above, then rerun")
    if failed:
        raise BuildError("build failed for " + ", ".join(o.tree for o in failed) + ":\n"
                         + "\n".join(f"[{o.tree}] {o.error}" for o in failed),
                         "fix the cause above and rerun the same command: finished work is kept")
