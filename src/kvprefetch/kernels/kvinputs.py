"""Random decode inputs in vLLM 0.10.2's paged layouts, for the identity check and the benchmarks.

Layouts (attention_kernels.cuh L92-95, paged_attn.py ``split_kv_cache``), x = 16 / sizeof(cache_t):
- K: ``[num_blocks, num_kv_heads, head_size // x, block_size, x]``
- V: ``[num_blocks, num_kv_heads, head_size, block_size]``
An fp8 KV cache is stored as uint8 (e4m3 or e5m2 bits) and dequantised with the float32
``k_scale`` / ``v_scale`` tensors, as vLLM's ``scaled_convert`` does.

Block tables are drawn without replacement from a pool of physical blocks, like vLLM's block
allocator hands out blocks; padding entries are 0, as V0's ``make_tensor_with_pad`` writes.

Three cache modes for timing:
- cold: ``layers_for_cold`` layers' caches, rotated, so the bytes read between two visits of one
  layer exceed the L2 by a safety factor, like a real decode step through a model's layers;
- hot: one layer read again and again (an upper bound on what L2 residency gives, where one
  layer's KV fits the L2);
- aliased: one layer whose block tables point into a pool of physical blocks that fits a
  fraction of the L2 (``alias_pool_blocks``), so the kernel runs its exact instruction stream
  over the same number of blocks with every KV load an L2 hit, at any batch and context. The
  data differ from cold's (sequences share blocks), so only the timing is comparable.

torch is imported inside functions only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import BenchError
from .ops import KV_CACHE_DTYPE_ALIASES, DecodeArgs

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
DTYPE_ALIASES = {"fp16": "float16", "half": "float16", "float16": "float16",
                 "bf16": "bfloat16", "bfloat16": "bfloat16",
                 "fp32": "float32", "float": "float32", "float32": "float32"}


def canonical_dtype(name: str) -> str:
    try:
        return DTYPE_ALIASES[name]
    except KeyError:
        raise BenchError(f"unsupported dtype '{name}'",
                         "use float16 (fp16), bfloat16 (bf16) or float32") from None


@dataclass(frozen=True)
class AttnShape:
    """One decode attention problem: the shapes and dtypes vLLM would pass."""

    num_seqs: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int
    max_seq_len: int
    dtype: str = "float16"
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise BenchError(f"{self.num_heads} query heads are not a multiple of "
                             f"{self.num_kv_heads} kv heads", "fix the model preset")
        if self.max_seq_len < 1 or self.num_seqs < 1:
            raise BenchError("a decode needs at least one sequence of at least one token",
                             "use positive batch and context sizes")

    @property
    def cache_elem_bytes(self) -> int:
        return 1 if self.kv_cache_dtype != "auto" else DTYPE_BYTES[self.dtype]

    @property
    def x(self) -> int:
        return 16 // self.cache_elem_bytes

    @property
    def blocks_per_seq(self) -> int:
        return -(-self.max_seq_len // self.block_size)

    @property
    def chunk_bytes(self) -> int:
        """One (block, kv head) slab of K (or of V): HEAD_SIZE * BLOCK_SIZE * sizeof(cache_t)."""
        return self.head_size * self.block_size * self.cache_elem_bytes


def kv_bytes_read(shape: AttnShape, seq_lens: Sequence[int] | None = None) -> int:
    """KV bytes one decode launch must read: K and V of every block a sequence touches (the
    kernel loads whole blocks), for every kv head."""
    lens = list(seq_lens) if seq_lens is not None else [shape.max_seq_len] * shape.num_seqs
    blocks = sum(-(-n // shape.block_size) for n in lens)
    return 2 * blocks * shape.num_kv_heads * shape.chunk_bytes


def min_bytes_moved(shape: AttnShape, seq_lens: Sequence[int] | None = None) -> int:
    """The fewest bytes a launch moves through memory: the KV read, the query read and the output
    written (block tables and v2's scratch are ignored). Used for achieved bandwidth."""
    qo = 2 * shape.num_seqs * shape.num_heads * shape.head_size * DTYPE_BYTES[shape.dtype]
    return kv_bytes_read(shape, seq_lens) + qo


def layers_for_cold(l2_bytes: int, bytes_per_layer: int, factor: float = 4.0) -> int:
    """How many distinct layers' caches to rotate so that the bytes read between two visits of a
    layer are at least ``factor`` times the L2: ``ceil(factor * l2 / bytes_per_layer)``, and at
    least 1 (a single layer already ``factor`` times the L2 is cold on its own)."""
    if l2_bytes <= 0 or bytes_per_layer <= 0:
        raise ValueError("l2_bytes and bytes_per_layer must be positive")
    if factor < 1.0:
        raise ValueError("a safety factor below 1 would leave the working set inside L2")
    return max(1, math.ceil(factor * l2_bytes / bytes_per_layer))


def torch_dtype(name: str) -> Any:
    import torch

    return {"float16": torch.float16, "bfloat16": torch.bfloat16,
            "float32": torch.float32}[canonical_dtype(name)]


def fp8_torch_dtype(kv_cache_dtype: str) -> Any:
    import torch

    kind = KV_CACHE_DTYPE_ALIASES[kv_cache_dtype]
    return {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[kind]


@dataclass(frozen=True)
class DecodeInputs:
    """A set of tensors for one decode call, plus the extra layers' caches for cold mode."""

    shape: AttnShape
    query: Any
    key_caches: tuple[Any, ...]  # one per layer
    value_caches: tuple[Any, ...]
    block_tables: Any
    seq_lens: Any
    seq_lens_list: tuple[int, ...]
    k_scale: Any
    v_scale: Any
    scale: float
    num_blocks: int

    @property
    def layers(self) -> int:
        return len(self.key_caches)

    def args(self, layer: int = 0) -> DecodeArgs:
        return DecodeArgs(
            query=self.query, key_cache=self.key_caches[layer],
            value_cache=self.value_caches[layer], block_tables=self.block_tables,
            seq_lens=self.seq_lens, max_seq_len=self.shape.max_seq_len,
            kv_cache_dtype=self.shape.kv_cache_dtype, num_kv_heads=self.shape.num_kv_heads,
            scale=self.scale, alibi_slopes=None, k_scale=self.k_scale, v_scale=self.v_scale,
        )


def _fill_cache(t: Any, shape: AttnShape, scale: float, gen: Any) -> None:
    """Fill one cache tensor with N(0,1)-ish values; for fp8, quantise value/scale to fp8 bits."""
    import torch

    if shape.kv_cache_dtype == "auto":
        t.normal_(generator=gen)
        return
    flat = t.view(-1)
    step = 1 << 26  # quantise in chunks to bound the float32 temporary
    for s in range(0, flat.numel(), step):
        part = flat[s:s + step]
        tmp = torch.empty(part.shape, dtype=torch.float32, device=t.device).normal_(generator=gen)
        part.copy_((tmp / scale).to(fp8_torch_dtype(shape.kv_cache_dtype)).view(torch.uint8))


def alias_pool_blocks(shape: AttnShape, l2_bytes: int, fraction: float = 0.25) -> int:
    """How many physical blocks (K and V, every kv head) fit in ``fraction`` of the L2: the pool
    the aliased mode's block tables point into (at least 1)."""
    if l2_bytes <= 0 or not 0.0 < fraction <= 1.0:
        raise ValueError("l2_bytes must be positive and fraction in (0, 1]")
    return max(1, int(fraction * l2_bytes) // (2 * shape.num_kv_heads * shape.chunk_bytes))


def pool_blocks(needed: int, pool_factor: float = 1.0, alias_blocks: int = 0) -> int:
    """Physical blocks in one layer's pool: ``ceil(needed * pool_factor)`` (at least ``needed``),
    or ``alias_blocks`` when that is positive and fewer than ``needed`` (the aliased mode)."""
    if 0 < alias_blocks < needed:
        return alias_blocks
    return max(needed, math.ceil(needed * pool_factor))


def check_seq_lens(shape: AttnShape, seq_lens: Sequence[int],
                   pad_rows: int = 0) -> tuple[int, ...]:
    """``seq_lens`` as a tuple after checking it against ``shape``: one length per sequence,
    each at least 1, the longest at most ``max_seq_len`` (equal to it in vLLM's eager call; a
    graph replay passes the capture length, bench/vllm_call.py), the last ``pad_rows`` of
    length 1 (a CUDA-graph bucket's padding)."""
    lens = tuple(int(n) for n in seq_lens)
    if (len(lens) != shape.num_seqs or min(lens) < 1 or max(lens) > shape.max_seq_len
            or not 0 <= pad_rows < shape.num_seqs
            or any(n != 1 for n in lens[len(lens) - pad_rows:])):
        raise BenchError(f"sequence lengths (n={len(lens)}, min {min(lens, default=0)}, max "
                         f"{max(lens, default=0)}, {pad_rows} pad rows) do not fit a batch of "
                         f"{shape.num_seqs} with max_seq_len {shape.max_seq_len}",
                         "give one length >= 1 per sequence, the longest at most max_seq_len, "
                         "pad rows of length 1 last")
    return lens


def make_inputs(shape: AttnShape, *, device: Any = "cuda", seed: int = 0, layers: int = 1,
                ragged: bool = False, pool_factor: float = 1.0,
                alias_blocks: int = 0, seq_lens: Sequence[int] | None = None,
                pad_rows: int = 0) -> DecodeInputs:
    """Fresh random inputs. ``seq_lens`` gives each sequence's length (a ragged batch, e.g. one
    step of ``bench kernel --sample``; its last ``pad_rows`` are a CUDA-graph bucket's padding
    rows, of length 1 with a block-table row of zeros: they read block 0, a real block, as vLLM
    0.10.2's pad rows do, and own no block of the pool); else ``ragged`` draws each length in
    ``[1, max_seq_len]`` (the first sequence always has ``max_seq_len``); otherwise every
    sequence has ``max_seq_len``.
    The pool holds ``ceil(needed * pool_factor)`` blocks; the block table is a random draw
    without replacement from it. ``alias_blocks`` > 0 caps the pool at that many blocks: the
    table is then a sequence of random permutations of the pool (every block referenced equally
    often, blocks shared between and within sequences)."""
    import torch

    if layers < 1:
        raise ValueError("layers must be >= 1")
    if pool_factor < 1.0:
        raise ValueError("pool_factor must be >= 1 (every sequence needs its own blocks)")
    if alias_blocks < 0:
        raise ValueError("alias_blocks must be >= 0 (0 = no aliasing)")
    dev = torch.device(device)
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    cpu_gen = torch.Generator()
    cpu_gen.manual_seed(seed)
    dt = torch_dtype(shape.dtype)
    nb_seq = shape.blocks_per_seq
    if seq_lens is not None:
        lens = torch.tensor(check_seq_lens(shape, seq_lens, pad_rows), dtype=torch.int64)
    elif ragged:
        lens = torch.randint(1, shape.max_seq_len + 1, (shape.num_seqs,), generator=cpu_gen)
        lens[0] = shape.max_seq_len
    else:
        lens = torch.full((shape.num_seqs,), shape.max_seq_len, dtype=torch.int64)
    lens_list = tuple(int(n) for n in lens.tolist())
    real = lens_list[:len(lens_list) - pad_rows] if seq_lens is not None else lens_list
    needed = sum(-(-n // shape.block_size) for n in real)
    num_blocks = pool_blocks(needed, pool_factor, alias_blocks)
    if num_blocks < needed:  # aliased: back-to-back permutations of the pool
        rounds = -(-needed // num_blocks)
        perm = torch.cat([torch.randperm(num_blocks, generator=cpu_gen)
                          for _ in range(rounds)])[:needed]
    else:
        perm = torch.randperm(num_blocks, generator=cpu_gen)[:needed]
    table = torch.zeros((shape.num_seqs, nb_seq), dtype=torch.int32)
    at = 0
    for i, n in enumerate(real):  # pad rows keep their row of zeros
        nb = -(-n // shape.block_size)
        table[i, :nb] = perm[at:at + nb].to(torch.int32)
        at += nb
    cache_dt = dt if shape.kv_cache_dtype == "auto" else torch.uint8
    if shape.kv_cache_dtype == "auto":
        k_scale_v, v_scale_v = 1.0, 1.0
    else:
        # Scales far from 1 so that a kernel ignoring them is caught by the reference check.
        k_scale_v = float(torch.empty(1).uniform_(0.25, 0.5, generator=cpu_gen))
        v_scale_v = float(torch.empty(1).uniform_(2.0, 4.0, generator=cpu_gen))
    x = shape.x
    k_shape = (num_blocks, shape.num_kv_heads, shape.head_size // x, shape.block_size, x)
    v_shape = (num_blocks, shape.num_kv_heads, shape.head_size, shape.block_size)
    keys, values = [], []
    for _ in range(layers):
        k = torch.empty(k_shape, dtype=cache_dt, device=dev)
        v = torch.empty(v_shape, dtype=cache_dt, device=dev)
        _fill_cache(k, shape, k_scale_v, gen)
        _fill_cache(v, shape, v_scale_v, gen)
        keys.append(k)
        values.append(v)
    query = torch.empty((shape.num_seqs, shape.num_heads, shape.head_size), dtype=dt, device=dev)
    query.normal_(generator=gen)
    return DecodeInputs(
        shape=shape, query=query, key_caches=tuple(keys), value_caches=tuple(values),
        block_tables=table.to(dev), seq_lens=lens.to(torch.int32).to(dev),
        seq_lens_list=lens_list,
        k_scale=torch.tensor(k_scale_v, dtype=torch.float32, device=dev),
        v_scale=torch.tensor(v_scale_v, dtype=torch.float32, device=dev),
        scale=1.0 / math.sqrt(shape.head_size), num_blocks=num_blocks,
    )


def cache_bytes_per_layer(shape: AttnShape, pool_factor: float = 1.0,
                          alias_blocks: int = 0, seq_lens: Sequence[int] | None = None) -> int:
    """Bytes of K plus V allocated for one layer (``make_inputs``'s pool, ``alias_blocks``
    included): for ``seq_lens`` when given, else with every sequence at ``max_seq_len``."""
    needed = (sum(-(-n // shape.block_size) for n in seq_lens) if seq_lens is not None
              else shape.num_seqs * shape.blocks_per_seq)
    blocks = pool_blocks(needed, pool_factor, alias_blocks)
    return 2 * blocks * shape.num_kv_heads * shape.chunk_bytes


