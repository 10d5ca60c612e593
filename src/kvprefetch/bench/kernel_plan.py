"""``bench kernel``'s options as one frozen ``KernelBenchOptions``, and the plan made of them.

``plan_kernel_bench`` validates the options and resolves them, with the kernels-only builds,
into a frozen ``KernelBenchPlan``: the matrix's shapes or a sample's steps (``--sample N``,
issue 29, drawn within what every build instantiates), one ``KernelBenchConfig`` per mode and
timing, the builds in order, the output files. ``--dry-run`` prints that plan;
``run_kernel_plan`` executes it and ``check_kernel_run`` refuses a run whose results cannot be
trusted. Bad options and combinations are ``ConfigError``s (``OptionError`` where the command
line's usage error is the right answer), impossible runs ``BenchError``s.

The click layer (cli/bench/kernel.py) parses the command line into the options, calls these and
renders; the defaults live here and it shows them. Nothing here imports torch at import time.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BenchError, ConfigError
from ..kernels.ops import BuiltOps, find_builds, load_build
from .kernel import KernelBenchConfig, kernel_configs
from .matrix import BenchMatrix, BenchShape, build_matrix
from .plan import (
    BenchRun,
    Bound,
    check_bounds,
    output_dir,
    output_paths,
    parse_formats,
    require_baseline_first,
    require_builds,
)
from .sample import Instantiations, SampleSpec, draw_sample, parse_bytes
from .schema import KernelLike
from .vllm_call import TIMINGS, VllmCall

# The options that choose a matrix's shapes (field -> flag); a sample draws its own.
MATRIX_OPTIONS = {"preset": "--preset", "matrix": "--matrix", "batch": "--batch",
                  "context": "--context", "block_size": "--block-size", "dtype": "--dtype",
                  "kv_cache_dtype": "--kv-cache-dtype", "force_kernel": "--force-kernel"}
DEFAULT_MATRIX = "default"


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """How ``bench kernel`` times each step (``timings``: graph, eager or both) and the call that
    makes the step a launch (``call``, bench/vllm_call.py; issue 40)."""

    timings: tuple[str, ...] = ("graph",)
    call: VllmCall = field(default_factory=VllmCall)

    def to_dict(self) -> dict[str, Any]:
        return {"timings": list(self.timings), "call": self.call.to_dict()}


@dataclass(frozen=True, kw_only=True)
class SampleOptions:
    """``--sample N`` and the options that narrow it, as given: ``n`` None is a matrix run, and
    then none of the others may be set. ``head_sizes``, ``block_sizes`` and ``caches`` are
    comma-separated lists ("" for all the builds have); ``max_kv`` a size such as ``4g``."""

    n: int | None = None
    seed: int | None = None
    max_kv: str = "4g"
    head_sizes: str = ""
    block_sizes: str = ""
    caches: str = ""


@dataclass(frozen=True, kw_only=True)
class KernelBenchOptions:
    """Everything ``bench kernel`` is asked, before anything is checked or resolved.

    The matrix fields keep the command line's strings (``batch=("1,8",)``); empty (or None) is
    "not given": the named matrix's axes and the defaults apply, and a sample may be drawn.
    ``modes`` empty is cold. ``out`` None is ``<workdir>/bench``."""

    workdir: Path
    trees: tuple[str, ...] = ()
    preset: tuple[str, ...] = ()
    matrix: str | None = None
    batch: tuple[str, ...] = ()
    context: tuple[str, ...] = ()
    block_size: tuple[str, ...] = ()
    dtype: tuple[str, ...] = ()
    kv_cache_dtype: tuple[str, ...] = ()
    force_kernel: str | None = None
    modes: tuple[str, ...] = ()
    rounds: int = 21
    sample_ms: float = 3.0
    l2_factor: float = 4.0
    pool_factor: float = 1.0
    alias_l2_fraction: float = 0.25
    seed: int = 0
    max_layers: int = 2048
    time_limit: float = 0.0
    sample: SampleOptions = field(default_factory=SampleOptions)
    launch: LaunchOptions = field(default_factory=LaunchOptions)
    out: Path | None = None
    name: str = "kernel"
    formats: str = "json,md,png"

    def matrix_options_given(self) -> list[str]:
        """The flags of the matrix options that are set, in ``MATRIX_OPTIONS``' order."""
        return [flag for attr, flag in MATRIX_OPTIONS.items()
                if getattr(self, attr) not in (None, ())]


