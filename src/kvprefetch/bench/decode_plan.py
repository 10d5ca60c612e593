"""``bench decode``'s options as one frozen ``DecodeBenchOptions``, and the plan made of them.

``plan_decode_bench`` validates the options and resolves them, with the kernels-only builds,
into a frozen ``DecodeBenchPlan``: the model (a preset or a Hugging Face config.json), the
workloads (every batch x context point, and a serving trace with ``serve``), the run's
``DecodeBenchConfig`` and the output files. ``--dry-run`` prints that plan; ``run_decode_plan``
executes it (bench/decode.py) and ``check_decode_run`` refuses a run whose logits differ from
stock's. The click layer (cli/bench/decode.py) parses the command line into the options, calls
these and renders; the defaults live here. Nothing here imports torch at import time.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import BenchError, OptionError
from ..kernels.ops import BuiltOps, find_builds, load_build
from .decode import DecodeBenchConfig, Workload
from .decode_model import DecoderConfig, load_config
from .decode_model import preset as model_preset
from .decode_report import decode_summary
from .decode_serve import LengthDist
from .matrix import check_shape_count, parse_sizes
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
from .schema import DecodeDocument
from .vllm_call import MAX_SEQ_LEN_TO_CAPTURE

DEFAULT_BATCHES = (1, 8, 32, 128)
DEFAULT_CONTEXTS = (1024, 8192, 32768)

# The ranges of bench decode's counts (issue 41, the seventeenth hostile pass: a dry run took
# --requests 10**23, and a real run would have built that many requests). Repeats interleave
# the builds: 1000 rounds of every workload is days on the GPU (bench e2e's cap too). A serving
# trace of 1,000,000 requests at the default 128 output tokens is 128M decode steps, days again,
# and each request is an entry of the trace in memory. Steps per fixed point: a context never
# passes 1M tokens (bench e2e's token counts), and context + steps must fit --max-model-len.
DECODE_REPEATS = Bound("--repeats", 1, 1000, integer=True)
DECODE_REQUESTS = Bound("--requests", 1, 1_000_000, integer=True)
DECODE_STEPS = Bound("--steps", 1, 1 << 20, integer=True)


@dataclass(frozen=True, kw_only=True)
class DecodeBenchOptions:
    """Everything ``bench decode`` is asked, before anything is checked or resolved.

    ``config`` (a config.json) replaces ``preset``; ``dtype`` None is the preset's float16 or the
    config's torch_dtype; ``layers`` None is the model's. ``batch`` and ``context`` keep the
    command line's strings; empty is ``DEFAULT_BATCHES`` x ``DEFAULT_CONTEXTS``. ``serve`` (a
    length distribution) adds a serving trace of ``requests`` requests. ``out`` None is
    ``<workdir>/bench``."""

    workdir: Path
    trees: tuple[str, ...] = ()
    preset: str = "llama-3.1-8b"
    config: Path | None = None
    tp: int = 1
    layers: int | None = None
    dtype: str | None = None
    batch: tuple[str, ...] = ()
    context: tuple[str, ...] = ()
    steps: int = 32
    serve: str | None = None
    requests: int = 256
    prompt_len: int = 1024
    output_len: int = 128
    max_model_len: int = 36864
    repeats: int = 5
    eager: bool = False
    max_seq_len_to_capture: int = MAX_SEQ_LEN_TO_CAPTURE
    seed: int = 0
    out: Path | None = None
    name: str = "decode"
    formats: str = "json,md,png"


@dataclass(frozen=True, kw_only=True)
class DecodeBenchPlan:
    """What one ``bench decode`` run will do."""

    options: DecodeBenchOptions
    builds: tuple[BuiltOps, ...]
    model: DecoderConfig
    workloads: tuple[Workload, ...]
    config: DecodeBenchConfig
    out_dir: Path
    formats: tuple[str, ...]

    @property
    def outputs(self) -> list[str]:
        return output_paths(self.out_dir, self.options.name, self.formats)

    def to_dict(self) -> dict[str, Any]:
        """The plan as ``--dry-run --json`` prints it."""
        return {"model": self.model.to_dict(), "workloads": [w.to_dict() for w in self.workloads],
                "config": asdict(self.config), "trees": [b.tree for b in self.builds],
                "outputs": self.outputs}


def plan_decode_bench(options: DecodeBenchOptions,
                      builds: Sequence[BuiltOps] | None = None) -> DecodeBenchPlan:
    """Check ``options`` and resolve them into the plan. ``builds``: the kernels-only builds to
    run, baseline first [default: those ``options.trees`` names under ``options.workdir``, every
    one found when none is named]. A plan may have no builds (a dry run on a machine without
    them); ``run_decode_plan`` refuses it."""
    o = options
    check_bounds([(DECODE_STEPS, o.steps), (DECODE_REQUESTS, o.requests),
                  (DECODE_REPEATS, o.repeats)])
    model = (load_config(o.config, tp=o.tp, layers=o.layers, dtype=o.dtype) if o.config
             else model_preset(o.preset, dtype=o.dtype, layers=o.layers))
    batches = parse_sizes(o.batch) if o.batch else DEFAULT_BATCHES
    contexts = parse_sizes(o.context) if o.context else DEFAULT_CONTEXTS
    # `--context ''` (blank, only commas) names no size: it was max() of nothing, a
    # traceback, and `--batch ''` a plan of no workload (issue 41, ninth hostile pass)
    for option, sizes in (("--batch", batches), ("--context", contexts)):
        if not sizes:
            raise OptionError(f"{option} names no size; give one or more, e.g. "
                              f"{'1,8,32' if option == '--batch' else '1k,8k'}", option=option)
    if max(contexts) + o.steps > o.max_model_len:
        raise OptionError(f"context {max(contexts)} + {o.steps} steps exceeds "
                          f"--max-model-len {o.max_model_len}", option="--context")
    check_shape_count(len(batches) * len(contexts), "the batches and contexts")
    works = [Workload(batch=b, context=c, steps=o.steps) for b in batches for c in contexts]
    if o.serve:
        works.append(Workload(batch=max(batches), requests=o.requests, dist=LengthDist(
            o.serve, o.prompt_len, o.output_len, o.max_model_len, o.seed)))
    cfg = DecodeBenchConfig(repeats=o.repeats, eager=o.eager, max_model_len=o.max_model_len,
                            max_seq_len_to_capture=o.max_seq_len_to_capture, seed=o.seed)
    formats = parse_formats(o.formats)
    found = tuple(find_builds(o.workdir, o.trees or None) if builds is None else builds)
    return DecodeBenchPlan(options=o, builds=found, model=model, workloads=tuple(works),
                           config=cfg, out_dir=output_dir(o.out, o.workdir), formats=formats)


def run_decode_plan(plan: DecodeBenchPlan, *, progress: Callable[[str], None] = print,
                    command: Sequence[str] | None = None) -> BenchRun[DecodeDocument]:
    """Run the plan on the GPU and write its outputs. Refuses, before loading anything, a
    python without torch, a plan without builds and one whose first build is not the stock
    baseline. ``command``: what the document records as the command line [default: sys.argv]."""
    from .decode import run_decode_bench
    from .device import require_torch
    from .report import write_outputs

    require_torch("decode")
    trees = [b.tree for b in plan.builds]
    require_builds(trees, plan.options.workdir)
    require_baseline_first(trees)
    doc = run_decode_bench([load_build(b) for b in plan.builds], plan.model, plan.workloads,
                           plan.config, command=sys.argv if command is None else command,
                           progress=progress)
    paths = write_outputs(doc, plan.out_dir, plan.options.name, plan.formats)
    return BenchRun(doc=doc, paths=tuple(paths))


def check_decode_run(run: BenchRun[DecodeDocument]) -> None:
    """Refuse a run in which some tree's logits differ from stock's (after its results are
    shown and written: they are the evidence)."""
    if not all(s["bitwise_equal"] for s in decode_summary(run.doc)):
        raise BenchError("some tree's logits differ from the baseline's (see the table)",
                         "the kernels must not change results; run `kvprefetch verify-kernel`")
