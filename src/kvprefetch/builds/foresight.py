"""What a planned build will cost, said before it starts: ``estimate_seconds`` of a plan on
this machine, the line ``describe_estimate`` prints, and ``needs_confirmation`` (a long build
asks first, only where someone can answer). The plan-free half (what an arch lacks, the cost
per instantiation) is ``machine.foresight``, below doctor, which says it too.

Pure: the core count and the terminal are parameters."""

from __future__ import annotations

from ..machine.foresight import CONFIRM_OVER_S, SOURCES_PER_TREE, compile_seconds
from .modes import mode_of
from .plan import BuildPlan


def estimate_seconds(plan: BuildPlan, cores: int) -> float | None:
    """The compile time of the trees ``plan`` builds (not the up-to-date ones) on ``cores``
    cores; None where the kit has no measure (a full vLLM build: hours)."""
    todo = [t for t in plan.trees if t.tree not in plan.up_to_date]
    if not todo:
        return 0.0
    if not mode_of(plan).compiles_kernels:
        return None
    return compile_seconds(len(todo), int(plan.selection.get("kernels_per_source") or 0),
                           len(plan.gencode), min(cores, plan.parallel_trees * plan.jobs))


def describe_estimate(plan: BuildPlan, seconds: float | None, cores: int) -> str:
    """One line: how long the build is expected to take, and on what basis."""
    todo = len([t for t in plan.trees if t.tree not in plan.up_to_date])
    if seconds is None:
        return (f"estimate: a full vLLM build of {todo} tree(s) takes hours "
                "(`--mode kernels-only` compiles only the attention kernels)")
    from ..machine.progress import clock

    kernels = plan.selection.get("kernels_per_source")
    return (f"estimate: about {clock(seconds)} to compile {todo} tree(s) x {SOURCES_PER_TREE} "
            f"sources x {kernels} instantiations for {len(plan.gencode)} arch(s) on {cores} "
            "core(s) (--head-sizes, --block-sizes and --kv-dtypes narrow it)")


def needs_confirmation(seconds: float | None, *, interactive: bool, yes: bool) -> bool:
    """Whether to ask before building: a long build (or one of unknown, hours-long length),
    someone at a terminal to answer, and no --yes. Unattended runs (scripts/main.sh, CI)
    proceed, having printed the estimate."""
    long = seconds is None or seconds > CONFIRM_OVER_S
    return long and interactive and not yes