# The ranges of bench kernel's numeric options (issue 41, fourth pass: a dry run accepted NaN
# and negative values, and --pool-factor 0; a real run failed on them in the middle).
# --sample-ms: how long one timed sample lasts at least (replays are batched to fill it, timed
# by CUDA events). Zero, negative or NaN milliseconds mean nothing; a minute per sample times
# the rounds and the shapes is already days, so longer is a typo.
SAMPLE_MS = Bound("--sample-ms", 0.0, 60_000.0, low_open=True)
# --l2-factor: cold mode rotates enough layers that the bytes read between two visits of a
# layer are this many times the L2. Below 1 the working set stays in the L2 (not cold at all;
# layers_for_cold refuses it, but only on the GPU); past 1000 (50 GB over an H200's 50 MiB) no
# more of the cache is left to evict, and --max-layers caps the rotation long before.
L2_FACTOR = Bound("--l2-factor", 1.0, 1000.0)
# --pool-factor: the KV pool's size over the blocks the batch needs (tables are drawn from it).
# A factor <= 0 cannot size a pool, and below 1 the pool is silently the blocks needed
# (pool_blocks); 1000 times the blocks needed exceeds any device's memory at every shape.
POOL_FACTOR = Bound("--pool-factor", 1.0, 1000.0)
# --time-limit: seconds after which no shape is started; 0 is no limit. Negative or NaN seconds
# mean nothing; 30 days is past any job's wall time (0 already says "no limit").
TIME_LIMIT = Bound("--time-limit", 0.0, 30 * 86400.0)


def check_kernel_options(o: KernelBenchOptions) -> None:
    """OptionError for a numeric option out of its range (the command line refuses the same;
    --alias-l2-fraction and --rounds are KernelBenchConfig's own BenchErrors)."""
    check_bounds([(SAMPLE_MS, o.sample_ms), (L2_FACTOR, o.l2_factor),
                  (POOL_FACTOR, o.pool_factor), (TIME_LIMIT, o.time_limit)])


@dataclass(frozen=True, kw_only=True)
class KernelBenchPlan:
    """What one ``bench kernel`` run will do. ``matrix`` is recorded even for a sampled run
    (``sample`` set), whose ``shapes`` are the drawn steps instead of the matrix's."""

    options: KernelBenchOptions
    builds: tuple[BuiltOps, ...]
    matrix: BenchMatrix
    sample: SampleSpec | None
    shapes: tuple[BenchShape, ...]
    configs: tuple[KernelBenchConfig, ...]
    out_dir: Path
    formats: tuple[str, ...]

    @property
    def outputs(self) -> list[str]:
        return output_paths(self.out_dir, self.options.name, self.formats)

    @property
    def runs(self) -> int:
        """Shapes times configs: what the progress counts (``shapes`` in the JSON)."""
        return len(self.shapes) * len(self.configs)

    def to_dict(self) -> dict[str, Any]:
        """The plan as ``--dry-run --json`` prints it."""
        return {"matrix": self.matrix.to_dict() if self.sample is None else None,
                "sample": self.sample.to_dict() if self.sample is not None else None,
                "modes": list(dict.fromkeys(c.mode for c in self.configs)),
                "timings": list(dict.fromkeys(c.timing for c in self.configs)),
                "call": self.options.launch.call.to_dict(),
                "rounds": self.options.rounds, "shapes": self.runs,
                "variants": [b.to_dict() for b in self.builds],
                "outputs": self.outputs,
                "shape_list": [s.to_dict() for s in self.shapes]}


def parse_timings(text: str) -> tuple[str, ...]:
    """``graph,eager`` -> ``("graph", "eager")``, order kept, duplicates dropped."""
    out = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [t for t in out if t not in TIMINGS]
    if bad or not out:
        raise ConfigError(f"--timing {text!r}: unknown {', '.join(bad) or 'empty'}",
                          "pass --timing graph, --timing eager or --timing graph,eager")
    return out


def _ints(text: str, option: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.replace(" ", "").split(",") if t)
    except ValueError:
        raise ConfigError(f"{option} {text!r} is not a comma-separated list of integers",
                          f"write it like {option} 64,128") from None


def sample_conflicts(given: Sequence[str]) -> None:
    """Refuse matrix options (``given``: their flags) next to ``--sample``."""
    if given:
        raise ConfigError(f"--sample draws its own shapes, so {', '.join(given)} cannot be "
                          "given with it",
                          "drop them, or narrow the sample with --sample-head-sizes, "
                          "--sample-block-sizes and --sample-caches")


def resolve_sample(sample: SampleOptions, builds: Sequence[BuiltOps],
                   given: Sequence[str] = ()) -> SampleSpec | None:
    """The ``SampleSpec`` the options ask for (None without ``--sample``), within what every one
    of ``builds`` instantiates (the full distribution when there are none, e.g. a dry run on a
    machine without builds). ``given``: the flags of the matrix options that are set."""
    if sample.n is None:
        narrowing = [o for o, v in (("--sample-seed", sample.seed),
                                    ("--sample-head-sizes", sample.head_sizes),
                                    ("--sample-block-sizes", sample.block_sizes),
                                    ("--sample-caches", sample.caches)) if v not in (None, "")]
        if narrowing:
            raise ConfigError(f"{', '.join(narrowing)} only apply to a sampled run",
                              "add --sample N (e.g. --sample 200)")
        return None
    sample_conflicts(given)
    inst = Instantiations.common_to(builds) if builds else Instantiations.full()
    inst = inst.narrowed(_ints(sample.head_sizes, "--sample-head-sizes"),
                         _ints(sample.block_sizes, "--sample-block-sizes"),
                         tuple(c.strip() for c in sample.caches.split(",") if c.strip()))
    return SampleSpec(n=sample.n, seed=0 if sample.seed is None else sample.seed,
                      instantiations=inst,
                      max_kv_bytes=parse_bytes(sample.max_kv, "--sample-max-kv"))


