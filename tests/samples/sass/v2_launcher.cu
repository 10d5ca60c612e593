// A launcher shaped like the `prefetch` variant's patched paged_attention_v2.cu (its unit keeps
// the prologue's state): before_launch, then the launcher's L2 prefetch kernel.
// tests/test_sass.py compiles it and lists the kv_l2_prefetch_kernel instantiations in the
// device code.
#include <cstdint>
#include "kvprefetch/prefetch.cuh"

__global__ void attention_stand_in(float* out) { out[threadIdx.x] = 0.f; }

template <typename CACHE_T, int BLOCK_SIZE, bool FP16_OR_BF16_CACHE>
void launcher(cudaStream_t stream, const CACHE_T* k_cache, const CACHE_T* v_cache,
              const int* block_tables, const int* seq_lens, int head_size, float* out) {
  kvprefetch::before_launch(stream, k_cache, v_cache);
  const auto kvprefetch_l2 = kvprefetch::launch_l2_prefetch_v2<CACHE_T, BLOCK_SIZE>(
      FP16_OR_BF16_CACHE, stream, k_cache, v_cache, block_tables, seq_lens, /*num_seqs=*/1,
      /*num_kv_heads=*/8, head_size, /*max_num_blocks_per_seq=*/256, /*max_seq_len=*/4096,
      /*kv_block_stride=*/8 * head_size * BLOCK_SIZE, /*kv_head_stride=*/head_size * BLOCK_SIZE);
  attention_stand_in<<<1, 32, 0, stream>>>(out);
}

template void launcher<uint16_t, 16, true>(cudaStream_t, const uint16_t*, const uint16_t*,
                                           const int*, const int*, int, float*);
template void launcher<uint8_t, 16, false>(cudaStream_t, const uint8_t*, const uint8_t*,
                                           const int*, const int*, int, float*);
