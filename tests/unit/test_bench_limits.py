"""kvprefetch.bench.limits: vLLM 0.10.2's launch limits and the per-shape device-memory estimate.
The limits are checked against numbers worked out from the launcher sources; the estimate
against the bytes the real allocation code (make_inputs, v2_workspace) allocates on CPU in
tests/integration/test_bench_limits.py (it needs torch, which the unit layer does not have)."""

from __future__ import annotations

import pytest

from kvprefetch.bench import limits as lim
from kvprefetch.bench.matrix import NAMED_MATRICES, build_matrix
from kvprefetch.kernels.kvinputs import AttnShape

H200_SMEM_OPTIN = 232448  # cudaDevAttrMaxSharedMemoryPerBlockOptin on sm_90


def _llama(batch: int, ctx: int) -> AttnShape:
    return AttnShape(num_seqs=batch, num_heads=32, num_kv_heads=8, head_size=128, block_size=16,
                     max_seq_len=ctx)


@pytest.mark.parametrize("name", list(NAMED_MATRICES))
def test_named_matrices_are_within_vllm_limits(name: str) -> None:
    for s in build_matrix(matrix=name).shapes():
        assert lim.vllm_kernel_limit(s.attn, s.kernel, H200_SMEM_OPTIN) == "", s.label


def test_v1_shared_memory_limit() -> None:
    # padded_max_seq_len * 4 B: 32k -> 128 KiB fits 227 KiB; 64k -> 256 KiB does not.
    assert lim.v1_shared_memory_bytes(_llama(1, 32768)) == 131072
    assert lim.vllm_kernel_limit(_llama(1, 32768), "v1", H200_SMEM_OPTIN) == ""
    reason = lim.vllm_kernel_limit(_llama(1, 65536), "v1", H200_SMEM_OPTIN)
    assert reason.startswith(lim.VLLM_LIMIT_PREFIX + ": ") and "262144 B" in reason
    # v2 uses one partition's logits (512 floats) whatever the context.
    assert lim.vllm_kernel_limit(_llama(1, 65536), "v2", H200_SMEM_OPTIN) == ""
    # a device without the opt-in (48 KiB) cannot run v1 at 16k (64 KiB)
    assert "shared memory" in lim.vllm_kernel_limit(_llama(1, 16384), "v1", 49152)
    # tiny contexts: the outputs buffer (NUM_WARPS/2 * head_size floats) dominates
    assert lim.v1_shared_memory_bytes(_llama(1, 16)) == 2 * 128 * 4


def test_grid_and_int32_limits() -> None:
    assert "gridDim.y" in lim.vllm_kernel_limit(_llama(65536, 16), "v1", H200_SMEM_OPTIN)
    big = AttnShape(num_seqs=1024, num_heads=128, num_kv_heads=8, head_size=256, block_size=16,
                    max_seq_len=131072)  # tmp_out: 1024 * 128 * 256 partitions * 256 > 2**31
    reason = lim.vllm_kernel_limit(big, "v2", H200_SMEM_OPTIN)
    assert "tmp_out index" in reason and str(1024 * 128 * 256 * 256) in reason
    # the KV cache itself may exceed 2**31 elements: vLLM widens the block number to int64.
    huge_cache = _llama(128, 65536)  # K alone: 524288 blocks * 16384 elements = 2**33
    assert lim.vllm_kernel_limit(huge_cache, "v2", H200_SMEM_OPTIN) == ""


def test_crashed_shape_sizes() -> None:
    """The sizes of the shape that crashed on the H200 (llama-3.1-8b b32 ctx32k, v2, cold: one
    layer) and of the ones after it: the v2 tmp_out of b32 ctx32k is the first at or above the
    caching allocator's 10 MiB 'own segment' size, so it was the first a freed workspace of
    which was unmapped by the next capture."""
    need = lim.shape_memory(_llama(32, 32768), "v2", layers=1, launches=1, variants=3)
    assert need.caches == 4 * 2**30                          # K 2 GiB + V 2 GiB
    assert lim.v2_workspace_bytes(_llama(32, 32768)) == 16 * 2**20 + 2 * 256 * 2**10
    assert lim.v2_workspace_bytes(_llama(32, 16384)) < 10 * 2**20 < 16 * 2**20
    assert lim.v2_workspace_bytes(_llama(128, 32768)) == 64 * 2**20 + 2 * 2**20


def test_memory_refusal() -> None:
    need = lim.MemoryNeed(caches=8 * 2**30, outputs=2**20, workspaces=0, inputs=0, transient=0)
    assert lim.memory_refusal(need, free_bytes=10 * 2**30, fraction=0.85) == ""
    reason = lim.memory_refusal(need, free_bytes=9 * 2**30, fraction=0.85)
    assert "8.00 GiB of device memory" in reason and "9.00 GiB free" in reason
    assert "85%" in reason