def check_sample_call(spec: SampleSpec | None, launch: LaunchOptions) -> None:
    """A sample draws max_model_len per step; a fixed one is refused beside it."""
    if spec is not None and launch.call.max_model_len is not None:
        raise ConfigError("--sample draws max_model_len per step (2k-128k), so --max-model-len "
                          "cannot be given with it",
                          "drop --max-model-len, or time a matrix with it")


def plan_kernel_bench(options: KernelBenchOptions,
                      builds: Sequence[BuiltOps] | None = None) -> KernelBenchPlan:
    """Check ``options`` and resolve them into the plan. ``builds``: the kernels-only builds to
    time, baseline first [default: those ``options.trees`` names under ``options.workdir``,
    every one found when none is named]. A plan may have no builds (a dry run on a machine
    without them); ``run_kernel_plan`` refuses it."""
    o = options
    check_kernel_options(o)
    found = tuple(find_builds(o.workdir, o.trees or None) if builds is None else builds)
    spec = resolve_sample(o.sample, found, o.matrix_options_given())
    check_sample_call(spec, o.launch)
    if spec is None:
        matrix = build_matrix(o.preset, o.batch, o.context, o.block_size, o.dtype,
                              o.kv_cache_dtype, o.force_kernel, matrix=o.matrix or DEFAULT_MATRIX)
        shapes = matrix.shapes()
    else:
        matrix = build_matrix()  # recorded only; the sample's steps replace its shapes
        shapes = draw_sample(spec)
    configs = kernel_configs(o.modes or ("cold",), o.launch.timings, o.launch.call,
                             rounds=o.rounds, target_sample_ms=o.sample_ms,
                             l2_factor=o.l2_factor, pool_factor=o.pool_factor,
                             alias_l2_fraction=o.alias_l2_fraction, seed=o.seed,
                             max_layers=o.max_layers)
    return KernelBenchPlan(options=o, builds=found, matrix=matrix, sample=spec,
                           shapes=tuple(shapes), configs=tuple(configs),
                           out_dir=output_dir(o.out, o.workdir), formats=parse_formats(o.formats))


def run_kernel_plan(plan: KernelBenchPlan, *, progress: Callable[[str], None] | None = None,
                    command: Sequence[str] | None = None) -> BenchRun[KernelLike]:
    """Time the plan on the GPU and write its outputs. Refuses, before loading anything, a
    python without torch, a plan without builds and one whose first build is not the stock
    baseline. ``command``: what the document records as the command line [default: sys.argv]."""
    from .device import require_torch
    from .kernel import run_kernel_bench
    from .report import write_outputs

    require_torch("kernel")
    trees = [b.tree for b in plan.builds]
    require_builds(trees, plan.options.workdir)
    require_baseline_first(trees)
    ops = [load_build(b) for b in plan.builds]
    sampled = plan.sample is not None
    doc = run_kernel_bench(ops, plan.matrix, plan.configs, progress=progress,
                           command=sys.argv if command is None else command,
                           shapes=plan.shapes if sampled else None,
                           sample=plan.sample.to_dict() if plan.sample is not None else None,
                           time_limit_s=plan.options.time_limit)
    paths = write_outputs(doc, plan.out_dir, plan.options.name, plan.formats)
    return BenchRun(doc=doc, paths=tuple(paths))


def check_kernel_run(run: BenchRun[KernelLike], out_dir: Path) -> None:
    """Refuse a run whose outputs differ from stock's, or that a dead CUDA context cut short
    (after its results are shown and written: they are the evidence)."""
    doc = run.doc
    if not all(r.get("bitwise_equal") for r in doc["results"] if r["status"] == "measured"):
        raise BenchError("some variant's outputs differ from the baseline's (see the table)",
                         "a prefetch must not change results; run `kvprefetch verify-kernel`")
    if doc["meta"]["aborted"]:
        where = run.paths[0] if run.paths else out_dir
        raise BenchError(f"the run stopped early, the CUDA context died at {doc['meta']['aborted']}"
                         f" (partial results in {where})",
                         "look at that shape alone (`--batch B --context C`) with "
                         "compute-sanitizer; the shapes after it were not run")
