"""The cache geometry and its page arithmetic: pure functions, no CUDA.

Two layouts (vAttention §5 and its "MegaCache"/tensor-slicing alternative):

- ``per-layer``: one K and one V tensor per layer, each ``[B_max, S_max, H, D]``. A *page group*
  is one page at the same offset in each of the ``2·L`` tensors, so growing a slot by one group
  maps ``2·L`` pages and adds ``page // (H·D·bytes)`` tokens (1024 for Llama-3-8B, 2 MB pages).
- ``tensor-slicing``: one K and one V tensor ``[B_max, S_max, L, H, D]``; layer ``l`` is the strided
  view ``[:, :, l]``. A group is 2 pages and adds ``page // (L·H·D·bytes)`` tokens (32 for Llama).

Every slot owns a fixed, page-aligned stretch of each tensor (``slot_bytes``, ``S_max`` tokens
rounded up to whole pages), so slot ``b``'s ``g``-th group lives at byte offset
``b·slot_bytes + g·page`` in every tensor. A slot's mapped groups are always a prefix
``[0, mapped)``: mapping grows it at the end, reclaiming shrinks it from the end. The batch stride
of the exposed tensors is therefore ``slot_bytes`` (equal to ``S_max·token`` when that is
page-aligned, as for every Llama shape with ``S_max`` a multiple of 1024)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .errors import VmmUsageError

DTYPE_BYTES: dict[str, int] = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "uint8": 1,
    "int8": 1,
}


class Layout(str, Enum):
    PER_LAYER = "per-layer"
    TENSOR_SLICING = "tensor-slicing"


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


@dataclass(frozen=True)
class KVCacheSpec:
    """What the caller asks for (vAttention's ``init_kvcache`` arguments)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_batch: int
    max_context: int
    dtype: str = "float16"
    layout: Layout = Layout.PER_LAYER

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "max_batch", "max_context"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise VmmUsageError(f"{name} must be a positive integer, got {value!r}",
                                    f"pass a positive {name}")
        if self.dtype not in DTYPE_BYTES:
            raise VmmUsageError(f"unsupported KV dtype {self.dtype!r}",
                                f"use one of {', '.join(sorted(DTYPE_BYTES))}")
        try:
            object.__setattr__(self, "layout", Layout(self.layout))
        except ValueError:
            raise VmmUsageError(f"unknown layout {self.layout!r}",
                                f"use one of {', '.join(x.value for x in Layout)}") from None

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class CacheGeometry:
    """Everything derived from a spec and the page size. All sizes in bytes unless named
    ``*_elems``."""

    spec: KVCacheSpec
    page_size: int
    token_bytes: int          # bytes one token occupies in one tensor
    n_tensors: int            # 2·L (per-layer) or 2 (tensor slicing)
    slot_bytes: int           # per-slot stretch of one tensor, page-aligned
    pages_per_slot: int
    tensor_bytes: int         # one tensor's virtual size = B_max · slot_bytes
    shape: tuple[int, ...]
    strides_elems: tuple[int, ...]

    @property
    def group_bytes(self) -> int:
        """Physical bytes one page group commits (one page in each tensor)."""
        return self.n_tensors * self.page_size

    @property
    def va_bytes(self) -> int:
        return self.n_tensors * self.tensor_bytes

    @property
    def contiguous(self) -> bool:
        """True when the batch stride equals ``S_max`` tokens (no padding between slots)."""
        return self.slot_bytes == self.spec.max_context * self.token_bytes

    def tensor_index(self, kv: int, layer: int = 0) -> int:
        """Index of a tensor in reservation order: all K tensors, then all V tensors."""
        if kv not in (0, 1):
            raise VmmUsageError(f"kv must be 0 (K) or 1 (V), got {kv}", "pass 0 or 1")
        if self.spec.layout is Layout.TENSOR_SLICING:
            return kv
        check_layer(self, layer)
        return kv * self.spec.num_layers + layer

    def groups_for_tokens(self, tokens: int) -> int:
        """Page groups a slot needs to hold ``tokens`` tokens (the last token's last byte)."""
        check_context(self, tokens)
        return ceil_div(tokens * self.token_bytes, self.page_size)

    def tokens_in_groups(self, groups: int) -> int:
        """How many whole tokens ``groups`` mapped groups hold, capped at ``S_max``."""
        return min(self.spec.max_context, groups * self.page_size // self.token_bytes)

    def group_offset(self, slot: int, group: int) -> int:
        """Byte offset of a slot's group inside each tensor."""
        if not 0 <= group < self.pages_per_slot:
            raise VmmUsageError(f"group {group} is outside slot's {self.pages_per_slot} pages",
                                "this is a bug in the caller of group_offset")
        return slot * self.slot_bytes + group * self.page_size

    def run_span(self, slot: int, first: int, stop: int) -> tuple[int, int]:
        """(offset, size) of groups ``[first, stop)`` of one slot: one contiguous range per
        tensor, which is what a batched ``cuMemSetAccess`` covers."""
        return self.group_offset(slot, first), (stop - first) * self.page_size


def check_layer(geom: CacheGeometry, layer: int) -> None:
    if not 0 <= layer < geom.spec.num_layers:
        raise VmmUsageError(f"layer {layer} does not exist (the cache has "
                            f"{geom.spec.num_layers} layers)",
                            f"pass a layer in 0..{geom.spec.num_layers - 1}")


def check_context(geom: CacheGeometry, tokens: int) -> None:
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise VmmUsageError(f"a sequence length must be a non-negative integer, got {tokens!r}",
                            "pass the number of tokens the slot holds after this step")
    if tokens > geom.spec.max_context:
        raise VmmUsageError(
            f"context of {tokens} tokens is beyond the cache's S_max={geom.spec.max_context}",
            "preempt or truncate that request, or init the cache with a larger max_context",
        )


def make_geometry(spec: KVCacheSpec, granularity: int, page_size: int | None = None
                  ) -> CacheGeometry:
    """Derive the geometry. ``granularity`` is what ``cuMemGetAllocationGranularity`` reported;
    ``page_size`` defaults to it and must be a multiple of it."""
    if granularity <= 0:
        raise VmmUsageError(f"allocation granularity must be positive, got {granularity}",
                            "query it with cuMemGetAllocationGranularity")
    page = granularity if page_size is None else page_size
    if page <= 0 or page % granularity:
        raise VmmUsageError(
            f"page size {page} B is not a positive multiple of the driver's allocation "
            f"granularity {granularity} B",
            f"pass page_size=None (uses {granularity} B) or a multiple of it; 64 KB pages need "
            "vAttention's modified driver and are out of scope",
        )
    s = spec
    b = s.dtype_bytes
    if s.layout is Layout.PER_LAYER:
        token_bytes = s.num_kv_heads * s.head_dim * b
        n_tensors = 2 * s.num_layers
    else:
        token_bytes = s.num_layers * s.num_kv_heads * s.head_dim * b
        n_tensors = 2
    slot_bytes = round_up(s.max_context * token_bytes, page)
    slot_elems = slot_bytes // b
    if s.layout is Layout.PER_LAYER:
        shape: tuple[int, ...] = (s.max_batch, s.max_context, s.num_kv_heads, s.head_dim)
        strides: tuple[int, ...] = (slot_elems, s.num_kv_heads * s.head_dim, s.head_dim, 1)
    else:
        shape = (s.max_batch, s.max_context, s.num_layers, s.num_kv_heads, s.head_dim)
        strides = (slot_elems, s.num_layers * s.num_kv_heads * s.head_dim,
                   s.num_kv_heads * s.head_dim, s.head_dim, 1)
    return CacheGeometry(
        spec=s, page_size=page, token_bytes=token_bytes, n_tensors=n_tensors,
        slot_bytes=slot_bytes, pages_per_slot=slot_bytes // page,
        tensor_bytes=s.max_batch * slot_bytes, shape=shape, strides_elems=strides,
    )
