"""What ``bench kernel`` and ``bench ncu`` run: model presets for the attention shape, and the
matrix of batch size x context length x block size x dtype x KV-cache dtype x cache mode.

The presets are real models' attention shapes, read from their Hugging Face ``config.json``
(num_attention_heads, num_key_value_heads, head_dim or hidden_size / heads, num_hidden_layers).
The kernel for each shape is vLLM's own v1/v2 choice unless ``force`` says otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..kernels.kvinputs import DTYPE_ALIASES, AttnShape, canonical_dtype
from ..kernels.ops import KV_CACHE_DTYPE_ALIASES, choose_kernel
from .schema import MatrixFields, ShapeFields


@dataclass(frozen=True)
class ModelPreset:
    name: str
    num_heads: int
    num_kv_heads: int
    head_size: int
    num_layers: int
    source: str


PRESETS: dict[str, ModelPreset] = {p.name: p for p in (
    # GQA 4:1, d=128: the shape the acceptance targets and the paper reproduction's e2e runs use.
    ModelPreset("llama-3.1-8b", 32, 8, 128, 32, "meta-llama/Llama-3.1-8B config.json"),
    # GQA 7:1, d=128 (hidden_size 3584 / 28 heads): a kv head's 7 heads run as 4 + 3 or
    # 2 + 2 + 2 + 1.
    ModelPreset("qwen2.5-7b", 28, 4, 128, 28, "Qwen/Qwen2.5-7B config.json"),
    # Llama-3-70B (64 query heads, 8 kv heads, d=128, 80 layers) at tensor-parallel 8: what one
    # GPU's attention sees, 8 query heads over 1 kv head.
    ModelPreset("llama-3-70b-tp8", 8, 1, 128, 80,
                "meta-llama/Meta-Llama-3-70B config.json, heads / 8"),
    # MHA, d=128.
    ModelPreset("llama-2-7b", 32, 32, 128, 32, "meta-llama/Llama-2-7b-hf config.json"),
    # MQA, d=256 (head_dim 256 with hidden_size 2048).
    ModelPreset("gemma-2b", 8, 1, 256, 18, "google/gemma-2b config.json"),
    # GQA 8:1, d=64 (hidden_size 2048 / 32 heads).
    ModelPreset("tinyllama-1.1b", 32, 4, 64, 22, "TinyLlama/TinyLlama-1.1B-Chat-v1.0 config.json"),
)}

DEFAULT_PRESETS = ("llama-3.1-8b",)
# A batch x context grid; a named matrix is the union of one or more of them.
Grid = tuple[tuple[int, ...], tuple[int, ...]]
DEFAULT_BATCHES = (1, 8, 32, 64, 128)
DEFAULT_CONTEXTS = (512, 1024, 4096, 16384, 32768)
# v1 steps of long context (vLLM runs v1 up to 8192 tokens once num_seqs x heads > 512): where
# a twin's shared memory grows with the context. Batch 16 runs v2 for 32 heads.
LONG_V1_GRID: Grid = ((16, 32, 64, 96, 128, 256), (6144, 8192))
NAMED_MATRICES: dict[str, tuple[Grid, ...]] = {
    "default": ((DEFAULT_BATCHES, DEFAULT_CONTEXTS), LONG_V1_GRID),
    # the target matrix: the decode shapes the acceptance numbers are quoted for.
    "issue6": (((1, 8, 32, 64, 128), (512, 1024, 4096, 16384)),),
    # the v1 steps of long context where the twins had lost before keeps_occupancy.
    "issue31": (((64,), (2048, 4096, 6000, 8192)), ((32, 128), (8192,)), ((96,), (8000,))),
}
DEFAULT_BLOCK_SIZES = (16,)
DEFAULT_DTYPES = ("float16",)
DEFAULT_KV_CACHE_DTYPES = ("auto",)
MODES = ("cold", "hot", "aliased")  # bench kernel's cache modes (kvinputs.py describes them)


MAX_SIZE = 2**31 - 1  # an int32: vLLM's seq_lens and its launchers' int arguments


def parse_size(text: str, bounded: bool = True) -> int:
    """``512`` -> 512, ``1k`` -> 1024, ``32K`` -> 32768; above MAX_SIZE refused unless not
    ``bounded`` (a caller that checks a tighter bound of its own, with its own message)."""
    m = re.fullmatch(r"\s*(\d+)\s*([kK]?)\s*", text)
    if m is None:
        raise ConfigError(f"'{text}' is not a size", "write sizes like 512, 1k or 32k")
    # a run of digits past Python's limit (4,300, or the user's PYTHONINTMAXSTRDIGITS) made
    # int() a ValueError traceback (issue 41, the thirty-seventh hostile pass): one of more
    # than 18 digits is above every bound here, read as 10**19 without int() (so that an
    # unbounded caller's own bound, slurm plan's 65535, still names it)
    digits = m.group(1).lstrip("0") or "0"  # int() counts leading zeros too
    n = 10**19 if len(digits) > 18 else int(digits) * (1024 if m.group(2) else 1)
    if n <= 0:
        raise ConfigError(f"size '{text}' must be positive", "write sizes like 512, 1k or 32k")
    if bounded and n > MAX_SIZE:
        # every size here is a batch or a length vLLM holds as a C++ int (seq_lens is int32,
        # max_seq_len an int argument): past it no call exists to plan (issue 41, eighth pass)
        raise ConfigError(f"size '{text}' is above {MAX_SIZE} (2**31 - 1), the largest "
                          "batch or length vLLM 0.10.2 holds (an int32)",
                          "write sizes like 512, 1k or 32k")
    return n


# The most shapes one bench run plans: as many as the largest --sample has steps
# (sample.MAX_SAMPLE_STEPS, "about 40 s of drawing alone"). A list of sizes, and a matrix's
# cross product, past it is refused before anything is built: `--batch 1,2,...,20000` kept a
# dry run busy for more than a minute, and a few such options (the command line takes 2 MB)
# for hours (issue 41, the twentieth hostile pass).
MAX_SHAPES = 100_000


def parse_sizes(values: Iterable[str] | str, bounded: bool = True) -> tuple[int, ...]:
    """Comma-separated and/or repeated sizes, order kept, duplicates dropped; ``bounded`` as
    ``parse_size``'s. At most ``MAX_SHAPES`` different sizes (each is one shape at least)."""
    items = [values] if isinstance(values, str) else list(values)
    out: dict[int, None] = {}  # a dict, not a list: `n not in out` of a list made this quadratic
    for item in items:
        for part in item.split(","):
            if part.strip():
                out[parse_size(part, bounded)] = None
                if len(out) > MAX_SHAPES:
                    raise ConfigError(f"more than {MAX_SHAPES} different sizes in one list: a "
                                      f"bench run plans at most {MAX_SHAPES} shapes",
                                      "pass fewer sizes, e.g. 1,8,32,64,128")
    return tuple(out)


