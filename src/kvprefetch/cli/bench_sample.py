"""``bench kernel``'s sampled-benchmark and timing options (issue 29): ``--sample N
--sample-seed S`` draws the steps from bench/sample.py's distribution instead of a matrix, within
what every build being timed instantiates; ``--timing graph,eager`` times them under CUDA-graph
replay, back-to-back eager calls, or both. Kept apart from cli/bench.py so that the kernel
command only wires them in. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
        click.option("--timing", "timing_text", default="graph", show_default=True,
                     metavar="LIST",
                     help="graph (CUDA-graph replay), eager (back-to-back calls, the host path "
                          "included) or graph,eager."),
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
