"""``kvprefetch bench kernel|ncu|e2e|decode``: thin click layer over ``kvprefetch.bench``.

Every subcommand resolves its options into a plan first; ``--dry-run`` prints (or with ``--json``
emits) that plan and touches no GPU. Nothing here imports torch at import time.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ..bench.matrix import (
    DEFAULT_CONTEXTS,
    MODES,
    NAMED_MATRICES,
    describe_named_matrices,
    format_size,
)
from ..console import emit_json, info, table
from ..errors import BenchError
from .bench_sample import (
    MATRIX_OPTIONS,
    LaunchOptions,
    check_sample_call,
    given_parameters,
    launch_options,
    resolve_sample,
    sample_options,
)
from .common import dry_run_option, json_option, tree_option, workdir_option

F = TypeVar("F", bound=Callable[..., Any])

FORMATS = ("json", "md", "png")


def _formats(text: str) -> tuple[str, ...]:
    out = tuple(f.strip() for f in text.split(",") if f.strip())
    bad = [f for f in out if f not in FORMATS]
    if bad:
        raise click.BadParameter(f"unknown format(s) {', '.join(bad)}; use json, md, png")
    return out


def output_options(default_name: str) -> Callable[[F], F]:
    def deco(f: F) -> F:
        f = click.option("--out", type=click.Path(path_type=Path), default=None,
                         help="Output folder [default: <workdir>/bench].")(f)
        f = click.option("--name", default=default_name, show_default=True,
                         help="Base name of the output files (<name>.json/.md/.png).")(f)
        f = click.option("--formats", default="json,md,png", show_default=True,
                         help="Which of json, md, png to write.")(f)
        return f
    return deco


trees_option = tree_option("Tree to load (repeatable; default: every kernels-only build "
                           "found, baseline first).")


def _require_baseline_first(trees: list[str]) -> None:
    """Speedups and bitwise equality are relative to the stock build; never to another variant."""
    if not trees or trees[0] != "baseline":
        raise BenchError(f"the stock 'baseline' build is not among {trees}",
                         "build it (`kvprefetch build --kernels-only`) and include it in --tree")


@click.group()
def bench() -> None:
    """Benchmark stock vs patched decode attention (kernel, ncu) and vLLM end to end (e2e)."""


# ----------------------------------------------------------------------------- kernel


@bench.command()
@workdir_option
@trees_option
@click.option("--preset", multiple=True, help="Model preset(s) for the attention shape "
              "[default: llama-3.1-8b]; see --list-presets.")
@click.option("--matrix", "matrix_name", type=click.Choice(list(NAMED_MATRICES)),
              default="default", show_default=True,
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
@click.option("--mode", multiple=True, type=click.Choice(list(MODES)),
              help="cold [default]: KV rotated over enough layers to exceed L2; hot: one layer; "
              "aliased: one layer whose block tables point into a pool of --alias-l2-fraction "
              "of the L2 (every KV load an L2 hit at any shape: the L2-resident bound).")
@click.option("--rounds", type=int, default=21, show_default=True)
@click.option("--sample-ms", type=float, default=3.0, show_default=True,
              help="Minimum duration of one timed sample.")
@click.option("--l2-factor", type=float, default=4.0, show_default=True,
              help="Cold mode: bytes per pass over the layers >= this times the L2.")
@click.option("--pool-factor", type=float, default=1.0, show_default=True,
              help="KV pool size over the blocks the batch needs (block tables are drawn from it).")
@click.option("--alias-l2-fraction", type=float, default=0.25, show_default=True,
              help="Aliased mode: the block pool's size as a fraction of the L2.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--list-presets", is_flag=True, help="List the model presets and exit.")
@sample_options
@launch_options
@output_options("kernel")
@dry_run_option
@json_option
def kernel(workdir: Path, trees: tuple[str, ...], preset: tuple[str, ...], matrix_name: str,
           batch: tuple[str, ...], context: tuple[str, ...], block_size: tuple[str, ...],
           dtype: tuple[str, ...], kv_cache_dtype: tuple[str, ...], force_kernel: str | None,
           mode: tuple[str, ...], rounds: int, sample_ms: float, l2_factor: float,
           pool_factor: float, alias_l2_fraction: float, seed: int, list_presets: bool,
           sample_n: int | None, sample_seed: int | None, sample_max_kv: str,
           sample_head_sizes: str, sample_block_sizes: str, sample_caches: str,
           launch: LaunchOptions, max_layers: int, time_limit: float,
           out: Path | None, name: str, formats: str, dry_run: bool, as_json: bool) -> None:
    """Time every kernels-only build in ONE process over a matrix of shapes (CUDA graphs,
    variants interleaved over rounds), check bitwise identity in the same run, and write
    <name>.json, .md and a speedup heatmap .png. Shapes that vLLM's launcher cannot run or that
    do not fit in free device memory are skipped and recorded with the reason. With --sample N
    the shapes are N decode steps drawn from a documented distribution (ragged batches
    included), and the report gives the ratios' distribution, the worst steps, the A/A band of a
    `control` tree and the attribution to mechanisms. Each step is launched as vLLM 0.10.2 calls
    the kernel (--call vllm: graph steps padded to their capture size at the capture length)."""
    from ..bench.kernel import kernel_configs
    from ..bench.matrix import PRESETS, build_matrix
    from ..kernels.ops import find_builds

    if list_presets:
        table(["preset", "q heads", "kv heads", "head size", "layers", "source"],
              [[p.name, p.num_heads, p.num_kv_heads, p.head_size, p.num_layers, p.source]
               for p in PRESETS.values()])
        return
    builds = find_builds(workdir, trees or None)
    spec = resolve_sample(sample_n, sample_seed, sample_max_kv, sample_head_sizes,
                          sample_block_sizes, sample_caches, builds,
                          given_parameters(list(MATRIX_OPTIONS)))
    check_sample_call(spec, launch)
    if spec is None:
        matrix = build_matrix(preset, batch, context, block_size, dtype, kv_cache_dtype,
                              force_kernel, matrix=matrix_name)
        shapes = matrix.shapes()
    else:
        from ..bench.sample import draw_sample

        matrix = build_matrix()  # recorded only; the sample's steps replace its shapes
        shapes = draw_sample(spec)
    configs = kernel_configs(mode or ("cold",), launch.timings, launch.call, rounds=rounds,
                             target_sample_ms=sample_ms, l2_factor=l2_factor,
                             pool_factor=pool_factor, alias_l2_fraction=alias_l2_fraction,
                             seed=seed, max_layers=max_layers)
    fmts = _formats(formats)
    out_dir = out or workdir / "bench"
    outputs = [str(out_dir / f"{name}.{f}") for f in fmts]
    plan = {"matrix": matrix.to_dict() if spec is None else None,
            "sample": spec.to_dict() if spec is not None else None,
            "modes": list(dict.fromkeys(c.mode for c in configs)),
            "timings": list(dict.fromkeys(c.timing for c in configs)),
            "call": launch.call.to_dict(),
            "rounds": rounds, "shapes": len(shapes) * len(configs),
            "variants": [b.to_dict() for b in builds],
            "outputs": outputs}
    if dry_run:
        if as_json:
            emit_json({**plan, "shape_list": [s.to_dict() for s in shapes]})
            return
        from ..bench.vllm_call import describe_call

        info(f"would time {plan['shapes']} shape(s) x {len(builds)} variant(s) "
             f"({', '.join(b.tree for b in builds) or 'no builds found'}); call: "
             f"{describe_call(plan['call'])}; outputs: " + ", ".join(outputs))
        if spec is not None:
            from ..bench.sample import describe_step

            table(["step", "shape"], [[i, describe_step(s)] for i, s in enumerate(shapes)])
            return
        table(["preset", "batch", "context", "block", "dtype", "kv", "kernel"],
              [[s.preset, s.attn.num_seqs, s.attn.max_seq_len, s.attn.block_size, s.attn.dtype,
                s.attn.kv_cache_dtype, s.kernel] for s in shapes])
        return
    from ..bench.device import require_torch
    from ..bench.kernel import run_kernel_bench
    from ..bench.report import write_outputs
    from ..kernels.ops import load_build

    require_torch("kernel")
    if not builds:
        raise BenchError(f"no kernels-only builds under {workdir / 'build'}",
                         "run `kvprefetch build --kernels-only` on this machine first")
    _require_baseline_first([b.tree for b in builds])
    ops = [load_build(b) for b in builds]
    doc = run_kernel_bench(ops, matrix, configs, progress=info, command=sys.argv,
                           shapes=shapes if spec is not None else None,
                           sample=spec.to_dict() if spec is not None else None,
                           time_limit_s=time_limit)
    paths = write_outputs(doc, out_dir, name, fmts)
    if as_json:
        emit_json(doc)
        return
    if spec is not None:
        from ..bench.sample_report import sample_summary

        table(["timing", "variant", "steps", "min", "p5", "median", "geomean", "< 0.99",
               "bitwise equal"],
              [[s["timing"], s["variant"], s["n"], f"{s['min']:.3f}x", f"{s['p5']:.3f}x",
                f"{s['median']:.3f}x", f"{s['geomean']:.3f}x", s["below_target"],
                "yes" if s["all_bitwise_equal"] else "NO"] for s in sample_summary(doc)],
              title="bench kernel --sample")
    else:
        _matrix_table(doc)
    _kernel_epilogue(doc, paths, out_dir)


def _matrix_table(doc: dict[str, Any]) -> None:
    from ..bench.report import kernel_summary

    table(["mode", "variant", "shapes", "geomean speedup", "worst", "slower (median)",
           "bitwise equal"],
          [[s["mode"], s["variant"], s["shapes"], f"{s['geomean_speedup']:.3f}x",
            f"{s['worst']['speedup']:.3f}x (b{s['worst']['batch']} ctx{s['worst']['context']})",
            s["slower_median"], "yes" if s["all_bitwise_equal"] else "NO"]
           for s in kernel_summary(doc)], title="bench kernel")


def _kernel_epilogue(doc: dict[str, Any], paths: list[Path], out_dir: Path) -> None:
    """What is not measured, where the files are, and the refusals: outputs that differ from
    stock's, a run cut short by a dead CUDA context."""
    for r in doc["meta"]["not_measured"]:
        info(f"{r['status']}: {r['label']} {r['mode']}: {r['reason']}")
    info("wrote " + ", ".join(str(p) for p in paths))
    if not all(r.get("bitwise_equal") for r in doc["results"] if r["status"] == "measured"):
        raise BenchError("some variant's outputs differ from the baseline's (see the table)",
                         "a prefetch must not change results; run `kvprefetch verify-kernel`")
    if doc["meta"]["aborted"]:
        raise BenchError(f"the run stopped early, the CUDA context died at {doc['meta']['aborted']}"
                         f" (partial results in {paths[0] if paths else out_dir})",
                         "look at that shape alone (`--batch B --context C`) with "
                         "compute-sanitizer; the shapes after it were not run")


