"""``bench e2e``'s options as one frozen ``E2EBenchOptions``, and the plan made of them.

``plan_e2e_bench`` validates the options and resolves them into a frozen ``E2EBenchPlan``: the
environments (``NAME=PYTHON``, or those the verify-kernel report lists), the ``vllm bench
throughput`` runs in execution order (``E2EPlan``, bench/e2e.py), the output files, and the
verify-kernel refusal a real run would stop at. A real run is refused while planning (nothing
is written before it); a dry run records the refusal in the plan and shows it. ``run_e2e_plan``
executes the plan. The click layer (cli/bench/e2e.py) parses the command line into the options,
calls these and renders; the defaults live here and it shows them. Nothing here imports torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BenchError
from ..reading import load_json
from .e2e import (
    E2E_ENV,
    E2EPlan,
    E2ERun,
    parse_env_specs,
    plan_runs,
    require_verified,
    verified_envs,
)
from .matrix import parse_sizes
from .plan import BenchRun, Bound, check_bounds, output_dir, parse_formats
from .schema import E2EDocument


@dataclass(frozen=True, kw_only=True)
class E2EBenchOptions:
    """Everything ``bench e2e`` is asked, before anything is checked or resolved.

    ``envs`` keeps the command line's ``NAME=PYTHON`` strings, baseline first; empty is the
    environments (with pythons) the verify report lists. ``max_num_seqs`` is the comma-separated
    sweep. ``model_dir`` None is the kit's generated ``<workdir>/models/llama-3.1-8b-dummy``,
    ``tokenizer`` None the generated one, ``verify_report`` None
    ``<workdir>/verify/report.json``, ``out`` None ``<workdir>/bench``."""

    workdir: Path
    envs: tuple[str, ...] = ()
    max_num_seqs: str = "8,32,128"
    repeats: int = 3
    input_len: int = 512
    output_len: int = 512
    prompts_per_seq: int = 2
    min_prompts: int = 8
    dtype: str = "float16"
    max_model_len: int | None = None
    model_dir: Path | None = None
    tokenizer: Path | None = None
    vllm_args: tuple[str, ...] = ()
    verify_report: Path | None = None
    out: Path | None = None
    name: str = "e2e"
    formats: str = "json,md,png"


# The ranges of bench e2e's counts (issue 41, fourth pass: negative counts passed the plan and
# reached vLLM's command line). Each is a count of runs, tokens or prompts: below 1 is none at
# all, except --min-prompts, a floor where 0 means no floor (--num-prompts is then
# --prompts-per-seq x max-num-seqs, at least 1).
# Repeats alternate the environments; 1000 runs of each sweep point is weeks of serving.
E2E_REPEATS = Bound("--repeats", 1, 1000, integer=True)
# Token counts: vllm bench throughput's random prompts and outputs, and vLLM's max_model_len;
# 1M tokens is beyond every model the kit benchmarks (Llama 3.1's 128k).
E2E_INPUT_LEN = Bound("--input-len", 1, 1 << 20, integer=True)
E2E_OUTPUT_LEN = Bound("--output-len", 1, 1 << 20, integer=True)
E2E_MAX_MODEL_LEN = Bound("--max-model-len", 1, 1 << 20, integer=True)
# Prompts per sequence slot and the floor on prompts: a million prompts per run is hours of
# serving for a single point.
E2E_PROMPTS_PER_SEQ = Bound("--prompts-per-seq", 1, 1000, integer=True)
E2E_MIN_PROMPTS = Bound("--min-prompts", 0, 1_000_000, integer=True)


def check_e2e_options(o: E2EBenchOptions) -> None:
    """OptionError for a count out of its range (the command line refuses the same)."""
    check_bounds([(E2E_REPEATS, o.repeats), (E2E_INPUT_LEN, o.input_len),
                  (E2E_OUTPUT_LEN, o.output_len), (E2E_PROMPTS_PER_SEQ, o.prompts_per_seq),
                  (E2E_MIN_PROMPTS, o.min_prompts)]
                 + ([(E2E_MAX_MODEL_LEN, o.max_model_len)] if o.max_model_len is not None
                    else []))


@dataclass(frozen=True, kw_only=True)
class E2EBenchPlan:
    """What one ``bench e2e`` run will do. ``refusal``: why a real run would stop (a dry run's
    plan only; a real run's planning raises it)."""

    options: E2EBenchOptions
    e2e: E2EPlan
    runs: tuple[E2ERun, ...]
    out_dir: Path
    formats: tuple[str, ...]
    refusal: str | None = None

    @property
    def environment(self) -> dict[str, str]:
        """The variables every run is given (on top of the caller's, minus what breaks
        isolation)."""
        return dict(E2E_ENV)

    def to_dict(self) -> dict[str, Any]:
        """The plan as ``--dry-run --json`` prints it."""
        return {"refusal": self.refusal, "environment": E2E_ENV,
                "runs": [list(r.argv) for r in self.runs]}


def plan_e2e_bench(options: E2EBenchOptions, *, dry_run: bool = False) -> E2EBenchPlan:
    """Check ``options`` and resolve them into the plan. Refuses, in this order: unknown
    formats; unless ``dry_run``, environments verify-kernel has not passed; a bad ``NAME=PYTHON``
    or fewer than two environments; a bad ``max_num_seqs``; unless ``dry_run``, no environments
    at all. A dry run's plan carries the verify-kernel refusal instead, and may have no runs."""
    o = options
    check_e2e_options(o)
    report_path = o.verify_report or o.workdir / "verify" / "report.json"
    out_dir = output_dir(o.out, o.workdir)
    formats = parse_formats(o.formats)
    refusal = None
    try:
        verified = require_verified(report_path, [s.partition("=")[0] for s in o.envs])
    except BenchError as exc:
        if not dry_run:
            raise
        refusal = exc.message
        verified = _listed_envs(report_path)
    envs = parse_env_specs(o.envs, verified, o.workdir) if (o.envs or verified) else ()
    e2e = E2EPlan(envs=envs, model_dir=o.model_dir or o.workdir / "models" / "llama-3.1-8b-dummy",
                  out_dir=out_dir / o.name, tokenizer=o.tokenizer,
                  max_num_seqs=parse_sizes(o.max_num_seqs), repeats=o.repeats,
                  input_len=o.input_len, output_len=o.output_len,
                  prompts_per_seq=o.prompts_per_seq, min_prompts=o.min_prompts, dtype=o.dtype,
                  max_model_len=o.max_model_len, extra_args=o.vllm_args)
    if not envs and not dry_run:
        raise BenchError("no environments given", "pass --env baseline=PYTHON --env patched=PYTHON")
    return E2EBenchPlan(options=o, e2e=e2e, runs=tuple(plan_runs(e2e) if envs else ()),
                        out_dir=out_dir, formats=formats, refusal=refusal)


def _listed_envs(report_path: Path) -> dict[str, str | None]:
    """The environments a verify report lists, passed or not (what a dry run shows the runs
    of); none where it is missing or no JSON object (the plan's refusal says why)."""
    try:
        report = load_json(report_path)
        return verified_envs(report, report_path) if isinstance(report, dict) else {}
    except (OSError, ValueError, BenchError):  # malformed: the refusal says why
        return {}


def run_e2e_plan(plan: E2EBenchPlan, *, progress: Callable[[str], None] | None = None,
                 command: Sequence[str] | None = None) -> BenchRun[E2EDocument]:
    """Run the plan (writing the kit's dummy model config first when no ``model_dir`` was
    given) and write its outputs. ``command``: what the document records as the command line
    [default: sys.argv]."""
    from .e2e import run_e2e, write_model_dir
    from .report import write_outputs

    if plan.refusal is not None:
        raise BenchError(plan.refusal, "plan the run without dry_run: it refuses while planning")
    if plan.options.model_dir is None:
        write_model_dir(plan.e2e.model_dir)
    doc = run_e2e(plan.e2e, progress=progress, command=sys.argv if command is None else command)
    paths = write_outputs(doc, plan.out_dir, plan.options.name, plan.formats)
    return BenchRun(doc=doc, paths=tuple(paths))
