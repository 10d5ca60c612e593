"""kvprefetch.kernels.kvinputs and kvprefetch.verify.reference in torch tensors: vLLM's paged
layouts and random block tables as make_inputs allocates them on CPU, the aliased mode's tables,
and the float64 reference (checked against attention computed from contiguous K/V that this test
scatters into the paged layout itself). Moved from tests/unit/test_kvinputs.py, which keeps the
shapes' arithmetic (the unit layer has no torch)."""

from __future__ import annotations

import math

import pytest

from kvprefetch.kernels.kvinputs import AttnShape, alias_pool_blocks, make_inputs


@pytest.mark.parametrize("kv", ["auto", "fp8", "fp8_e5m2"])
def test_make_inputs_layouts_and_block_tables(kv: str) -> None:
    import torch

    s = AttnShape(num_seqs=5, num_heads=8, num_kv_heads=2, head_size=64, block_size=16,
                  max_seq_len=300, dtype="bfloat16", kv_cache_dtype=kv)
    inp = make_inputs(s, device="cpu", seed=7, layers=3, ragged=True, pool_factor=2.0)
    x = 8 if kv == "auto" else 16
    assert inp.layers == 3
    for k, v in zip(inp.key_caches, inp.value_caches, strict=True):
        assert tuple(k.shape) == (inp.num_blocks, 2, 64 // x, 16, x)
        assert tuple(v.shape) == (inp.num_blocks, 2, 64, 16)
        assert k.dtype == (torch.bfloat16 if kv == "auto" else torch.uint8)
        assert k.stride(0) == 2 * 64 * 16 and k.stride(1) == 64 * 16  # kv_block/head strides
    assert inp.seq_lens.dtype == torch.int32 and inp.block_tables.dtype == torch.int32
    lens = inp.seq_lens_list
    assert lens[0] == 300 and all(1 <= n <= 300 for n in lens)
    assert tuple(inp.block_tables.shape) == (5, math.ceil(300 / 16))
    used = []
    for i, n in enumerate(lens):
        nb = -(-n // 16)
        used += inp.block_tables[i, :nb].tolist()
        assert inp.block_tables[i, nb:].eq(0).all()  # V0 pads with block 0
    assert len(set(used)) == len(used)  # drawn without replacement
    assert all(0 <= b < inp.num_blocks for b in used)
    assert inp.num_blocks == 2 * len(used)
    if kv != "auto":
        assert float(inp.k_scale) != 1.0 and float(inp.v_scale) != 1.0
        assert inp.k_scale.dtype == torch.float32
    # Different layers hold different data; the same seed gives the same inputs.
    assert not torch.equal(inp.key_caches[0], inp.key_caches[1])
    again = make_inputs(s, device="cpu", seed=7, layers=3, ragged=True, pool_factor=2.0)
    assert torch.equal(again.block_tables, inp.block_tables)
    assert torch.equal(again.key_caches[2], inp.key_caches[2])


def test_aliased_tables_point_into_a_pool_that_fits_the_l2() -> None:
    """Aliased mode: the pool is the blocks that fit the L2 fraction; the table references every
    pool block equally often (permutations of the pool back to back), and the caches hold only
    the pool. A pool at least as large as the batch's need changes nothing."""
    import collections

    s = AttnShape(num_seqs=3, num_heads=8, num_kv_heads=2, head_size=64, block_size=16,
                  max_seq_len=1000)  # 63 blocks per sequence, 189 needed; a block = 8 KiB
    assert alias_pool_blocks(s, 2**20, 0.25) == 32  # the pool's size: tests/unit/test_kvinputs.py
    inp = make_inputs(s, device="cpu", seed=3, alias_blocks=32)
    assert inp.num_blocks == 32 and inp.key_caches[0].shape[0] == 32
    counts = collections.Counter(inp.block_tables.flatten().tolist())
    assert set(counts) == set(range(32))
    assert max(counts.values()) - min(counts.values()) <= 1  # 189 = 5 x 32 + 29
    first = inp.block_tables.flatten()[:32].tolist()
    assert sorted(first) == list(range(32))  # one whole permutation before any repeat
    same = make_inputs(s, device="cpu", seed=3, alias_blocks=1000)
    plain = make_inputs(s, device="cpu", seed=3)
    assert same.num_blocks == plain.num_blocks == 189
    assert same.block_tables.equal(plain.block_tables)
    with pytest.raises(ValueError, match="alias_blocks must be >= 0"):
        make_inputs(s, device="cpu", alias_blocks=-1)


def _scatter(k_seq, v_seq, blocks, key_cache, value_cache, x: int) -> None:
    """Write contiguous [n, kvh, D] keys/values into the paged layout, token by token."""
    bs = value_cache.shape[3]
    for t in range(k_seq.shape[0]):
        blk, off = int(blocks[t // bs]), t % bs
        for h in range(k_seq.shape[1]):
            for d in range(k_seq.shape[2]):
                key_cache[blk, h, d // x, off, d % x] = k_seq[t, h, d]
                value_cache[blk, h, d, off] = v_seq[t, h, d]


@pytest.mark.parametrize(("kv", "group"), [("auto", 2), ("fp8", 4), ("fp8_e5m2", 1)])
def test_reference_matches_attention_on_contiguous_kv(kv: str, group: int) -> None:
    import torch

    from kvprefetch.kernels.kvinputs import fp8_torch_dtype
    from kvprefetch.verify.reference import reference_decode

    kvh, d, bs = 2, 16, 8
    s = AttnShape(num_seqs=2, num_heads=kvh * group, num_kv_heads=kvh, head_size=d,
                  block_size=bs, max_seq_len=21, dtype="float32", kv_cache_dtype=kv)
    inp = make_inputs(s, device="cpu", seed=11, ragged=True)
    g = torch.Generator().manual_seed(5)
    key_cache = torch.zeros_like(inp.key_caches[0])
    value_cache = torch.zeros_like(inp.value_caches[0])
    contiguous = []
    for i, n in enumerate(inp.seq_lens_list):
        k = torch.randn(n, kvh, d, generator=g)
        v = torch.randn(n, kvh, d, generator=g)
        if kv != "auto":  # store fp8 bits; the true values are bits * scale
            kq = (k / inp.k_scale).to(fp8_torch_dtype(kv))
            vq = (v / inp.v_scale).to(fp8_torch_dtype(kv))
            k = kq.double() * inp.k_scale.double()
            v = vq.double() * inp.v_scale.double()
            _scatter(kq.view(torch.uint8), vq.view(torch.uint8), inp.block_tables[i], key_cache,
                     value_cache, s.x)
        else:
            _scatter(k, v, inp.block_tables[i], key_cache, value_cache, s.x)
        contiguous.append((k.double(), v.double()))
    args = inp.args()
    args = type(args)(**{**args.__dict__, "key_cache": key_cache, "value_cache": value_cache})
    ref = reference_decode(args)
    q = inp.query.double()
    for i, (k, v) in enumerate(contiguous):
        for h in range(s.num_heads):
            kh, vh = k[:, h // group], v[:, h // group]
            w = torch.softmax(kh @ q[i, h] * inp.scale, dim=0)
            assert torch.allclose(ref[i, h], w @ vh, rtol=1e-10, atol=1e-12)


def test_relative_error_and_nan() -> None:
    import torch

    from kvprefetch.verify.reference import relative_error

    ref = torch.ones(10, dtype=torch.float64)
    assert relative_error(ref, ref) == 0.0
    assert relative_error(ref * 1.01, ref) == pytest.approx(0.01)
    bad = ref.clone()
    bad[3] = float("nan")
    assert math.isnan(relative_error(bad, ref))

