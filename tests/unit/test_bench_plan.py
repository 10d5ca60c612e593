"""The library side of ``bench kernel`` and ``bench decode``: the frozen options, their checks
and the plans made of them (bench/kernel_plan.py, bench/decode_plan.py, bench/plan.py). Pure:
no click runner, no builds on disk (``builds=()``), no torch. The command lines over them are in
tests/unit/test_bench_cli.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from kvprefetch.bench.decode_plan import DecodeBenchOptions, plan_decode_bench
from kvprefetch.bench.kernel_plan import (
    DEFAULT_MATRIX,
    KernelBenchOptions,
    LaunchOptions,
    SampleOptions,
    parse_timings,
    plan_kernel_bench,
)
from kvprefetch.bench.matrix import build_matrix
from kvprefetch.bench.plan import parse_formats, require_baseline_first, require_builds
from kvprefetch.bench.vllm_call import VllmCall
from kvprefetch.cli.bench import bench
from kvprefetch.errors import BenchError, ConfigError, OptionError


def _kernel(tmp_path: Path, **kw: object) -> KernelBenchOptions:
    return KernelBenchOptions(workdir=tmp_path, **kw)  # type: ignore[arg-type]


def test_kernel_options_are_frozen(tmp_path: Path) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        _kernel(tmp_path).rounds = 3  # type: ignore[misc]


def test_kernel_defaults_plan_the_default_matrix_cold(tmp_path: Path) -> None:
    plan = plan_kernel_bench(_kernel(tmp_path), builds=())
    assert plan.sample is None and plan.matrix == build_matrix()
    assert [c.mode for c in plan.configs] == ["cold"]
    assert [c.timing for c in plan.configs] == ["graph"]
    assert plan.runs == len(build_matrix().shapes())
    assert plan.formats == ("json", "md", "png")
    assert plan.outputs == [str(tmp_path / "bench" / f"kernel.{f}") for f in plan.formats]
    doc = plan.to_dict()
    assert list(doc) == ["matrix", "sample", "modes", "timings", "call", "rounds", "shapes",
                         "variants", "outputs", "shape_list"]
    assert doc["variants"] == [] and doc["shapes"] == plan.runs


def test_kernel_options_reach_the_configs(tmp_path: Path) -> None:
    call = VllmCall(call="exact")
    plan = plan_kernel_bench(_kernel(
        tmp_path, batch=("1,8",), context=("1k",), modes=("cold", "hot"), rounds=5,
        sample_ms=2.0, max_layers=64, launch=LaunchOptions(timings=("graph", "eager"), call=call),
        out=tmp_path / "o", name="n", formats="json"), builds=())
    assert plan.runs == 2 * 4
    assert [(c.mode, c.timing) for c in plan.configs] == [
        ("cold", "graph"), ("cold", "eager"), ("hot", "graph"), ("hot", "eager")]
    assert {(c.rounds, c.target_sample_ms, c.max_layers, c.call) for c in plan.configs} == {
        (5, 2.0, 64, call)}
    assert plan.outputs == [str(tmp_path / "o" / "n.json")]


def test_a_sample_replaces_the_matrix_and_refuses_matrix_options(tmp_path: Path) -> None:
    plan = plan_kernel_bench(_kernel(tmp_path, sample=SampleOptions(n=5, seed=3)), builds=())
    assert plan.sample is not None and plan.sample.seed == 3 and len(plan.shapes) == 5
    assert plan.to_dict()["matrix"] is None
    # --matrix counts as given even at its default's value: None is "not given"
    with pytest.raises(ConfigError, match="so --matrix, --batch, --force-kernel cannot be given"):
        plan_kernel_bench(_kernel(tmp_path, sample=SampleOptions(n=5), matrix="default",
                                  batch=("1",), force_kernel="v1"), builds=())
    with pytest.raises(ConfigError, match="--max-model-len cannot be given"):
        plan_kernel_bench(_kernel(tmp_path, sample=SampleOptions(n=5), launch=LaunchOptions(
            call=VllmCall(max_model_len=4096))), builds=())


def test_sample_narrowing_needs_a_sample(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--sample-seed, --sample-caches only apply") as exc:
        plan_kernel_bench(_kernel(tmp_path, sample=SampleOptions(seed=1, caches="fp8")),
                          builds=())
    assert exc.value.fix == "add --sample N (e.g. --sample 200)"
    with pytest.raises(ConfigError, match="not a comma-separated list of integers"):
        plan_kernel_bench(_kernel(tmp_path, sample=SampleOptions(n=5, head_sizes="a")),
                          builds=())


def test_kernel_refusals_keep_their_families(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="alias_l2_fraction"):
        plan_kernel_bench(_kernel(tmp_path, modes=("aliased",), alias_l2_fraction=0.0),
                          builds=())
    with pytest.raises(ConfigError):
        plan_kernel_bench(_kernel(tmp_path, batch=("1m",)), builds=())
    with pytest.raises(OptionError) as exc:
        plan_kernel_bench(_kernel(tmp_path, formats="json,pdf"), builds=())
    assert exc.value.option == "--formats" and exc.value.exit_code == 2
    assert exc.value.cause == "unknown format(s) pdf; use json, md, png"


def test_parsers() -> None:
    assert parse_timings("eager, graph,eager") == ("eager", "graph")
    for bad in ("", "graph,foo"):
        with pytest.raises(ConfigError, match="--timing"):
            parse_timings(bad)
    assert parse_formats(" md,json ") == ("md", "json")
    for empty in ("", ",,,", " , "):  # a run that would write nothing
        with pytest.raises(OptionError, match="names no format"):
            parse_formats(empty)


def test_build_refusals() -> None:
    with pytest.raises(BenchError, match="no kernels-only builds under w/build"):
        require_builds([], Path("w"))
    require_baseline_first(["baseline", "patched"])
    with pytest.raises(BenchError, match=r"not among \['patched'\]"):
        require_baseline_first(["patched"])


def test_decode_defaults_and_the_serving_trace(tmp_path: Path) -> None:
    plan = plan_decode_bench(DecodeBenchOptions(workdir=tmp_path), builds=())
    assert plan.model.name == "llama-3.1-8b" and len(plan.workloads) == 4 * 3
    assert plan.config.max_model_len == 36864 and plan.config.repeats == 5
    assert list(plan.to_dict()) == ["model", "workloads", "config", "trees", "outputs"]
    plan = plan_decode_bench(DecodeBenchOptions(workdir=tmp_path, batch=("1,4",), context=("1k",),
                                                serve="longtail", requests=10), builds=())
    assert [w.label for w in plan.workloads][:2] == ["b1 x 1k", "b4 x 1k"]
    trace = plan.workloads[-1]
    assert trace.dist is not None and trace.batch == 4 and trace.requests == 10


@pytest.mark.parametrize(("field", "option", "value"), [
    ("requests", "--requests", 10**23), ("requests", "--requests", 1_000_001),
    ("repeats", "--repeats", 1001), ("steps", "--steps", (1 << 20) + 1),
    ("repeats", "--repeats", 0)])
def test_decode_counts_past_their_range_name_the_option(tmp_path: Path, field: str,
                                                        option: str, value: int) -> None:
    """--requests, --steps and --repeats had no ceiling: a dry run planned 10**23 requests
    (issue 41, the seventeenth hostile pass). The plan and the command line refuse them."""
    options = DecodeBenchOptions(workdir=tmp_path, serve="uniform", max_model_len=1 << 22,
                                 **{field: value})
    with pytest.raises(OptionError, match="not a whole number") as caught:
        plan_decode_bench(options, builds=())
    assert caught.value.option == option
    res = CliRunner().invoke(bench, ["decode", "--dry-run", "--workdir", str(tmp_path),
                                     option, str(value)])
    assert res.exit_code == 2 and option in res.output, res.output


def test_decode_context_past_max_model_len_names_the_option(tmp_path: Path) -> None:
    with pytest.raises(OptionError) as exc:
        plan_decode_bench(DecodeBenchOptions(workdir=tmp_path, context=("64k",)), builds=())
    assert exc.value.option == "--context"
    assert exc.value.cause == "context 65536 + 32 steps exceeds --max-model-len 36864"
    with pytest.raises(ConfigError, match="unknown decode preset"):
        plan_decode_bench(DecodeBenchOptions(workdir=tmp_path, preset="nope"), builds=())


@pytest.mark.parametrize(("command", "options"), [("kernel", KernelBenchOptions),
                                                  ("decode", DecodeBenchOptions)])
def test_the_command_line_shows_the_librarys_defaults(command: str, options: type) -> None:
    """Every option that is a field of the options shows the field's default on the command
    line (one source of truth: the library's). ``--matrix`` shows the matrix that None means."""
    fields = {f.name: f.default for f in dataclasses.fields(options)
              if f.default is not dataclasses.MISSING}
    if options is KernelBenchOptions:
        fields["matrix"] = DEFAULT_MATRIX
    cmd = bench.commands[command]
    shared = [p for p in cmd.params if isinstance(p, click.Option) and p.name in fields
              and not p.multiple and not p.is_flag and p.default is not None]
    assert len(shared) >= 6
    for p in shared:
        assert p.default == fields[p.name], p.name
