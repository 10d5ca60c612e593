"""kvprefetch.bench.limits' per-shape device-memory estimate checked against the bytes the real
allocation code (make_inputs, v2_workspace) allocates on CPU, in torch tensors. Moved from
tests/unit/test_bench_limits.py, which keeps the launch limits (the unit layer has no torch)."""

from __future__ import annotations

import pytest

from kvprefetch.bench import limits as lim
from kvprefetch.kernels.kvinputs import AttnShape, make_inputs
from kvprefetch.kernels.ops import v2_workspace


@pytest.mark.parametrize(("attn", "kernel", "layers"), [
    (AttnShape(2, 8, 2, 64, 16, 600), "v2", 2),
    (AttnShape(3, 8, 1, 128, 32, 1500, "bfloat16", "fp8"), "v2", 1),
    (AttnShape(4, 4, 4, 64, 16, 100), "v1", 3),
])
def test_memory_estimate_matches_what_is_allocated(attn: AttnShape, kernel: str,
                                                   layers: int) -> None:
    inputs = make_inputs(attn, device="cpu", layers=layers)
    need = lim.shape_memory(attn, kernel, layers=layers, launches=layers, variants=3)
    caches = sum(t.nbytes for t in inputs.key_caches + inputs.value_caches)
    assert need.caches == caches
    assert need.inputs == (inputs.query.nbytes + inputs.block_tables.nbytes
                           + inputs.seq_lens.nbytes + inputs.k_scale.nbytes
                           + inputs.v_scale.nbytes)
    assert need.outputs == 3 * layers * inputs.query.nbytes
    ws = v2_workspace(attn.num_seqs, attn.num_heads, attn.head_size, attn.max_seq_len,
                      inputs.query.dtype, "cpu")
    assert lim.v2_workspace_bytes(attn) == sum(t.nbytes for t in ws)
    assert need.workspaces == (3 * sum(t.nbytes for t in ws) if kernel == "v2" else 0)
    assert need.transient == (lim.FP8_FILL_TEMP_BYTES if attn.kv_cache_dtype != "auto" else 0)
    assert need.total == (need.caches + need.outputs + need.workspaces + need.inputs
                          + need.transient)