# ----------------------------------------------------------------------------- ncu


@bench.command()
@workdir_option
@trees_option
@click.option("--shape", "shape_specs", multiple=True,
              help="BATCHxCONTEXT, repeatable [default: 1x4k, 8x16k, 64x1k].")
@click.option("--preset", default="llama-3.1-8b", show_default=True)
@click.option("--block-size", type=int, default=16, show_default=True)
@click.option("--dtype", default="float16", show_default=True)
@click.option("--kv-cache-dtype", default="auto", show_default=True)
@click.option("--force-kernel", type=click.Choice(["v1", "v2"]), default=None)
@click.option("--launch-skip", type=int, default=20, show_default=True)
@click.option("--launch-count", type=int, default=10, show_default=True)
@click.option("--ncu", "ncu_path", default="ncu", show_default=True, help="The ncu executable.")
@output_options("ncu")
@dry_run_option
@json_option
def ncu(workdir: Path, trees: tuple[str, ...], shape_specs: tuple[str, ...], preset: str,
        block_size: int, dtype: str, kv_cache_dtype: str, force_kernel: str | None,
        launch_skip: int, launch_count: int, ncu_path: str, out: Path | None, name: str,
        formats: str, dry_run: bool, as_json: bool) -> None:
    """Nsight Compute attribution (the seed's recipe: application replay, cold caches, unlocked
    clocks) for every variant on a few shapes; per-kernel deltas of time, DRAM bytes, L2 hit
    rate and long-scoreboard stalls."""
    from ..bench.matrix import shapes_from_specs
    from ..bench.ncu import NcuOptions, launches_needed, ncu_command, run_ncu_bench, target_command
    from ..kernels.ops import find_builds

    shapes = shapes_from_specs(shape_specs or ("1x4k", "8x16k", "64x1k"), preset, block_size,
                               dtype, kv_cache_dtype, force_kernel)
    opts = NcuOptions(launch_skip=launch_skip, launch_count=launch_count, ncu=ncu_path)
    fmts = _formats(formats)
    out_dir = out or workdir / "bench"
    builds = find_builds(workdir, trees or None)
    if dry_run:
        cmds = [ncu_command(target_command(sys.executable, b.so_path, b.namespace, s.to_dict(),
                                           launches_needed(s.kernel, opts)),
                            out_dir / f"ncu-{i}-{b.tree}.csv", opts)
                for i, s in enumerate(shapes, 1) for b in builds]
        if as_json:
            emit_json({"shapes": [s.to_dict() for s in shapes],
                       "variants": [b.to_dict() for b in builds], "commands": cmds})
        else:
            from ..runner import quote

            if not builds:
                info("no kernels-only builds found; commands shown per build once there are some")
            for c in cmds:
                click.echo(quote(c))
        return
    if len(builds) < 2:
        raise BenchError(f"need the baseline and a variant, found {[b.tree for b in builds]}",
                         "run `kvprefetch build --kernels-only` first")
    _require_baseline_first([b.tree for b in builds])
    from ..bench.report import write_outputs

    doc = run_ncu_bench(builds, shapes, out_dir, opts, progress=info, command=sys.argv)
    paths = write_outputs(doc, out_dir, name, fmts)
    if as_json:
        emit_json(doc)
        return
    rows = [[s["label"], v, d["kernel"], f"{d['speedup']:.3f}" if d["speedup"] else "-",
             f"{d['dram_read']['change']:.3f}" if d["dram_read"]["change"] else "-",
             f"{d['l2_hit']['change']:+.1f}" if d["l2_hit"]["change"] is not None else "-",
             f"{d['long_sb_stall']['change']:+.1f}" if d["long_sb_stall"]["change"] is not None
             else "-"]
            for s in doc["shapes"] for v, ds in s["deltas"].items() for d in ds]
    table(["shape", "variant", "kernel", "speedup", "DRAM ratio", "L2 hit Δpt", "stall Δpt"],
          rows, title="bench ncu")
    info("wrote " + ", ".join(str(p) for p in paths))


