"""What ``bench kernel`` checks before it allocates anything for a shape: the launch limits of
vLLM 0.10.2's own paged-attention launchers, and the device memory the shape will take.

A shape that fails either check is *skipped* with a recorded reason, never launched:
- a launch vLLM itself cannot make (``vllm_kernel_limit``) would fail or corrupt memory in the
  stock build as much as in ours, so it says nothing about the patch;
- a shape that does not fit in free device memory (``memory_refusal``) would die of OOM halfway
  through its allocations.

The limits, read from csrc/attention/paged_attention_v1.cu / _v2.cu and attention_kernels.cuh:
- grid ``(num_heads, num_seqs, partitions)``: gridDim.y and gridDim.z are at most 65535;
- v1's dynamic shared memory is ``max(padded_max_seq_len, NUM_WARPS/2 * head_size) * 4`` bytes
  and must fit the device's opt-in maximum per block (227 KiB on H100/H200);
- ``int`` index arithmetic in the kernels: ``seq_idx * max_num_blocks_per_seq`` (block table),
  ``seq_idx * num_heads * max_num_partitions * HEAD_SIZE`` (v2 tmp_out) and
  ``seq_idx * q_stride`` (query) must stay below 2**31. The KV-cache offsets are int64
  (``physical_block_number`` is widened before the multiply), so a cache over 2**31 elements is
  fine.

Pure Python: no torch import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..kernels.kvinputs import DTYPE_BYTES, AttnShape, cache_bytes_per_layer
from ..kernels.ops import PARTITION_SIZE, num_partitions

VLLM_LIMIT_PREFIX = "exceeds vLLM 0.10.2 kernel limit"
MAX_GRID_YZ = 65535
INT32_MAX = 2**31 - 1
NUM_THREADS = 128  # the launchers' default; NUM_WARPS = 4
# make_inputs quantises an fp8 cache in chunks of 2**26 float32 values (kvinputs._fill_cache).
FP8_FILL_TEMP_BYTES = (1 << 26) * 4


def v1_shared_memory_bytes(attn: AttnShape) -> int:
    """paged_attention_v1_launcher's ``shared_mem_size``."""
    padded = -(-attn.max_seq_len // attn.block_size) * attn.block_size
    return max(padded * 4, (NUM_THREADS // 32 // 2) * attn.head_size * 4)


def v2_shared_memory_bytes(attn: AttnShape) -> int:
    """paged_attention_v2_launcher's ``shared_mem_size`` (the main kernel's)."""
    return max(PARTITION_SIZE * 4, (NUM_THREADS // 32 // 2) * attn.head_size * 4)


def vllm_kernel_limit(attn: AttnShape, kernel: str, smem_optin_bytes: int) -> str:
    """"" when vLLM 0.10.2's launcher can run this shape, else why not (the reason starts with
    ``VLLM_LIMIT_PREFIX``). ``smem_optin_bytes`` is the device's opt-in shared memory per block
    (torch: ``shared_memory_per_block_optin``)."""
    parts = num_partitions(attn.max_seq_len) if kernel == "v2" else 1
    problems = []
    if attn.num_seqs > MAX_GRID_YZ:
        problems.append(f"{attn.num_seqs} sequences > gridDim.y max {MAX_GRID_YZ}")
    if parts > MAX_GRID_YZ:
        problems.append(f"{parts} partitions > gridDim.z max {MAX_GRID_YZ}")
    smem = v1_shared_memory_bytes(attn) if kernel == "v1" else v2_shared_memory_bytes(attn)
    if smem > smem_optin_bytes:
        problems.append(f"{kernel} needs {smem} B of shared memory per block, the device allows "
                        f"{smem_optin_bytes} B")
    int_products = {
        "block table index num_seqs * max_num_blocks_per_seq": attn.num_seqs * attn.blocks_per_seq,
        "query index num_seqs * num_heads * head_size":
            attn.num_seqs * attn.num_heads * attn.head_size,
    }
    if kernel == "v2":
        int_products["tmp_out index num_seqs * num_heads * partitions * head_size"] = (
            attn.num_seqs * attn.num_heads * parts * attn.head_size)
    for what, n in int_products.items():
        if n > INT32_MAX:
            problems.append(f"int32 {what} = {n} > {INT32_MAX}")
    return f"{VLLM_LIMIT_PREFIX}: " + "; ".join(problems) if problems else ""


@dataclass(frozen=True)
class MemoryNeed:
    """Device bytes ``bench_shape`` allocates for one shape, all variants together."""

    caches: int       # K and V of every rotated layer
    outputs: int      # one output per decode call in a graph, per variant
    workspaces: int   # v2's tmp_out, exp_sums, max_logits, per variant
    inputs: int       # query, block table, seq lens, scales
    transient: int    # freed again before timing (fp8 quantisation temporary)

    @property
    def total(self) -> int:
        return self.caches + self.outputs + self.workspaces + self.inputs + self.transient


def v2_workspace_bytes(attn: AttnShape) -> int:
    """Bytes of ``ops.v2_workspace``: tmp_output in the query dtype, exp_sums and max_logits in
    float32, each ``[num_seqs, num_heads, partitions(, head_size)]``."""
    rows = attn.num_seqs * attn.num_heads * num_partitions(attn.max_seq_len)
    return rows * attn.head_size * DTYPE_BYTES[attn.dtype] + 2 * rows * 4


def shape_memory(attn: AttnShape, kernel: str, layers: int, launches: int, variants: int,
                 pool_factor: float = 1.0, alias_blocks: int = 0,
                 seq_lens: Sequence[int] | None = None) -> MemoryNeed:
    """``seq_lens``: a ragged batch's lengths (its pool holds only the blocks they need)."""
    q = attn.num_seqs * attn.num_heads * attn.head_size * DTYPE_BYTES[attn.dtype]
    return MemoryNeed(
        caches=layers * cache_bytes_per_layer(attn, pool_factor, alias_blocks, seq_lens),
        outputs=variants * launches * q,
        workspaces=variants * v2_workspace_bytes(attn) if kernel == "v2" else 0,
        inputs=q + attn.num_seqs * attn.blocks_per_seq * 4 + attn.num_seqs * 4 + 8,
        transient=FP8_FILL_TEMP_BYTES if attn.kv_cache_dtype != "auto" else 0,
    )


def memory_refusal(need: MemoryNeed, free_bytes: int, fraction: float) -> str:
    """"" when ``need`` fits in ``fraction`` of the free device memory, else the skip reason."""
    if need.total <= fraction * free_bytes:
        return ""
    gib = 2**30
    return (f"needs {need.total / gib:.2f} GiB of device memory (KV caches "
            f"{need.caches / gib:.2f} GiB, outputs {need.outputs / 2**20:.1f} MiB, v2 workspaces "
            f"{need.workspaces / 2**20:.1f} MiB), {free_bytes / gib:.2f} GiB free; the bench uses "
            f"at most {fraction:.0%} of it")
