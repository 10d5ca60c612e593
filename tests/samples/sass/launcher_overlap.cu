// A launcher shaped like the patched paged_attention_v1.cu: it keeps the join that
// launch_l2_prefetch returns alive until after its own launch. tests/test_sass.py compiles it
// and reads which CUDA runtime calls the object needs.
#define KVPREFETCH_LAUNCHER_ONLY 1
#include <cstdint>
#include "kvprefetch/launcher_prefetch.cuh"

__global__ void attention_stand_in(float* out) { out[threadIdx.x] = 0.f; }

void launcher(cudaStream_t stream, const uint16_t* k_cache, const uint16_t* v_cache,
              const int* block_tables, const int* seq_lens, float* out) {
  const auto kvprefetch_l2 = kvprefetch::launch_l2_prefetch<uint16_t, 16>(
      stream, k_cache, v_cache, block_tables, seq_lens, /*num_seqs=*/1, /*num_kv_heads=*/8,
      /*head_size=*/128, /*max_num_blocks_per_seq=*/32, /*max_seq_len=*/512,
      /*kv_block_stride=*/8 * 128 * 16, /*kv_head_stride=*/128 * 16);
  attention_stand_in<<<1, 32, 0, stream>>>(out);
}