# ----------------------------------------------------------------------------- e2e


@bench.command()
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
    from ..bench.e2e import (
        E2EPlan,
        parse_env_specs,
        plan_runs,
        require_verified,
        verified_envs,
        write_model_dir,
    )
    from ..bench.matrix import parse_sizes

    report_path = verify_report or workdir / "verify" / "report.json"
    out_dir = out or workdir / "bench"
    fmts = _formats(formats)
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
        from ..bench.e2e import E2E_ENV
        from ..runner import quote

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
    from ..bench.e2e import run_e2e
    from ..bench.report import render_markdown, write_outputs

    if model_dir is None:
        write_model_dir(plan.model_dir)
    doc = run_e2e(plan, progress=info, command=sys.argv)
    paths = write_outputs(doc, out_dir, name, fmts)
    if as_json:
        emit_json(doc)
        return
    click.echo(render_markdown(doc))
    info("wrote " + ", ".join(str(p) for p in paths))


# ----------------------------------------------------------------------------- decode


@bench.command()
@workdir_option
@trees_option
@click.option("--preset", default="llama-3.1-8b", show_default=True,
              help="Model: llama-3.1-8b, qwen2.5-7b or llama-3-70b-tp8 (one GPU of 8, 8 layers).")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False,
                                                         path_type=Path), default=None,
              help="A Hugging Face config.json instead of --preset.")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="With --config: tensor-parallel ways (one GPU's heads, intermediate, vocab).")
