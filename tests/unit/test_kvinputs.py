"""kvprefetch.kernels.kvinputs' arithmetic: the cold-mode layer count, byte counts, the aliased
pool's size and shape validation. The inputs it allocates (vLLM's paged layouts, random block
tables) and the float64 reference are torch tensors, checked in
tests/integration/test_kvinputs.py (the unit layer has no torch)."""

from __future__ import annotations

import pytest

from kvprefetch.bench.matrix import PRESETS, BenchMatrix
from kvprefetch.errors import BenchError
from kvprefetch.kernels.kvinputs import (
    AttnShape,
    alias_pool_blocks,
    cache_bytes_per_layer,
    kv_bytes_read,
    layers_for_cold,
    min_bytes_moved,
)

H200_L2_AS_TORCH_REPORTS = 60 * 1000 * 1000  # KINDS.md: "PyTorch reported ... 60 MB of L2"


def _l2_sizes() -> list[int]:
    sizes = [50 * 2**20, H200_L2_AS_TORCH_REPORTS, 40 * 2**20, 96 * 2**20]
    try:
        import torch

        if torch.cuda.is_available():
            sizes.append(int(torch.cuda.get_device_properties(0).L2_cache_size))
    except (ImportError, AttributeError):
        pass
    return sizes


@pytest.mark.parametrize("l2", _l2_sizes())
@pytest.mark.parametrize("factor", [1.0, 2.0, 4.0])
def test_cold_layers_exceed_l2_for_every_default_shape(l2: int, factor: float) -> None:
    shapes = BenchMatrix(presets=tuple(PRESETS), kv_cache_dtypes=("auto", "fp8")).shapes()
    for s in shapes:
        per_layer = kv_bytes_read(s.attn)
        n = layers_for_cold(l2, per_layer, factor)
        assert n * per_layer >= factor * l2, s.label
        # and it is the fewest that do (so cold mode does not waste memory)
        assert n == 1 or (n - 1) * per_layer < factor * l2, s.label


def test_layers_for_cold_edges() -> None:
    assert layers_for_cold(50 * 2**20, 2 * 2**20, 4.0) == 100
    assert layers_for_cold(50 * 2**20, 17 * 2**30, 4.0) == 1
    with pytest.raises(ValueError, match="must be positive"):
        layers_for_cold(0, 10)
    with pytest.raises(ValueError, match="a safety factor below 1"):
        layers_for_cold(10, 10, factor=0.5)


def test_byte_counts_for_llama_8b() -> None:
    # 32 blocks of 16 tokens x 8 kv heads x (128*16*2 B) for K and again for V.
    s = AttnShape(num_seqs=1, num_heads=32, num_kv_heads=8, head_size=128, block_size=16,
                  max_seq_len=512)
    assert s.chunk_bytes == 4096 and s.x == 8
    assert kv_bytes_read(s) == 2 * 32 * 8 * 4096
    assert min_bytes_moved(s) == kv_bytes_read(s) + 2 * 32 * 128 * 2
    assert kv_bytes_read(s, [17]) == 2 * 2 * 8 * 4096  # whole blocks are read
    fp8 = AttnShape(1, 32, 8, 128, 16, 512, "bfloat16", "fp8")
    assert fp8.x == 16 and fp8.chunk_bytes == 2048
    assert cache_bytes_per_layer(s, 2.0) == 2 * kv_bytes_read(s)


def test_alias_pool_is_the_blocks_that_fit_the_l2_fraction() -> None:
    """Aliased mode: the pool is the blocks that fit the L2 fraction, never empty, and the caches
    hold only the pool; a pool at least as large as the batch's need changes nothing. (The block
    tables that point into it are checked in tests/integration/test_kvinputs.py.)"""
    s = AttnShape(num_seqs=3, num_heads=8, num_kv_heads=2, head_size=64, block_size=16,
                  max_seq_len=1000)  # 63 blocks per sequence, 189 needed; a block = 8 KiB
    assert alias_pool_blocks(s, 2**20, 0.25) == 2**18 // (2 * 2 * 2048) == 32
    assert alias_pool_blocks(s, 2**10, 0.25) == 1  # never an empty pool
    with pytest.raises(ValueError, match="fraction in"):
        alias_pool_blocks(s, 2**20, 0.0)
    assert cache_bytes_per_layer(s, 1.0, 32) == 2 * 32 * 2 * 2048
    assert cache_bytes_per_layer(s, 1.0, 1000) == cache_bytes_per_layer(s)


def test_shape_validation() -> None:
    with pytest.raises(BenchError):
        AttnShape(1, 30, 8, 128, 16, 512)
    with pytest.raises(BenchError):
        AttnShape(1, 32, 8, 128, 16, 0)
