"""``kvprefetch bench decode``: the command line parsed into one ``DecodeBenchOptions``
(bench/decode_plan.py, which holds the defaults, the checks and the plan), then the plan printed
(``--dry-run``, ``--json``) or run and its result rendered. Nothing here imports torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ...bench.decode_plan import (
    DECODE_REPEATS,
    DECODE_REQUESTS,
    DECODE_STEPS,
    DecodeBenchOptions,
    DecodeBenchPlan,
    check_decode_run,
    plan_decode_bench,
    run_decode_plan,
)
from ...console import emit_json, info, table
from ..common import (
    SEED_RANGE,
    BoundedNumber,
    count_range,
    dry_run_option,
    json_option,
    workdir_option,
)
from .options import output_options, trees_option, usage_errors

_D = DecodeBenchOptions  # the defaults the help shows are the library's


@click.command()
@workdir_option
@trees_option
@click.option("--preset", default=_D.preset, show_default=True,
              help="Model: llama-3.1-8b, qwen2.5-7b or llama-3-70b-tp8 (one GPU of 8, 8 layers).")
@click.option("--config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="A Hugging Face config.json instead of --preset.")
@click.option("--tp", type=click.IntRange(min=1), default=_D.tp, show_default=True,
              help="With --config: tensor-parallel ways (one GPU's heads, intermediate, vocab).")
@click.option("--layers", type=click.IntRange(min=1), default=None,
              help="Run only this many layers [default: the model's].")
@click.option("--dtype", type=click.Choice(["float16", "bfloat16"]), default=None,
              help="Weights, activations and KV cache [default: float16 for presets, the "
                   "config's torch_dtype for --config].")
@click.option("--batch", multiple=True, help="Batch sizes of the fixed points, e.g. 1,8,32,128.")
@click.option("--context", multiple=True,
              help="Context lengths of the fixed points, e.g. 1k,8k,32k (k = 1024).")
@click.option("--steps", type=BoundedNumber(DECODE_STEPS), default=_D.steps, show_default=True,
              help="Decode steps timed per fixed point.")
@click.option("--serve", type=click.Choice(["fixed", "uniform", "longtail"]),
              default=None, help="Also a continuous-batching trace with lengths from this "
              "distribution (seeded): --requests requests, at most the largest --batch at once.")
@click.option("--requests", type=BoundedNumber(DECODE_REQUESTS), default=_D.requests,
              show_default=True)
@click.option("--prompt-len", type=click.IntRange(min=1), default=_D.prompt_len,
              show_default=True)
@click.option("--output-len", type=click.IntRange(min=1), default=_D.output_len,
              show_default=True)
@click.option("--max-model-len", type=count_range(16), default=_D.max_model_len,
              show_default=True, help="Longest sequence; block tables hold this many tokens.")
@click.option("--repeats", type=BoundedNumber(DECODE_REPEATS), default=_D.repeats,
              show_default=True,
              help="Interleaved rounds per workload.")
@click.option("--eager", is_flag=True, help="Every step eager, as vLLM's enforce_eager.")
@click.option("--max-seq-len-to-capture", type=count_range(1),
              default=_D.max_seq_len_to_capture, show_default=True,
              help="vLLM's knob: graphs are captured with this max_seq_len; steps holding a "
                   "longer sequence run eagerly.")
@click.option("--seed", type=SEED_RANGE, default=_D.seed, show_default=True,
              help="Seeds the weights, inputs and trace (0 to 2**63 - 1).")
@output_options(_D.name)
@dry_run_option
@json_option
def decode(dry_run: bool, as_json: bool, **options: Any) -> None:
    """Whole-model decode throughput: every layer of a real model architecture at its true
    shapes (random weights, nothing downloaded) through each tree's paged attention, in ONE
    process, CUDA graphs per batch bucket as vLLM V0 captures them; fixed batch x context points
    and a continuous-batching serving trace. Reports tokens/s, step latency and attention's
    share per tree, ratios over interleaved rounds, and checks every step's logits bitwise."""
    with usage_errors():
        plan = plan_decode_bench(DecodeBenchOptions(**options))
    if dry_run:
        _show_plan(plan, as_json)
        return
    run = run_decode_plan(plan, progress=info)
    if as_json:
        emit_json(run.doc)
        return
    from ...bench.decode_report import decode_summary

    table(["tree", "workloads", "geomean ratio", "worst", "bitwise equal"],
          [[s["tree"], s["workloads"], f"{s['geomean']:.3f}x",
            f"{s['worst'][0]:.3f}x ({s['worst'][1]})", "yes" if s["bitwise_equal"] else "NO"]
           for s in decode_summary(run.doc)], title="bench decode")
    info("wrote " + ", ".join(str(p) for p in run.paths))
    check_decode_run(run)


def _show_plan(plan: DecodeBenchPlan, as_json: bool) -> None:
    if as_json:
        emit_json(plan.to_dict())
        return
    model = plan.model
    info(f"would run {model.name} ({model.layers} layers, {model.weight_bytes() / 2**30:.1f} "
         f"GiB of weights) over {len(plan.workloads)} workload(s) for "
         f"{', '.join(b.tree for b in plan.builds) or 'no builds found'}; outputs: "
         + ", ".join(plan.outputs))
    table(["workload", "steps"], [[w.label, w.steps if w.dist is None else "trace"]
                                  for w in plan.workloads])