@click.option("--layers", type=click.IntRange(min=1), default=None,
              help="Run only this many layers [default: the model's].")
@click.option("--dtype", type=click.Choice(["float16", "bfloat16"]), default=None,
              help="Weights, activations and KV cache [default: float16 for presets, the "
                   "config's torch_dtype for --config].")
@click.option("--batch", multiple=True, help="Batch sizes of the fixed points, e.g. 1,8,32,128.")
@click.option("--context", multiple=True,
              help="Context lengths of the fixed points, e.g. 1k,8k,32k (k = 1024).")
@click.option("--steps", type=click.IntRange(min=1), default=32, show_default=True,
              help="Decode steps timed per fixed point.")
@click.option("--serve", "serve_dist", type=click.Choice(["fixed", "uniform", "longtail"]),
              default=None, help="Also a continuous-batching trace with lengths from this "
              "distribution (seeded): --requests requests, at most the largest --batch at once.")
@click.option("--requests", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--prompt-len", type=click.IntRange(min=1), default=1024, show_default=True)
@click.option("--output-len", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--max-model-len", type=click.IntRange(min=16), default=36864, show_default=True,
              help="Longest sequence; block tables hold this many tokens.")
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True,
              help="Interleaved rounds per workload.")
@click.option("--eager", is_flag=True, help="Every step eager, as vLLM's enforce_eager.")
@click.option("--max-seq-len-to-capture", type=click.IntRange(min=1), default=8192,
              show_default=True, help="vLLM's knob: graphs are captured with this max_seq_len; "
              "steps holding a longer sequence run eagerly.")
