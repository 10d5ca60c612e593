"""``bench kernel``'s sampled-benchmark and launch options. ``--sample N --sample-seed S``
(issue 29) draws the steps from bench/sample.py's distribution instead of a matrix, within what
every build being timed instantiates. ``launch_options`` (issue 40) turns ``--timing
graph,eager``, ``--call vllm|exact``, ``--max-model-len``, ``--max-seq-len-to-capture`` and
``--eager`` into one frozen ``LaunchOptions``: how each step is timed and what vLLM's call makes
of it (bench/vllm_call.py). Kept apart from cli/bench.py so that the kernel command only wires
them in. Nothing here imports torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from ..errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])

# Options that choose a matrix's shapes; a sample draws its own.
MATRIX_OPTIONS = {"preset": "--preset", "matrix_name": "--matrix", "batch": "--batch",
                  "context": "--context", "block_size": "--block-size", "dtype": "--dtype",
                  "kv_cache_dtype": "--kv-cache-dtype", "force_kernel": "--force-kernel"}


def sample_options(f: F) -> F:
    for deco in reversed((
        click.option("--sample", "sample_n", type=int, default=None, metavar="N",
                     help="Draw N decode steps from the sampled benchmark's distribution "
                          "(docs/sampled-benchmark.md) instead of a matrix, within what every "
                          "build being timed instantiates."),
        click.option("--sample-seed", type=int, default=None, metavar="S",
                     help="The sample's seed [default 0]: the same seed and builds draw the "
                          "same steps. Tune on one seed, report on a fresh one."),
        click.option("--sample-max-kv", default="4g", show_default=True, metavar="SIZE",
                     help="Largest KV per step (per layer), e.g. 4g or 512m; larger draws are "
                          "drawn again."),
        click.option("--sample-head-sizes", default="", metavar="LIST",
                     help="Narrow the sample to these head sizes (of 64,128,256) [default: all "
                          "the builds have]."),
        click.option("--sample-block-sizes", default="", metavar="LIST",
                     help="Narrow the sample to these block sizes (of 16,32)."),
        click.option("--sample-caches", default="", metavar="LIST",
                     help="Narrow the sample to these caches (of fp16,bf16,fp8)."),
        click.option("--max-layers", type=click.IntRange(min=1), default=2048,
                     show_default=True,
                     help="Cold mode: most layers' caches rotated; a smaller step needing more "
                          "to exceed the L2 is skipped."),
        click.option("--time-limit", type=float, default=0.0, show_default=True,
                     metavar="SECONDS",
                     help="Start no shape after this many seconds (0: no limit); the rest are "
                          "recorded as not run."),
    )):
        f = deco(f)
    return f


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """How ``bench kernel`` times each step (``timings``) and the call that makes the step a
    launch (``call``, a ``vllm_call.VllmCall``)."""

    timings: tuple[str, ...]
    call: Any

    def to_dict(self) -> dict[str, Any]:
        return {"timings": list(self.timings), "call": self.call.to_dict()}


def launch_options(f: F) -> F:
    """The launch options as one ``launch: LaunchOptions`` argument of the command."""
    @functools.wraps(f)
    def wrapper(*args: Any, timing_text: str, call_name: str, max_model_len: int | None,
                max_seq_len_to_capture: int, eager: bool, **kwargs: Any) -> Any:
        from ..bench.vllm_call import VllmCall

        kwargs["launch"] = LaunchOptions(
            timings=parse_timings(timing_text),
            call=VllmCall(call=call_name, max_model_len=max_model_len,
                          max_seq_len_to_capture=max_seq_len_to_capture,
                          enforce_eager=eager))
        return f(*args, **kwargs)

    out: Any = wrapper
    for deco in reversed((
        click.option("--timing", "timing_text", default="graph", show_default=True,
                     metavar="LIST",
                     help="graph (CUDA graphs on, as vLLM runs by default: each step is timed "
                          "the way vLLM runs it, replayed or, where vLLM runs it eagerly, "
                          "eagerly), eager (back-to-back calls of every step, the host path "
                          "included, as --enforce-eager) or graph,eager."),
        click.option("--call", "call_name", type=click.Choice(["vllm", "exact"]),
                     default="vllm", show_default=True,
                     help="vllm: what vLLM 0.10.2 V0 passes the kernel (graph steps padded to "
                          "their capture size with length-1 rows, max_seq_len = the capture "
                          "length, the captured block-table width); exact: every step at its "
                          "real max_seq_len and batch (research only)."),
        click.option("--max-model-len", type=click.IntRange(min=16), default=None,
                     metavar="N",
                     help="The model's max_model_len: capture length = min(8192, N) [default: "
                          "the model's, 8192 or more]; a sample draws its own per step."),
        click.option("--max-seq-len-to-capture", type=click.IntRange(min=1), default=8192,
                     show_default=True, metavar="N",
                     help="vLLM's knob: graphs are captured with this max_seq_len; steps "
                          "holding a longer sequence run eagerly."),
        click.option("--eager", is_flag=True,
                     help="vLLM's enforce_eager: every step eager, at its real values."),
    )):
        out = deco(out)
    return out  # type: ignore[no-any-return]


def check_sample_call(spec: Any, launch: LaunchOptions) -> None:
    """A sample draws max_model_len per step; a fixed one is refused beside it."""
    if spec is not None and launch.call.max_model_len is not None:
        raise ConfigError("--sample draws max_model_len per step (2k-128k), so --max-model-len "
                          "cannot be given with it",
                          "drop --max-model-len, or time a matrix with it")


def parse_timings(text: str) -> tuple[str, ...]:
    from ..bench.kernel import TIMINGS

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
    """Refuse matrix options next to ``--sample`` (``given``: the parameter names the user set)."""
    clash = [MATRIX_OPTIONS[g] for g in given if g in MATRIX_OPTIONS]
    if clash:
        raise ConfigError(f"--sample draws its own shapes, so {', '.join(clash)} cannot be "
                          "given with it",
                          "drop them, or narrow the sample with --sample-head-sizes, "
                          "--sample-block-sizes and --sample-caches")


def resolve_sample(n: int | None, seed: int | None, max_kv: str, head_sizes: str,
                   block_sizes: str, caches: str, builds: Sequence[Any],
                   given: Sequence[str]) -> Any:
    """The ``SampleSpec`` the options ask for (None without ``--sample``), within what every one
    of ``builds`` instantiates (the full distribution when there are none, e.g. a dry run on a
    machine without builds)."""
    from ..bench.sample import Instantiations, SampleSpec, parse_bytes

    if n is None:
        narrowing = [o for o, v in (("--sample-seed", seed), ("--sample-head-sizes", head_sizes),
                                    ("--sample-block-sizes", block_sizes),
                                    ("--sample-caches", caches)) if v not in (None, "")]
        if narrowing:
            raise ConfigError(f"{', '.join(narrowing)} only apply to a sampled run",
                              "add --sample N (e.g. --sample 200)")
        return None
    sample_conflicts(given)
    inst = Instantiations.common_to(builds) if builds else Instantiations.full()
    inst = inst.narrowed(_ints(head_sizes, "--sample-head-sizes"),
                         _ints(block_sizes, "--sample-block-sizes"),
                         tuple(c.strip() for c in caches.split(",") if c.strip()))
    return SampleSpec(n=n, seed=0 if seed is None else seed, instantiations=inst,
                      max_kv_bytes=parse_bytes(max_kv))


def given_parameters(names: Sequence[str]) -> list[str]:
    """Those of ``names`` the user set on the command line (not their defaults)."""
    ctx = click.get_current_context()
    return [n for n in names
            if ctx.get_parameter_source(n) not in (None, click.core.ParameterSource.DEFAULT)]
