"""The sampled benchmark's steps (``bench kernel --sample N --sample-seed S``, issue 29): N decode
steps drawn from one documented distribution, so that no launch policy can have been tuned to
the shapes it is judged on (tune on one seed, report on a fresh one).

The distribution, version 2 (``DISTRIBUTION_VERSION``; version 1, before issue 40, had no
``max_model_len`` and drew in another order, so its seeds give other steps;
docs/sampled-benchmark.md explains the choices). Each step is drawn independently with
``random.Random(seed)``, in this order:

1. **G**, query heads per kv head: uniform over 1, 2, 4, 5, 7, 8, 16.
2. **kv heads** (one GPU's, after tensor parallelism): uniform over 1, 2, 4, 8 when G > 1; over
   8, 16, 32 when G = 1 (multi-head attention). The query heads are G x kv heads.
3. **head size**: uniform over those of 64, 128, 256 the builds instantiate;
   **block size**: uniform over those of 16, 32 instantiated with that head size;
   **cache**: uniform over fp16, bf16, fp8 (e4m3) among those instantiated with that head and
   block size; an fp8 cache's query dtype is uniform over float16 and bfloat16 where both are
   instantiated. A narrowed build therefore samples only what it has (``Instantiations``).
4. **max_model_len**: uniform over 2k, 4k, 8k, 32k, 128k tokens (``MODEL_LENS``: 2048, 4096,
   8192, 32768, 131072). It sets the step's capture length, min(8192, max_model_len)
   (bench/vllm_call.py), and the longest a sequence may be: ``top`` = min(32768,
   max_model_len).
5. **batch**: log-uniform over 1-256 (``floor(exp(U(0, ln 257)))``), so that small steps, where
   launch overhead and the L2 prefetch matter, are as well represented as large ones. 256 is
   V0's largest capture size (max_num_seqs 256), so every batch has a graph bucket; about 67%
   of the draws fall between two buckets (any batch of 5 or more that is not a multiple of 8),
   whose graph launch carries length-1 pad rows up to the bucket.
6. **length family**: uniform over
   - ``uniform``: every sequence has L tokens, L log-uniform over 16-``top``;
   - ``ragged``: each sequence's length uniform over 1..L (L as above), independently;
   - ``longtail``: a few sequences F times longer than the rest: F log-uniform over 10-100; the
     short sequences uniform over S/2..S, S log-uniform over 16..``top``/F; n_long uniform over
     1..max(1, min(4, batch // 8)) sequences of min(``top``, round(S x F)) tokens, at random
     positions in the batch (a batch of 1 is drawn as 2: a tail needs a rest).
   Every length is drawn within ``top``, so every sequence fits the step's max_model_len.
7. **memory cap**: if the step's KV bytes (K and V of every block its sequences touch, every kv
   head: ``kvinputs.kv_bytes_read``) exceed ``max_kv_bytes`` (4 GiB by default: 32 layers of it
   fill an H200), steps 5-6 are drawn again for the same model, cache and max_model_len, up to
   ``MAX_REDRAWS`` times. The sample is thus conditioned on fitting the cap; the model, cache
   and max_model_len marginals are exactly as above.

A step is the real lengths only. What the kernel is given for it (under vLLM's call: on graph
replay the padded batch and the capture length; eager the real values) is bench/vllm_call.py's
``launch_for``; the step's ``kernel`` is vLLM's choice for its real longest sequence and batch
(the eager launch's), and each result row records its launch's own.

Pure Python: no torch.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..kernels.kvinputs import AttnShape, kv_bytes_read
from ..kernels.ops import choose_kernel
from .matrix import BenchShape, format_size
from .schema import Opaque, SampleInfo

GROUP_SIZES = (1, 2, 4, 5, 7, 8, 16)
KV_HEADS_GQA = (1, 2, 4, 8)
KV_HEADS_MHA = (8, 16, 32)
HEAD_SIZES = (64, 128, 256)
BLOCK_SIZES = (16, 32)
# cache kind -> the (query dtype, kv_cache_dtype) pairs it stands for
CACHE_KINDS: dict[str, tuple[tuple[str, str], ...]] = {
    "fp16": (("float16", "auto"),),
    "bf16": (("bfloat16", "auto"),),
    "fp8": (("float16", "fp8"), ("bfloat16", "fp8")),
}
MAX_BATCH = 256
MIN_LEN = 16
MAX_LEN = 32768
FAMILIES = ("uniform", "ragged", "longtail")
TAIL_FACTOR = (10.0, 100.0)
MAX_TAIL_SEQS = 4
DEFAULT_MAX_KV_BYTES = 4 << 30
MAX_SAMPLE_STEPS = 100_000  # the largest --sample: ~40 s of drawing alone
MIN_MAX_KV_BYTES = 64 << 20
MAX_REDRAWS = 1000
MODEL_LENS = (2048, 4096, 8192, 32768, 131072)
DISTRIBUTION_VERSION = 2  # 1: before issue 40 (no max_model_len, another draw order)

Combo = tuple[int, int, str, str]  # head size, block size, query dtype, kv_cache_dtype


@dataclass(frozen=True)
class Instantiations:
    """The (head size, block size, query dtype, kv_cache_dtype) combinations every build being
    timed instantiates, within the distribution's own axes: what a sample may draw."""

    combos: frozenset[Combo]

    def __post_init__(self) -> None:
        if not self.combos:
            raise ConfigError(
                "the builds (after any --sample-* narrowing) share no instantiation the sample "
                "can draw (head size 64/128/256, block size 16/32, fp16/bf16/fp8 cache)",
                "build every tree with one of them (e.g. --head-sizes 128 --block-sizes 16 "
                "--kv-dtypes fp16), or narrow the sample to what the builds have")

    @classmethod
    def full(cls) -> Instantiations:
        return cls(frozenset((h, b, q, kv) for h in HEAD_SIZES for b in BLOCK_SIZES
                             for pairs in CACHE_KINDS.values() for q, kv in pairs))

    @classmethod
    def common_to(cls, builds: Iterable[Any]) -> Instantiations:
        """What every one of ``builds`` supports (anything with ``supports(head_size,
        block_size, kv_cache_dtype, dtype)``: ``ops.BuiltOps``, ``ops.PagedOps``)."""
        items = list(builds)
        return cls(frozenset(c for c in cls.full().combos
                             if all(b.supports(c[0], c[1], c[3], c[2]) for b in items)))

    def narrowed(self, head_sizes: Sequence[int] = (), block_sizes: Sequence[int] = (),
                 caches: Sequence[str] = ()) -> Instantiations:
        """Only the given head sizes, block sizes and cache kinds (empty: no narrowing)."""
        bad = [c for c in caches if c not in CACHE_KINDS]
        if bad:
            raise ConfigError(f"unknown cache kind(s) {', '.join(bad)} for --sample-caches",
                              f"pass a subset of {','.join(CACHE_KINDS)}")
        pairs = {p for c in caches for p in CACHE_KINDS[c]}
        return Instantiations(frozenset(
            c for c in self.combos if (not head_sizes or c[0] in head_sizes)
            and (not block_sizes or c[1] in block_sizes) and (not pairs or (c[2], c[3]) in pairs)))

    def to_dict(self) -> Opaque:
        return {"head_sizes": sorted({c[0] for c in self.combos}),
                "block_sizes": sorted({c[1] for c in self.combos}),
                "caches": sorted({cache_kind(c[3], c[2]) for c in self.combos}),
                "combos": [list(c) for c in sorted(self.combos)]}


