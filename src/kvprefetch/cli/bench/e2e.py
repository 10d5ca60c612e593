"""``kvprefetch bench e2e``: parses the command line into ``bench.e2e``'s ``E2EPlan``, prints
the ``vllm bench throughput`` runs (``--dry-run``) or runs them in the verified environments
and renders the result. Nothing here imports torch."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ...bench.plan import parse_formats
from ...console import emit_json, info
from ...errors import BenchError
from ..common import dry_run_option, json_option, workdir_option
from .options import output_options, usage_errors


@click.command()
@workdir_option
@click.option("--env", "env_specs", multiple=True,
              help="NAME=PYTHON of a full-build environment, baseline first (repeatable; default: "
                   "the envs with pythons in the verify report).")
@click.option("--max-num-seqs", "max_num_seqs", default="8,32,128", show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True)
@click.option("--input-len", type=int, default=512, show_default=True)
@click.option("--output-len", type=int, default=512, show_default=True)
@click.option("--prompts-per-seq", type=int, default=2, show_default=True,
              help="--num-prompts = max(--min-prompts, this x max-num-seqs).")
@click.option("--min-prompts", type=int, default=8, show_default=True)
@click.option("--dtype", default="float16", show_default=True)
@click.option("--max-model-len", type=int, default=None,
              help="Passed to vLLM (it also caps the seq len CUDA graphs are captured for, which "
                   "decides v1 vs v2).")
@click.option("--model-dir", type=click.Path(path_type=Path), default=None,
              help="Model config folder [default: <workdir>/models/llama-3.1-8b-dummy, written "
                   "by the kit].")
@click.option("--tokenizer", type=click.Path(path_type=Path), default=None,
              help="A local tokenizer folder [default: the generated word-level one].")
@click.option("--vllm-arg", "vllm_args", multiple=True, help="Extra argument for vllm bench "
              "throughput (repeatable).")
@click.option("--verify-report", type=click.Path(path_type=Path), default=None,
              help="[default: <workdir>/verify/report.json]")
@output_options("e2e")
@dry_run_option
@json_option
def e2e(workdir: Path, env_specs: tuple[str, ...], max_num_seqs: str, repeats: int,
        input_len: int, output_len: int, prompts_per_seq: int, min_prompts: int, dtype: str,
        max_model_len: int | None, model_dir: Path | None, tokenizer: Path | None,
        vllm_args: tuple[str, ...], verify_report: Path | None, out: Path | None, name: str,
        formats: str, dry_run: bool, as_json: bool) -> None:
    """`vllm bench throughput` in each full-build environment with VLLM_USE_V1=0 and
    VLLM_ATTENTION_BACKEND=XFORMERS, random dataset, dummy weights; sweeps --max-num-seqs,
    alternates the environments, repeats. Refuses unless verify-kernel passed for them."""
    from ...bench.e2e import (
        E2EPlan,
        parse_env_specs,
        plan_runs,
        require_verified,
        verified_envs,
        write_model_dir,
    )
    from ...bench.matrix import parse_sizes

    report_path = verify_report or workdir / "verify" / "report.json"
    out_dir = out or workdir / "bench"
    with usage_errors():
        fmts = parse_formats(formats)
    try:
        verified = require_verified(report_path, [s.partition("=")[0] for s in env_specs])
        refusal = None
    except BenchError as exc:
        if not dry_run:
            raise
        refusal = exc.message
        verified = {}
        if report_path.is_file():
            import json

            verified = verified_envs(json.loads(report_path.read_text(encoding="utf-8")))
    envs = parse_env_specs(env_specs, verified) if (env_specs or verified) else ()
    plan = E2EPlan(envs=envs, model_dir=model_dir or workdir / "models" / "llama-3.1-8b-dummy",
                   out_dir=out_dir / name, tokenizer=tokenizer,
                   max_num_seqs=parse_sizes(max_num_seqs), repeats=repeats, input_len=input_len,
                   output_len=output_len, prompts_per_seq=prompts_per_seq,
                   min_prompts=min_prompts, dtype=dtype, max_model_len=max_model_len,
                   extra_args=vllm_args)
    if not envs and not dry_run:
        raise BenchError("no environments given", "pass --env baseline=PYTHON --env patched=PYTHON")
    runs = plan_runs(plan) if envs else []
    if dry_run:
        from ...bench.e2e import E2E_ENV
        from ...runner import quote

        if as_json:
            emit_json({"refusal": refusal, "environment": E2E_ENV,
                       "runs": [list(r.argv) for r in runs]})
            return
        if refusal:
            info(f"would refuse: {refusal}")
        env_text = " ".join(f"{k}={v}" for k, v in E2E_ENV.items())
        for r in runs:
            click.echo(f"{env_text} {quote(r.argv)}")
        return
    from ...bench.e2e import run_e2e
    from ...bench.report import render_markdown, write_outputs

    if model_dir is None:
        write_model_dir(plan.model_dir)
    doc = run_e2e(plan, progress=info, command=sys.argv)
    paths = write_outputs(doc, out_dir, name, fmts)
    if as_json:
        emit_json(doc)
        return
    click.echo(render_markdown(doc))
    info("wrote " + ", ".join(str(p) for p in paths))
