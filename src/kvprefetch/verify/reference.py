"""The float64 reference for one decode step, read straight from vLLM's paged layout.

For each sequence it gathers that sequence's blocks through the block table, undoes the
``[.., head_size/x, block, x]`` K layout and the ``[.., head_size, block]`` V layout, dequantises an
fp8 cache as ``fp8_value * scale`` (vLLM's ``scaled_convert``), and computes
``softmax(scale * q K^T) V`` per query head, with query head ``h`` reading kv head
``h // (num_heads / num_kv_heads)`` (attention_kernels.cuh L145-148). Works on CPU and GPU.
"""

from __future__ import annotations

from typing import Any

from ..kernels.kvinputs import fp8_torch_dtype
from ..kernels.ops import DecodeArgs


def dequantize(cache: Any, kv_cache_dtype: str, scale: Any) -> Any:
    """A cache slice as float64: plain for ``auto``, fp8 bits times the scale otherwise."""
    import torch

    if kv_cache_dtype == "auto":
        return cache.to(torch.float64)
    vals = cache.view(fp8_torch_dtype(kv_cache_dtype)).to(torch.float64)
    return vals * scale.to(torch.float64)


def gather_kv(args: DecodeArgs, seq: int, seq_len: int) -> tuple[Any, Any]:
    """Keys and values of one sequence as float64 ``[seq_len, num_kv_heads, head_size]``."""
    block_size = args.value_cache.shape[3]
    nb = -(-seq_len // block_size)
    blocks = args.block_tables[seq, :nb].long()
    k = args.key_cache[blocks]            # [nb, kvh, D/x, B, x]
    v = args.value_cache[blocks]          # [nb, kvh, D, B]
    nbk, kvh, dx, bs, x = k.shape
    k = k.permute(0, 3, 1, 2, 4).reshape(nbk * bs, kvh, dx * x)[:seq_len]
    v = v.permute(0, 3, 1, 2).reshape(nbk * bs, kvh, dx * x)[:seq_len]
    return (dequantize(k, args.kv_cache_dtype, args.k_scale),
            dequantize(v, args.kv_cache_dtype, args.v_scale))


def reference_decode(args: DecodeArgs, seq_lens: Any = None) -> Any:
    """Float64 attention output ``[num_seqs, num_heads, head_size]`` for ``args``.
    ``seq_lens`` (a list of ints) saves a device-to-host copy when the caller has it."""
    import torch

    q = args.query.to(torch.float64)
    num_seqs, num_heads, head_size = q.shape
    group = num_heads // args.num_kv_heads
    lens = list(seq_lens) if seq_lens is not None else [int(n) for n in args.seq_lens.tolist()]
    out = torch.empty((num_seqs, num_heads, head_size), dtype=torch.float64, device=q.device)
    for s, n in enumerate(lens):
        k, v = gather_kv(args, s, n)                         # [n, kvh, D]
        k = k.repeat_interleave(group, dim=1)                # [n, H, D]
        v = v.repeat_interleave(group, dim=1)
        logits = torch.einsum("hd,nhd->hn", q[s], k) * args.scale
        probs = torch.softmax(logits, dim=-1)
        out[s] = torch.einsum("hn,nhd->hd", probs, v)
    return out


def relative_error(out: Any, ref: Any) -> float:
    """``||out - ref|| / ||ref||`` in float64; NaN anywhere gives NaN (which never passes)."""
    import torch

    o = out.to(torch.float64)
    r = ref.to(torch.float64)
    denom = torch.linalg.vector_norm(r)
    num = torch.linalg.vector_norm(o - r)
    return float(num / denom) if float(denom) > 0 else float(num)


_REGISTERED: dict[str, Any] = {}


def register_reference_ops(namespace: str, transform: Any = None, dispatch_key: str = "CPU") -> Any:
    """Define ``torch.ops.<namespace>.paged_attention_v1/_v2`` with vLLM's exact schemas and a
    pure-PyTorch implementation that writes this module's reference into ``out``.

    This is the stand-in for a compiled build where none can run (no GPU): it lets the loading,
    schema check, ``forward_decode`` and the identity check run end to end on CPU. ``transform``,
    if given, is called as ``transform(out)`` after the reference is written (tests use it to
    plant a wrong element). Returns the ``torch.library.Library`` (keep it alive)."""
    import torch

    from ..kernels.ops import V1_SCHEMA, V2_SCHEMA

    if namespace in _REGISTERED:
        raise ValueError(f"namespace {namespace} is already registered in this process")
    lib = torch.library.Library(namespace, "DEF")
    lib.define(V1_SCHEMA)
    lib.define(V2_SCHEMA)

    def _compute(out: Any, query: Any, key_cache: Any, value_cache: Any, num_kv_heads: int,
                 scale: float, block_tables: Any, seq_lens: Any, max_seq_len: int,
                 kv_cache_dtype: str, k_scale: Any, v_scale: Any) -> None:
        args = DecodeArgs(query=query, key_cache=key_cache, value_cache=value_cache,
                          block_tables=block_tables, seq_lens=seq_lens, max_seq_len=max_seq_len,
                          kv_cache_dtype=kv_cache_dtype, num_kv_heads=num_kv_heads, scale=scale,
                          alibi_slopes=None, k_scale=k_scale, v_scale=v_scale)
        out.copy_(reference_decode(args).to(out.dtype))
        if transform is not None:
            transform(out)

    def v1(out: Any, query: Any, key_cache: Any, value_cache: Any, num_kv_heads: int,
           scale: float, block_tables: Any, seq_lens: Any, block_size: int, max_seq_len: int,
           alibi_slopes: Any, kv_cache_dtype: str, k_scale: Any, v_scale: Any,
           *rest: Any) -> None:
        _compute(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables,
                 seq_lens, max_seq_len, kv_cache_dtype, k_scale, v_scale)

    def v2(out: Any, exp_sums: Any, max_logits: Any, tmp_out: Any, query: Any, key_cache: Any,
           value_cache: Any, num_kv_heads: int, scale: float, block_tables: Any, seq_lens: Any,
           block_size: int, max_seq_len: int, alibi_slopes: Any, kv_cache_dtype: str,
           k_scale: Any, v_scale: Any, *rest: Any) -> None:
        _compute(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables,
                 seq_lens, max_seq_len, kv_cache_dtype, k_scale, v_scale)

    lib.impl("paged_attention_v1", v1, dispatch_key)
    lib.impl("paged_attention_v2", v2, dispatch_key)
    _REGISTERED[namespace] = lib
    return lib