@click.option("--seed", type=int, default=0, show_default=True)
@output_options("decode")
@dry_run_option
@json_option
def decode(workdir: Path, trees: tuple[str, ...], preset: str, config_path: Path | None, tp: int,
           layers: int | None, dtype: str | None, batch: tuple[str, ...],
           context: tuple[str, ...], steps: int, serve_dist: str | None, requests: int,
           prompt_len: int, output_len: int, max_model_len: int, repeats: int, eager: bool,
           max_seq_len_to_capture: int, seed: int, out: Path | None, name: str, formats: str, dry_run: bool,
           as_json: bool) -> None:
    """Whole-model decode throughput: every layer of a real model architecture at its true
    shapes (random weights, nothing downloaded) through each tree's paged attention, in ONE
    process, CUDA graphs per batch bucket as vLLM V0 captures them; fixed batch x context points
    and a continuous-batching serving trace. Reports tokens/s, step latency and attention's
    share per tree, ratios over interleaved rounds, and checks every step's logits bitwise."""
    from ..bench.decode import DecodeBenchConfig, Workload
    from ..bench.decode_model import load_config
    from ..bench.decode_model import preset as model_preset
    from ..bench.decode_serve import LengthDist
    from ..bench.matrix import parse_sizes
    from ..kernels.ops import find_builds

    model = (load_config(config_path, tp=tp, layers=layers, dtype=dtype) if config_path
             else model_preset(preset, dtype=dtype, layers=layers))
    batches = parse_sizes(batch) if batch else (1, 8, 32, 128)
    contexts = parse_sizes(context) if context else (1024, 8192, 32768)
    if max(contexts) + steps > max_model_len:
        raise click.BadParameter(f"context {max(contexts)} + {steps} steps exceeds "
                                 f"--max-model-len {max_model_len}", param_hint="--context")
    works = [Workload(batch=b, context=c, steps=steps) for b in batches for c in contexts]
    if serve_dist:
        works.append(Workload(batch=max(batches), requests=requests, dist=LengthDist(
            serve_dist, prompt_len, output_len, max_model_len, seed)))
    cfg = DecodeBenchConfig(repeats=repeats, eager=eager, max_model_len=max_model_len,
                            max_seq_len_to_capture=max_seq_len_to_capture, seed=seed)
    fmts = _formats(formats)
    out_dir = out or workdir / "bench"
    builds = find_builds(workdir, trees or None)
    plan: dict[str, Any] = {"model": model.to_dict(), "workloads": [w.to_dict() for w in works],
            "config": cfg.__dict__, "trees": [b.tree for b in builds],
            "outputs": [str(out_dir / f"{name}.{f}") for f in fmts]}
    if dry_run:
        if as_json:
            emit_json(plan)
            return
        info(f"would run {model.name} ({model.layers} layers, {model.weight_bytes() / 2**30:.1f} "
             f"GiB of weights) over {len(works)} workload(s) for "
             f"{', '.join(plan['trees']) or 'no builds found'}; outputs: "
             + ", ".join(plan["outputs"]))
        table(["workload", "steps"], [[w.label, w.steps if w.dist is None else "trace"]
                                      for w in works])
        return
    from ..bench.decode import run_decode_bench
    from ..bench.decode_report import decode_summary
    from ..bench.device import require_torch
    from ..bench.report import write_outputs
    from ..kernels.ops import load_build

    require_torch("decode")
    if not builds:
        raise BenchError(f"no kernels-only builds under {workdir / 'build'}",
                         "run `kvprefetch build --kernels-only` on this machine first")
    _require_baseline_first([b.tree for b in builds])
    doc = run_decode_bench([load_build(b) for b in builds], model, works, cfg,
                           command=sys.argv, progress=info)
    paths = write_outputs(doc, out_dir, name, fmts)
    if as_json:
        emit_json(doc)
        return
    table(["tree", "workloads", "geomean ratio", "worst", "bitwise equal"],
          [[s["tree"], s["workloads"], f"{s['geomean']:.3f}x",
            f"{s['worst'][0]:.3f}x ({s['worst'][1]})", "yes" if s["bitwise_equal"] else "NO"]
           for s in decode_summary(doc)], title="bench decode")
    info("wrote " + ", ".join(str(p) for p in paths))
    if not all(s["bitwise_equal"] for s in decode_summary(doc)):
        raise BenchError("some tree's logits differ from the baseline's (see the table)",
                         "the kernels must not change results; run `kvprefetch verify-kernel`")


def _main(argv: list[str] | None = None) -> None:
    """``python -m kvprefetch.cli.bench ...`` (the device scripts) is ``kvprefetch bench ...``:
    the same group, so the same error handling (cause + fix, the family's exit code, OSError
    mapped, no traceback) and every subcommand, all defined above this line."""
    from . import main

    main(["bench", *(sys.argv[1:] if argv is None else argv)], prog_name="kvprefetch")


if __name__ == "__main__":  # pragma: no cover - exercised by scripts/device/*.sh
    _main()