def check_shape_count(count: int, what: str) -> None:
    """Refuse a plan of more than ``MAX_SHAPES`` shapes (``what`` names its axes), before its
    shapes are made."""
    if count > MAX_SHAPES:
        raise ConfigError(f"{what} make {count} shapes: a bench run plans at most {MAX_SHAPES}",
                          "pass fewer sizes or presets (the run times every combination)")


def format_size(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


@dataclass(frozen=True)
class BenchShape:
    """One point of the matrix: a preset's attention shape at one batch and context. A sampled
    step (``bench kernel --sample``, bench/sample.py) also carries each sequence's length
    (``seq_lens``, a ragged batch whose longest is ``attn.max_seq_len``) and its length family;
    without them every sequence has ``attn.max_seq_len`` tokens. ``attn`` and ``kernel`` are the
    step's own (its real batch and longest sequence, vLLM's choice for them); the launch vLLM
    makes of it is bench/vllm_call.py's. A sampled step also carries the ``max_model_len`` it
    was drawn for (None: the run's)."""

    preset: str
    attn: AttnShape
    kernel: str
    forced: bool = False
    seq_lens: tuple[int, ...] | None = None
    family: str = ""
    max_model_len: int | None = None

    @property
    def lens(self) -> tuple[int, ...]:
        """Every sequence's length: ``seq_lens``, or ``max_seq_len`` for each."""
        a = self.attn
        return self.seq_lens if self.seq_lens is not None else (a.max_seq_len,) * a.num_seqs

    @property
    def label(self) -> str:
        a = self.attn
        kv = "" if a.kv_cache_dtype == "auto" else f"/{a.kv_cache_dtype}"
        ctx = f"ctx{format_size(a.max_seq_len)}"
        if self.seq_lens is not None and self.family != "uniform":
            ctx = f"{self.family or 'ragged'} max{format_size(a.max_seq_len)}"
        if self.max_model_len is not None:
            ctx += f" mml{format_size(self.max_model_len)}"
        return (f"{self.preset} b{a.num_seqs} {ctx} "
                f"blk{a.block_size} {a.dtype}{kv} {self.kernel}")

    def to_dict(self) -> ShapeFields:
        a = self.attn
        d: ShapeFields = {
            "preset": self.preset, "batch": a.num_seqs, "context": a.max_seq_len,
            "num_heads": a.num_heads, "num_kv_heads": a.num_kv_heads,
            "head_size": a.head_size, "block_size": a.block_size, "dtype": a.dtype,
            "kv_cache_dtype": a.kv_cache_dtype, "kernel": self.kernel,
            "kernel_forced": self.forced}
        if self.seq_lens is not None:
            d["seq_lens"] = list(self.seq_lens)
            d["family"] = self.family
            d["mean_seq_len"] = sum(self.seq_lens) / len(self.seq_lens)
        if self.max_model_len is not None:
            d["max_model_len"] = self.max_model_len
        return d


@dataclass(frozen=True)
class BenchMatrix:
    presets: tuple[str, ...] = DEFAULT_PRESETS
    batches: tuple[int, ...] = DEFAULT_BATCHES
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    block_sizes: tuple[int, ...] = DEFAULT_BLOCK_SIZES
    dtypes: tuple[str, ...] = DEFAULT_DTYPES
    kv_cache_dtypes: tuple[str, ...] = DEFAULT_KV_CACHE_DTYPES
    force: str | None = None
    name: str = "custom"
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    # Further batch x context grids whose points join the first one's (a named matrix's union).
    extra_grids: tuple[Grid, ...] = ()

    def __post_init__(self) -> None:
        for p in self.presets:
            if p not in PRESETS:
                raise ConfigError(f"unknown model preset '{p}'",
                                  f"use one of: {', '.join(PRESETS)}")
        for b in self.block_sizes:
            if b not in (8, 16, 32):
                raise ConfigError(f"block size {b} is not instantiated by vLLM 0.10.2",
                                  "use 8, 16 or 32 (paged_attention_v1.cu L144-158)")
        for d in self.dtypes:
            if d not in DTYPE_ALIASES:
                raise ConfigError(f"unknown dtype '{d}'", "use float16, bfloat16 or float32")
        for k in self.kv_cache_dtypes:
            if k not in KV_CACHE_DTYPE_ALIASES:
                raise ConfigError(f"unknown KV-cache dtype '{k}'",
                                  f"use one of: {', '.join(KV_CACHE_DTYPE_ALIASES)}")
        if self.force not in (None, "v1", "v2"):
            raise ConfigError(f"--force-kernel must be v1 or v2, not '{self.force}'",
                              "leave it out to use vLLM's own choice")
        if not (self.presets and self.batches and self.contexts and self.block_sizes
                and self.dtypes and self.kv_cache_dtypes):
            raise ConfigError("the benchmark matrix is empty", "give at least one value per axis")

    def points(self) -> list[tuple[int, int]]:
        """(batch, context) of every grid, the first grid's first, each point once."""
        out: list[tuple[int, int]] = []
        for batches, contexts in ((self.batches, self.contexts), *self.extra_grids):
            out.extend((b, c) for b in batches for c in contexts if (b, c) not in out)
        return out

    def shapes(self) -> list[BenchShape]:
        """Every point, presets outermost, then dtype, KV dtype, block, then (batch, context)."""
        out: list[BenchShape] = []
        for name in self.presets:
            p = PRESETS[name]
            for dtype in self.dtypes:
                for kv in self.kv_cache_dtypes:
                    for block in self.block_sizes:
                        for batch, ctx in self.points():
                            attn = AttnShape(num_seqs=batch, num_heads=p.num_heads,
                                             num_kv_heads=p.num_kv_heads,
                                             head_size=p.head_size, block_size=block,
                                             max_seq_len=ctx, dtype=canonical_dtype(dtype),
                                             kv_cache_dtype=kv)
                            kernel = self.force or choose_kernel(ctx, batch, p.num_heads)
                            out.append(BenchShape(name, attn, kernel, self.force is not None))
        return out

    def to_dict(self) -> MatrixFields:
        return {"name": self.name, "presets": list(self.presets), "batches": list(self.batches),
                "contexts": list(self.contexts), "block_sizes": list(self.block_sizes),
                "dtypes": [canonical_dtype(d) for d in self.dtypes],
                "kv_cache_dtypes": list(self.kv_cache_dtypes), "force": self.force,
                "extra_grids": [[list(b), list(c)] for b, c in self.extra_grids]}


def build_matrix(presets: Sequence[str] = (), batches: Sequence[str] = (),
                 contexts: Sequence[str] = (), block_sizes: Sequence[str] = (),
                 dtypes: Sequence[str] = (), kv_cache_dtypes: Sequence[str] = (),
                 force: str | None = None, matrix: str = "default") -> BenchMatrix:
    """A matrix from CLI strings. Batch and context come from the named ``matrix`` unless given;
    every other empty axis takes its default. The name is recorded, with "+" when an axis of the
    named grid was overridden."""
    def split(values: Sequence[str]) -> tuple[str, ...]:
        return tuple(p.strip() for v in values for p in v.split(",") if p.strip())

    if matrix not in NAMED_MATRICES:
        raise ConfigError(f"unknown matrix '{matrix}'", f"use one of: {', '.join(NAMED_MATRICES)}")
    (named_batches, named_contexts), *named_extra = NAMED_MATRICES[matrix]
    overridden = bool(batches or contexts)
    m = BenchMatrix(
        presets=split(presets) or DEFAULT_PRESETS,
        batches=parse_sizes(batches) if batches else named_batches,
        contexts=parse_sizes(contexts) if contexts else named_contexts,
        block_sizes=parse_sizes(block_sizes) if block_sizes else DEFAULT_BLOCK_SIZES,
        dtypes=tuple(DTYPE_ALIASES.get(d, d) for d in split(dtypes)) or DEFAULT_DTYPES,
        kv_cache_dtypes=split(kv_cache_dtypes) or DEFAULT_KV_CACHE_DTYPES,
        force=force, name=matrix + ("+" if overridden else ""),
        # an overridden axis replaces the named matrix: its further grids go with it
        extra_grids=() if overridden else tuple(named_extra),
    )
    # every axis crossed with every other (a named matrix's further grids are a handful)
    check_shape_count(len(m.presets) * len(m.batches) * len(m.contexts) * len(m.block_sizes)
                      * len(m.dtypes) * len(m.kv_cache_dtypes),
                      "the presets, batches, contexts, block sizes, dtypes and KV cache dtypes")
    return m


def describe_grid(grid: Grid) -> str:
    """``batch 1,8 x context 512,1k``."""
    batches, contexts = grid
    return (f"batch {','.join(map(str, batches))} x context "
            f"{','.join(format_size(c) for c in contexts)}")


def describe_named_matrices() -> str:
    """``default: batch 1,8,32,64,128 x context 512,1k,4k,16k,32k + batch ...; issue6: ...``
    (CLI help)."""
    return "; ".join(f"{n}: {' + '.join(describe_grid(g) for g in grids)}"
                     for n, grids in NAMED_MATRICES.items())


def parse_shape_spec(text: str) -> tuple[int, int]:
    """``8x16k`` -> (batch 8, context 16384)."""
    batch, sep, ctx = text.lower().partition("x")
    if not sep:
        raise ConfigError(f"shape '{text}' is not BATCHxCONTEXT", "write shapes like 1x4k or 64x1k")
    return parse_size(batch), parse_size(ctx)


def shapes_from_specs(specs: Sequence[str], preset: str = "llama-3.1-8b", block_size: int = 16,
                      dtype: str = "float16", kv_cache_dtype: str = "auto",
                      force: str | None = None) -> list[BenchShape]:
    """Individual shapes (``bench ncu``) rather than a cross product."""
    check_shape_count(len(specs), "the --shape options")
    out = []
    for spec in specs:
        batch, ctx = parse_shape_spec(spec)
        m = BenchMatrix(presets=(preset,), batches=(batch,), contexts=(ctx,),
                        block_sizes=(block_size,), dtypes=(canonical_dtype(dtype),),
                        kv_cache_dtypes=(kv_cache_dtype,), force=force)
        out.extend(m.shapes())
    return out