def cache_kind(kv_cache_dtype: str, dtype: str) -> str:
    """``fp8`` for an fp8 cache, else the query dtype's short name (fp16, bf16)."""
    if kv_cache_dtype != "auto":
        return "fp8"
    return {"float16": "fp16", "bfloat16": "bf16"}.get(dtype, dtype)


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def draw_batch(rng: random.Random) -> int:
    return min(MAX_BATCH, max(1, int(_log_uniform(rng, 1, MAX_BATCH + 1))))


def draw_lengths(rng: random.Random, family: str, batch: int,
                 top: int = MAX_LEN) -> tuple[int, ...]:
    """One step's sequence lengths for ``family``, none above ``top`` (the module docstring
    gives the rules)."""
    if top < MIN_LEN:
        raise ConfigError(f"the longest sequence {top} is below {MIN_LEN} tokens",
                          f"draw with max_model_len {MIN_LEN} or more")
    if family == "uniform":
        n = round(_log_uniform(rng, MIN_LEN, top))
        return (n,) * batch
    if family == "ragged":
        most = round(_log_uniform(rng, MIN_LEN, top))
        return tuple(rng.randint(1, most) for _ in range(batch))
    if family == "longtail":
        batch = max(2, batch)
        factor = _log_uniform(rng, *TAIL_FACTOR)
        short = max(MIN_LEN, min(round(_log_uniform(rng, MIN_LEN, top / factor)),
                                 int(top / factor)))
        long = min(top, round(short * factor))
        n_long = rng.randint(1, max(1, min(MAX_TAIL_SEQS, batch // 8)))
        lens = [rng.randint(max(1, short // 2), short) for _ in range(batch - n_long)]
        lens += [long] * n_long
        rng.shuffle(lens)
        return tuple(lens)
    raise ConfigError(f"unknown length family '{family}'", f"use one of: {', '.join(FAMILIES)}")


@dataclass(frozen=True)
class SampleSpec:
    """What a sampled run draws: ``n`` steps from ``seed`` within ``instantiations``, each
    step's KV at most ``max_kv_bytes``."""

    n: int
    seed: int
    instantiations: Instantiations
    max_kv_bytes: int = DEFAULT_MAX_KV_BYTES

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ConfigError(f"--sample {self.n}: a sample needs at least one step",
                              "pass --sample N with N >= 1 (issue 29's target runs 200)")
        if self.n > MAX_SAMPLE_STEPS:
            # drawing alone takes about 0.4 ms a step: 10^23 steps hung even a dry run (issue
            # 41, the fourth hostile pass)
            raise ConfigError(f"--sample {self.n}: more than {MAX_SAMPLE_STEPS} steps, which "
                              "would take longer to draw and time than any run can",
                              f"pass --sample N with N <= {MAX_SAMPLE_STEPS} (issue 29's target "
                              "runs 200)")
        if self.max_kv_bytes < MIN_MAX_KV_BYTES:
            raise ConfigError(f"--sample-max-kv {self.max_kv_bytes} B is below "
                              f"{MIN_MAX_KV_BYTES >> 20} MiB: the largest model shapes would "
                              "have almost no step to draw",
                              "pass --sample-max-kv 64m or more (default 4g)")

    def to_dict(self) -> SampleInfo:
        return {"n": self.n, "seed": self.seed, "max_kv_bytes": self.max_kv_bytes,
                "instantiations": self.instantiations.to_dict(),
                "distribution": {"group_sizes": list(GROUP_SIZES),
                                 "kv_heads_gqa": list(KV_HEADS_GQA),
                                 "kv_heads_mha": list(KV_HEADS_MHA), "max_batch": MAX_BATCH,
                                 "lengths": [MIN_LEN, MAX_LEN], "families": list(FAMILIES),
                                 "tail_factor": list(TAIL_FACTOR),
                                 "model_lens": list(MODEL_LENS),
                                 "version": DISTRIBUTION_VERSION,
                                 "doc": "kvprefetch/bench/sample.py, docs/sampled-benchmark.md"}}


def step_preset(group: int, kv_heads: int, head_size: int) -> str:
    """The synthetic model name a step's label starts with: ``G7/kv4/d128``."""
    return f"G{group}/kv{kv_heads}/d{head_size}"


def draw_step(rng: random.Random, inst: Instantiations, max_kv_bytes: int) -> BenchShape:
    group = rng.choice(GROUP_SIZES)
    kv_heads = rng.choice(KV_HEADS_MHA if group == 1 else KV_HEADS_GQA)
    combos = inst.combos
    head = rng.choice(sorted({c[0] for c in combos}))
    block = rng.choice(sorted({c[1] for c in combos if c[0] == head}))
    kinds = sorted({cache_kind(c[3], c[2]) for c in combos if c[:2] == (head, block)})
    kind = rng.choice(kinds)
    dtype, kv = rng.choice([p for p in CACHE_KINDS[kind] if (head, block, *p) in combos])
    model_len = rng.choice(MODEL_LENS)
    for _ in range(MAX_REDRAWS):
        batch = draw_batch(rng)
        family = rng.choice(FAMILIES)
        lens = draw_lengths(rng, family, batch, min(MAX_LEN, model_len))
        attn = AttnShape(num_seqs=len(lens), num_heads=group * kv_heads, num_kv_heads=kv_heads,
                         head_size=head, block_size=block, max_seq_len=max(lens), dtype=dtype,
                         kv_cache_dtype=kv)
        if kv_bytes_read(attn, lens) <= max_kv_bytes:
            kernel = choose_kernel(attn.max_seq_len, attn.num_seqs, attn.num_heads)
            return BenchShape(step_preset(group, kv_heads, head), attn, kernel,
                              seq_lens=lens, family=family, max_model_len=model_len)
    raise ConfigError(f"no step of G{group} kv{kv_heads} d{head} fits --sample-max-kv "
                      f"{max_kv_bytes} B after {MAX_REDRAWS} draws",
                      "raise --sample-max-kv")  # pragma: no cover - prevented by SampleSpec


def draw_sample(spec: SampleSpec) -> list[BenchShape]:
    """The ``spec.n`` steps of ``spec.seed``: the same list for the same spec, every time."""
    rng = random.Random(spec.seed)
    return [draw_step(rng, spec.instantiations, spec.max_kv_bytes) for _ in range(spec.n)]


def describe_step(shape: BenchShape) -> str:
    """``G7/kv4/d128 b37 ragged (mean 2.1k, max 8k) blk16 bfloat16/fp8 v2 mml32k`` (the step's
    own kernel, vLLM's for its real values)."""
    a = shape.attn
    lens = shape.seq_lens or (a.max_seq_len,) * a.num_seqs
    mean = sum(lens) / len(lens)
    kv = "" if a.kv_cache_dtype == "auto" else f"/{a.kv_cache_dtype}"
    return (f"{shape.preset} b{a.num_seqs} {shape.family or 'uniform'} (mean "
            f"{format_size(round(mean))}, max {format_size(a.max_seq_len)}) blk{a.block_size} "
            f"{a.dtype}{kv} {shape.kernel}"
            + (f" mml{format_size(shape.max_model_len)}" if shape.max_model_len else ""))


MAX_BYTES = 1 << 50


def parse_bytes(text: str, option: str | None = None) -> int:
    """``4g`` -> 4 GiB, ``512m`` -> 512 MiB, ``1073741824`` -> that many bytes; ``option``
    (the flag it came from) names it in a refusal."""
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    num, unit = (t[:-1], t[-1]) if t and t[-1] in "kmg" else (t, "")
    try:
        value = float(num) * units[unit]
    except ValueError:
        raise ConfigError(f"'{text}' is not a size in bytes",
                          "write it like 4g, 512m or 1073741824") from None
    if not math.isfinite(value) or value > MAX_BYTES:
        # nan, inf and 1e999 (inf) made int() raise; nothing the kit sizes is a pebibyte
        raise ConfigError(f"{option or 'size'} '{text}' is not a finite size of at most 1 PiB",
                          "write it like 4g, 512m or 1073741824")
    if value <= 0:
        raise ConfigError(f"size '{text}' must be positive", "write it like 4g or 512m")
    return int(value)
