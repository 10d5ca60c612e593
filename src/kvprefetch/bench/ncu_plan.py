"""``bench ncu``'s options as one frozen ``NcuBenchOptions``, and the plan made of them.

``plan_ncu_bench`` validates the options and resolves them, with the kernels-only builds, into
a frozen ``NcuBenchPlan``: the shapes (``BATCHxCONTEXT`` specs of one preset, block size and
dtype), the ncu recipe (``NcuOptions``: launches skipped and profiled, the executable), the
builds in order and the output files. ``--dry-run`` prints the plan's ncu command lines;
``run_ncu_plan`` executes it (bench/ncu.py). The click layer (cli/bench/ncu.py) parses the
command line into the options, calls these and renders; the defaults live here and it shows
them. Nothing here imports torch at import time.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BenchError
from ..kernels.ops import BuiltOps, find_builds
from .matrix import BenchShape, shapes_from_specs
from .ncu import NcuOptions, launches_needed, ncu_command, target_command
from .plan import (
    BenchRun,
    Bound,
    check_bounds,
    output_dir,
    parse_formats,
    require_baseline_first,
)
from .schema import NcuDocument

DEFAULT_SHAPES = ("1x4k", "8x16k", "64x1k")


@dataclass(frozen=True, kw_only=True)
class NcuBenchOptions:
    """Everything ``bench ncu`` is asked, before anything is checked or resolved.

    ``shapes`` keeps the command line's ``BATCHxCONTEXT`` strings; empty is ``DEFAULT_SHAPES``.
    ``trees`` empty is every kernels-only build found. ``ncu`` is the Nsight Compute executable.
    ``out`` None is ``<workdir>/bench``."""

    workdir: Path
    trees: tuple[str, ...] = ()
    shapes: tuple[str, ...] = ()
    preset: str = "llama-3.1-8b"
    block_size: int = 16
    dtype: str = "float16"
    kv_cache_dtype: str = "auto"
    force_kernel: str | None = None
    launch_skip: int = 20
    launch_count: int = 10
    ncu: str = "ncu"
    out: Path | None = None
    name: str = "ncu"
    formats: str = "json,md,png"


# The ranges of bench ncu's launch counts (issue 41, fourth pass: negative counts passed the
# plan and reached ncu's command line). --launch-skip: kernel launches ncu lets pass before it
# profiles (0: profile from the first); 100000 is far past any warm-up. --launch-count: the
# launches profiled, each replayed for every metric pass (application replay), so at least 1
# and at most 1000 (already hours under ncu).
NCU_LAUNCH_SKIP = Bound("--launch-skip", 0, 100_000, integer=True)
NCU_LAUNCH_COUNT = Bound("--launch-count", 1, 1000, integer=True)


@dataclass(frozen=True, kw_only=True)
class NcuBenchPlan:
    """What one ``bench ncu`` run will do: every shape profiled for every build, baseline
    first, each under ``ncu`` with the ``recipe``."""

    options: NcuBenchOptions
    shapes: tuple[BenchShape, ...]
    recipe: NcuOptions
    builds: tuple[BuiltOps, ...]
    out_dir: Path
    formats: tuple[str, ...]

    def commands(self, python: str | None = None) -> list[list[str]]:
        """Each (shape, build)'s ncu command line, shape by shape, as a run executes them."""
        py = python or sys.executable
        return [ncu_command(target_command(py, b.so_path, b.namespace, s.to_dict(),
                                           launches_needed(s.kernel, self.recipe)),
                            self.out_dir / f"ncu-{i}-{b.tree}.csv", self.recipe)
                for i, s in enumerate(self.shapes, 1) for b in self.builds]

    def to_dict(self) -> dict[str, Any]:
        """The plan as ``--dry-run --json`` prints it."""
        return {"shapes": [s.to_dict() for s in self.shapes],
                "variants": [b.to_dict() for b in self.builds], "commands": self.commands()}


def plan_ncu_bench(options: NcuBenchOptions,
                   builds: Sequence[BuiltOps] | None = None) -> NcuBenchPlan:
    """Check ``options`` and resolve them into the plan: the shapes first (a bad spec, preset,
    block size or dtype is refused before anything else), then the formats, then the builds.
    ``builds``: the kernels-only builds to profile, baseline first [default: those
    ``options.trees`` names under ``options.workdir``, every one found when none is named]. A
    plan may have no builds (a dry run on a machine without them); ``run_ncu_plan`` refuses
    it."""
    o = options
    check_bounds([(NCU_LAUNCH_SKIP, o.launch_skip), (NCU_LAUNCH_COUNT, o.launch_count)])
    shapes = shapes_from_specs(o.shapes or DEFAULT_SHAPES, o.preset, o.block_size, o.dtype,
                               o.kv_cache_dtype, o.force_kernel)
    recipe = NcuOptions(launch_skip=o.launch_skip, launch_count=o.launch_count, ncu=o.ncu)
    formats = parse_formats(o.formats)
    found = tuple(find_builds(o.workdir, o.trees or None) if builds is None else builds)
    return NcuBenchPlan(options=o, shapes=tuple(shapes), recipe=recipe, builds=found,
                        out_dir=output_dir(o.out, o.workdir), formats=formats)


def run_ncu_plan(plan: NcuBenchPlan, *, progress: Callable[[str], None] | None = None,
                 command: Sequence[str] | None = None) -> BenchRun[NcuDocument]:
    """Profile the plan and write its outputs. Refuses, before running anything, a plan
    without the baseline and a variant and one whose first build is not the stock baseline.
    ``command``: what the document records as the command line [default: sys.argv]."""
    trees = [b.tree for b in plan.builds]
    if len(trees) < 2:
        raise BenchError(f"need the baseline and a variant, found {trees}",
                         "run `kvprefetch build --kernels-only` first")
    require_baseline_first(trees)
    from .ncu import run_ncu_bench
    from .report import write_outputs

    doc = run_ncu_bench(plan.builds, plan.shapes, plan.out_dir, plan.recipe, progress=progress,
                        command=sys.argv if command is None else command)
    paths = write_outputs(doc, plan.out_dir, plan.options.name, plan.formats)
    return BenchRun(doc=doc, paths=tuple(paths))
