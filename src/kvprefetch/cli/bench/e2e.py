"""``kvprefetch bench e2e``: the command line parsed into one ``E2EBenchOptions``
(bench/e2e_plan.py, which holds the defaults, the checks and the plan), then the ``vllm bench
throughput`` runs printed (``--dry-run``, ``--json``) or run in the verified environments and
the result rendered. Nothing here imports torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ...bench.e2e_plan import (
    E2E_INPUT_LEN,
    E2E_MAX_MODEL_LEN,
    E2E_MIN_PROMPTS,
    E2E_OUTPUT_LEN,
    E2E_PROMPTS_PER_SEQ,
    E2E_REPEATS,
    E2EBenchOptions,
    E2EBenchPlan,
    plan_e2e_bench,
    run_e2e_plan,
)
from ...console import emit_json, info, say
from ..common import BoundedNumber, dry_run_option, json_option, workdir_option
from .options import output_options, usage_errors

_D = E2EBenchOptions  # the defaults the help shows are the library's


@click.command()
@workdir_option
@click.option("--env", "envs", multiple=True,
              help="NAME=PYTHON of a full-build environment, baseline first (repeatable; default: "
                   "the envs with pythons in the verify report).")
@click.option("--max-num-seqs", "max_num_seqs", default=_D.max_num_seqs, show_default=True)
@click.option("--repeats", type=BoundedNumber(E2E_REPEATS), default=_D.repeats, show_default=True)
@click.option("--input-len", type=BoundedNumber(E2E_INPUT_LEN),
              default=_D.input_len, show_default=True)
@click.option("--output-len", type=BoundedNumber(E2E_OUTPUT_LEN),
              default=_D.output_len, show_default=True)
@click.option("--prompts-per-seq", type=BoundedNumber(E2E_PROMPTS_PER_SEQ),
              default=_D.prompts_per_seq, show_default=True,
              help="--num-prompts = max(--min-prompts, this x max-num-seqs).")
@click.option("--min-prompts", type=BoundedNumber(E2E_MIN_PROMPTS),
              default=_D.min_prompts, show_default=True)
@click.option("--dtype", default=_D.dtype, show_default=True)
@click.option("--max-model-len", type=BoundedNumber(E2E_MAX_MODEL_LEN), default=_D.max_model_len,
              help="Passed to vLLM (it also caps the seq len CUDA graphs are captured for, which "
                   "decides v1 vs v2).")
@click.option("--model-dir", type=click.Path(path_type=Path), default=_D.model_dir,
              help="Model config folder [default: <workdir>/models/llama-3.1-8b-dummy, written "
                   "by the kit].")
@click.option("--tokenizer", type=click.Path(path_type=Path), default=_D.tokenizer,
              help="A local tokenizer folder [default: the generated word-level one].")
@click.option("--vllm-arg", "vllm_args", multiple=True, help="Extra argument for vllm bench "
              "throughput (repeatable).")
@click.option("--verify-report", type=click.Path(path_type=Path), default=_D.verify_report,
              help="[default: <workdir>/verify/report.json]")
@output_options(_D.name)
@dry_run_option
@json_option
def e2e(dry_run: bool, as_json: bool, **options: Any) -> None:
    """`vllm bench throughput` in each full-build environment with VLLM_USE_V1=0 and
    VLLM_ATTENTION_BACKEND=XFORMERS, random dataset, dummy weights; sweeps --max-num-seqs,
    alternates the environments, repeats. Refuses unless verify-kernel passed for them."""
    with usage_errors():
        plan = plan_e2e_bench(E2EBenchOptions(**options), dry_run=dry_run)
    if dry_run:
        _show_plan(plan, as_json)
        return
    from ...bench.report import render_markdown

    run = run_e2e_plan(plan, progress=info)
    if as_json:
        emit_json(run.doc)
        return
    click.echo(render_markdown(run.doc))
    info("wrote " + ", ".join(str(p) for p in run.paths))


def _show_plan(plan: E2EBenchPlan, as_json: bool) -> None:
    if as_json:
        emit_json(plan.to_dict())
        return
    from ...runner import quote

    if plan.refusal:
        info(f"would refuse: {plan.refusal}")
    env_text = " ".join(f"{k}={v}" for k, v in plan.environment.items())
    for r in plan.runs:
        say(f"{env_text} {quote(r.argv)}")
