"""``kvprefetch bench kernel``: the command line parsed into one ``KernelBenchOptions``
(bench/kernel_plan.py, which holds the defaults, the checks and the plan), then the plan printed
(``--dry-run``, ``--json``) or run and its result rendered.

``sample_options`` gathers ``--sample N`` and the options that narrow it (issue 29) into one
``SampleOptions``; ``launch_options`` turns ``--timing``, ``--call``, ``--max-model-len``,
``--max-seq-len-to-capture`` and ``--eager`` into one ``LaunchOptions`` (issue 40). Nothing here
imports torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ...bench.kernel_plan import (
    DEFAULT_MATRIX,
    L2_FACTOR,
    POOL_FACTOR,
    SAMPLE_MS,
    TIME_LIMIT,
    KernelBenchOptions,
    KernelBenchPlan,
    LaunchOptions,
    SampleOptions,
    check_kernel_run,
    parse_timings,
    plan_kernel_bench,
    run_kernel_plan,
)
from ...bench.matrix import (
    DEFAULT_CONTEXTS,
    MODES,
    NAMED_MATRICES,
    describe_named_matrices,
    format_size,
)
from ...bench.schema import KernelDocument, SampleDocument
from ...bench.vllm_call import VllmCall
from ...console import emit_json, info, table
from ..common import (
    ROUNDS_RANGE,
    SEED_RANGE,
    BoundedNumber,
    count_range,
    dry_run_option,
    json_option,
    workdir_option,
)
from .options import output_options, trees_option, usage_errors

F = TypeVar("F", bound=Callable[..., Any])

_K = KernelBenchOptions  # the defaults the help shows are the library's
_S = SampleOptions


def _given_or_none(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """None where the option was left at its default: a sample refuses only what was chosen."""
    source = ctx.get_parameter_source(param.name or "")
    return None if source in (None, click.core.ParameterSource.DEFAULT) else value


def sample_options(f: F) -> F:
    """The ``--sample*`` options as one ``sample: SampleOptions`` argument of the command (and
    ``--max-layers``, ``--time-limit``, which the help lists after them, as they are)."""
    @functools.wraps(f)
    def wrapper(*args: Any, sample_n: int | None, sample_seed: int | None, sample_max_kv: str,
                sample_head_sizes: str, sample_block_sizes: str, sample_caches: str,
                **kwargs: Any) -> Any:
        kwargs["sample"] = SampleOptions(n=sample_n, seed=sample_seed, max_kv=sample_max_kv,
                                         head_sizes=sample_head_sizes,
                                         block_sizes=sample_block_sizes, caches=sample_caches)
        return f(*args, **kwargs)

    out: Any = wrapper
    for deco in reversed((
        click.option("--sample", "sample_n", type=int, default=None, metavar="N",
                     help="Draw N decode steps from the sampled benchmark's distribution "
                          "(docs/sampled-benchmark.md) instead of a matrix, within what every "
                          "build being timed instantiates."),
        click.option("--sample-seed", type=int, default=None, metavar="S",
                     help="The sample's seed [default 0]: the same seed and builds draw the "
                          "same steps. Tune on one seed, report on a fresh one."),
        click.option("--sample-max-kv", default=_S.max_kv, show_default=True, metavar="SIZE",
                     help="Largest KV per step (per layer), e.g. 4g or 512m; larger draws are "
                          "drawn again."),
        click.option("--sample-head-sizes", default=_S.head_sizes, metavar="LIST",
                     help="Narrow the sample to these head sizes (of 64,128,256) [default: all "
                          "the builds have]."),
        click.option("--sample-block-sizes", default=_S.block_sizes, metavar="LIST",
                     help="Narrow the sample to these block sizes (of 16,32)."),
        click.option("--sample-caches", default=_S.caches, metavar="LIST",
                     help="Narrow the sample to these caches (of fp16,bf16,fp8)."),
        click.option("--max-layers", type=click.IntRange(min=1), default=_K.max_layers,
                     show_default=True,
                     help="Cold mode: most layers' caches rotated; a smaller step needing more "
                          "to exceed the L2 is skipped."),
        click.option("--time-limit", type=BoundedNumber(TIME_LIMIT),
                     default=_K.time_limit, show_default=True,
                     metavar="SECONDS",
                     help="Start no shape after this many seconds (0: no limit, at most 30 days); "
                          "the rest are recorded as not run."),
    )):
        out = deco(out)
    return out  # type: ignore[no-any-return]


def launch_options(f: F) -> F:
    """The launch options as one ``launch: LaunchOptions`` argument of the command."""
    @functools.wraps(f)
    def wrapper(*args: Any, timing_text: str, call_name: str, max_model_len: int | None,
                max_seq_len_to_capture: int, eager: bool, **kwargs: Any) -> Any:
        kwargs["launch"] = LaunchOptions(
            timings=parse_timings(timing_text),
            call=VllmCall(call=call_name, max_model_len=max_model_len,
                          max_seq_len_to_capture=max_seq_len_to_capture,
                          enforce_eager=eager))
        return f(*args, **kwargs)

    out: Any = wrapper
    for deco in reversed((
        click.option("--timing", "timing_text", default=",".join(LaunchOptions().timings),
                     show_default=True, metavar="LIST",
                     help="graph (CUDA graphs on, as vLLM runs by default: each step is timed "
                          "the way vLLM runs it, replayed or, where vLLM runs it eagerly, "
                          "eagerly), eager (back-to-back calls of every step, the host path "
                          "included, as --enforce-eager) or graph,eager."),
        click.option("--call", "call_name", type=click.Choice(["vllm", "exact"]),
                     default=VllmCall.call, show_default=True,
                     help="vllm: what vLLM 0.10.2 V0 passes the kernel (graph steps padded to "
                          "their capture size with length-1 rows, max_seq_len = the capture "
                          "length, the captured block-table width); exact: every step at its "
                          "real max_seq_len and batch (research only)."),
        click.option("--max-model-len", type=count_range(16), default=None,
                     metavar="N",
                     help="The model's max_model_len: capture length = min(8192, N) [default: "
                          "the model's, 8192 or more]; a sample draws its own per step."),
        click.option("--max-seq-len-to-capture", type=count_range(1),
                     default=VllmCall.max_seq_len_to_capture, show_default=True, metavar="N",
                     help="vLLM's knob: graphs are captured with this max_seq_len; steps "
                          "holding a longer sequence run eagerly."),
        click.option("--eager", is_flag=True,
                     help="vLLM's enforce_eager: every step eager, at its real values."),
    )):
        out = deco(out)
    return out  # type: ignore[no-any-return]


@click.command()
@workdir_option
@trees_option
@click.option("--preset", multiple=True, help="Model preset(s) for the attention shape "
              "[default: llama-3.1-8b]; see --list-presets.")
@click.option("--matrix", type=click.Choice(list(NAMED_MATRICES)), default=DEFAULT_MATRIX,
              show_default=True, callback=_given_or_none,
              help=f"Named union of batch x context grids ({describe_named_matrices()}); "
                   "--batch and --context override its first grid's axes and drop the rest.")
@click.option("--batch", multiple=True, help="Batch sizes, e.g. 1,8,32 [default: the --matrix's "
              "batches, 1,8,32,64,128].")
@click.option("--context", multiple=True, help="Context lengths in tokens, e.g. 512,1k,16k (k = "
              "1024) [default: the --matrix's contexts, "
              f"{','.join(format_size(c) for c in DEFAULT_CONTEXTS)} for --matrix default, "
              f"{','.join(format_size(c) for c in NAMED_MATRICES['issue6'][0][1])} for --matrix "
              "issue6].")
@click.option("--block-size", multiple=True, help="Block sizes: 16 [default], 8, 32.")
@click.option("--dtype", multiple=True, help="float16 [default], bfloat16, float32.")
@click.option("--kv-cache-dtype", multiple=True, help="auto [default], fp8, fp8_e5m2.")
@click.option("--force-kernel", type=click.Choice(["v1", "v2"]), default=None,
              help="Force v1 or v2 instead of vLLM's own choice.")
@click.option("--mode", "modes", multiple=True, type=click.Choice(list(MODES)),
              help="cold [default]: KV rotated over enough layers to exceed L2; hot: one layer; "
              "aliased: one layer whose block tables point into a pool of --alias-l2-fraction "
              "of the L2 (every KV load an L2 hit at any shape: the L2-resident bound).")
@click.option("--rounds", type=ROUNDS_RANGE, default=_K.rounds, show_default=True,
              help="Interleaved rounds of every shape (3 to 10,000).")
@click.option("--sample-ms", type=BoundedNumber(SAMPLE_MS), default=_K.sample_ms,
              show_default=True, help="Minimum duration of one timed sample (> 0, at most 60000).")
@click.option("--l2-factor", type=BoundedNumber(L2_FACTOR), default=_K.l2_factor,
              show_default=True,
              help="Cold mode: bytes per pass over the layers >= this times the L2 (1 to 1000).")
@click.option("--pool-factor", type=BoundedNumber(POOL_FACTOR), default=_K.pool_factor,
              show_default=True,
              help="KV pool size over the blocks the batch needs (block tables are drawn from "
                   "it; 1 to 1000).")
@click.option("--alias-l2-fraction", type=float, default=_K.alias_l2_fraction, show_default=True,
              help="Aliased mode: the block pool's size as a fraction of the L2.")
@click.option("--seed", type=SEED_RANGE, default=_K.seed, show_default=True,
              help="Seeds the inputs (0 to 2**63 - 1).")
@click.option("--list-presets", is_flag=True, help="List the model presets and exit.")
@sample_options
@launch_options
@output_options(_K.name)
@dry_run_option
@json_option
def kernel(list_presets: bool, dry_run: bool, as_json: bool, **options: Any) -> None:
    """Time every kernels-only build in ONE process over a matrix of shapes (CUDA graphs,
    variants interleaved over rounds), check bitwise identity in the same run, and write
    <name>.json, .md and a speedup heatmap .png. Shapes that vLLM's launcher cannot run or that
    do not fit in free device memory are skipped and recorded with the reason. With --sample N
    the shapes are N decode steps drawn from a documented distribution (ragged batches
    included), and the report gives the ratios' distribution, the worst steps, the A/A band of a
    `control` tree and the attribution to mechanisms. Each step is launched as vLLM 0.10.2 calls
    the kernel (--call vllm: graph steps padded to their capture size at the capture length)."""
    if list_presets:
        _list_presets()
        return
    with usage_errors():
        plan = plan_kernel_bench(KernelBenchOptions(**options))
    if dry_run:
        _show_plan(plan, as_json)
        return
    run = run_kernel_plan(plan, progress=info)
    if as_json:
        emit_json(run.doc)
        return
    if run.doc["kind"] == "sample":
        _sample_table(run.doc)
    else:
        _matrix_table(run.doc)
    for r in run.doc["meta"]["not_measured"]:
        info(f"{r['status']}: {r['label']} {r['mode']}: {r['reason']}")
    info("wrote " + ", ".join(str(p) for p in run.paths))
    check_kernel_run(run, plan.out_dir)


def _list_presets() -> None:
    from ...bench.matrix import PRESETS

    table(["preset", "q heads", "kv heads", "head size", "layers", "source"],
          [[p.name, p.num_heads, p.num_kv_heads, p.head_size, p.num_layers, p.source]
           for p in PRESETS.values()])


def _show_plan(plan: KernelBenchPlan, as_json: bool) -> None:
    if as_json:
        emit_json(plan.to_dict())
        return
    from ...bench.vllm_call import describe_call

    info(f"would time {plan.runs} shape(s) x {len(plan.builds)} variant(s) "
         f"({', '.join(b.tree for b in plan.builds) or 'no builds found'}); call: "
         f"{describe_call(plan.options.launch.call.to_dict())}; outputs: "
         + ", ".join(plan.outputs))
    if plan.sample is not None:
        from ...bench.sample import describe_step

        table(["step", "shape"], [[i, describe_step(s)] for i, s in enumerate(plan.shapes)])
        return
    table(["preset", "batch", "context", "block", "dtype", "kv", "kernel"],
          [[s.preset, s.attn.num_seqs, s.attn.max_seq_len, s.attn.block_size, s.attn.dtype,
            s.attn.kv_cache_dtype, s.kernel] for s in plan.shapes])


def _sample_table(doc: SampleDocument) -> None:
    from ...bench.sample_report import sample_summary

    table(["timing", "variant", "steps", "min", "p5", "median", "geomean", "< 0.99",
           "bitwise equal"],
          [[s["timing"], s["variant"], s["n"], f"{s['min']:.3f}x", f"{s['p5']:.3f}x",
            f"{s['median']:.3f}x", f"{s['geomean']:.3f}x", s["below_target"],
            "yes" if s["all_bitwise_equal"] else "NO"] for s in sample_summary(doc)],
          title="bench kernel --sample")


def _matrix_table(doc: KernelDocument) -> None:
    from ...bench.report import kernel_summary

    table(["mode", "variant", "shapes", "geomean speedup", "worst", "slower (median)",
           "bitwise equal"],
          [[s["mode"], s["variant"], s["shapes"], f"{s['geomean_speedup']:.3f}x",
            f"{s['worst']['speedup']:.3f}x (b{s['worst']['batch']} ctx{s['worst']['context']})",
            s["slower_median"], "yes" if s["all_bitwise_equal"] else "NO"]
           for s in kernel_summary(doc)], title="bench kernel")

