// A tiny stand-in for vLLM's paged_attention_v1_kernel, used only to make a REAL two-arch
// (sm_80 + sm_90) SASS sample for tests/test_sass.py. It is our own code: the template is
// declared with vLLM's parameter list so the mangled name decodes like the real kernels', and
// it calls kvprefetch's csrc/kvprefetch/prologue.cuh prologue exactly as the patch does. On sm_90 its
// K and V requests become UBLKPF.L2; on sm_80 the helper compiles to nothing.
//
// How it is compiled and disassembled: see README.md next to this file.
#include <cstdint>
#include "kvprefetch/prefetch.cuh"

namespace vllm {
enum class Fp8KVCacheDataType { kAuto = 0, kFp8E4M3 = 1, kFp8E5M2 = 2 };

template <typename scalar_t, typename cache_t, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS,
          Fp8KVCacheDataType KV_DTYPE, bool IS_BLOCK_SPARSE>
__global__ void paged_attention_v1_kernel(scalar_t* __restrict__ out,
                                          const cache_t* __restrict__ k_cache,
                                          const cache_t* __restrict__ v_cache,
                                          const int* __restrict__ block_table, int num_blocks,
                                          int64_t kv_block_stride, int64_t kv_head_stride) {
  constexpr int NUM_WARPS = NUM_THREADS / 32;
  const int warp_idx = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t head_offset = blockIdx.x * kv_head_stride;
  __shared__ float scratch[NUM_THREADS];
  // The prologue, as the patch calls it: the warp's lanes request its K and V blocks.
  const unsigned token = kvprefetch::prefetch_prologue<HEAD_SIZE, BLOCK_SIZE, NUM_WARPS>(
      k_cache, v_cache, block_table, warp_idx, num_blocks, kv_block_stride, head_offset, lane,
      /*group_rank=*/0, /*group_size=*/1);
  float acc = 0.f;
  for (int block_idx = warp_idx; block_idx < num_blocks; block_idx += NUM_WARPS) {
    acc += static_cast<float>(k_cache[block_table[block_idx] * kv_block_stride + lane]);
    acc += static_cast<float>(v_cache[block_table[block_idx] * kv_block_stride + lane]);
  }
  // Like vLLM's `logits`, the scratch is shared memory the kernel really uses; a store-only
  // array would be deleted, and with it the token, the asm and every UBLKPF.
  scratch[threadIdx.x] = acc;
  kvprefetch::consume_token(token, scratch);
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = static_cast<scalar_t>(scratch[NUM_THREADS - 1 - threadIdx.x]);
}

template __global__ void paged_attention_v1_kernel<float, float, 128, 16, 128,
                                                   Fp8KVCacheDataType::kAuto, false>(
    float*, const float*, const float*, const int*, int, int64_t, int64_t);
}  // namespace vllm
