// kvprefetch: stock's code for the launch-bounded v1 instantiations, for the grids where the
// bound would cost a wave (launch_policy.cuh, stock_v1_wins).
//
// A bound is part of a kernel's declaration, so one template cannot be compiled both ways.
// unbounded_v1_kernel is a second __global__ around the same device function vLLM's
// paged_attention_v1_kernel calls, with the same arguments and no bound: nvcc compiles it to
// stock's instructions (verify-kernel compares each one with the baseline library's kernel of
// the same instantiation). It is compiled only beside the instantiations the rule bounds.
// Included after attention_kernels.cuh by the `prefetch` variant's paged_attention_v1.cu,
// whose launch macro calls launch_stock_v1 first and skips its own launch when it ran, and by
// gqa_twins.cuh, whose twin choice compares a twin with stock's code (stock_v1_ctas_per_sm;
// resident_ctas for v2's). A translation unit that instantiates neither compiles no copy.
//
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <atomic>

#include "launch_policy.cuh"

namespace kvprefetch {
namespace {

template <typename scalar_t, typename cache_t, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS,
          vllm::Fp8KVCacheDataType KV_DTYPE, bool IS_BLOCK_SPARSE>
__global__ void unbounded_v1_kernel(
    scalar_t* __restrict__ out, const scalar_t* __restrict__ q,
    const cache_t* __restrict__ k_cache, const cache_t* __restrict__ v_cache,
    const int num_kv_heads, const float scale, const int* __restrict__ block_tables,
    const int* __restrict__ seq_lens, const int max_num_blocks_per_seq,
    const float* __restrict__ alibi_slopes, const int q_stride, const int kv_block_stride,
    const int kv_head_stride, const float* k_scale, const float* v_scale, const int tp_rank,
    const int blocksparse_local_blocks, const int blocksparse_vert_stride,
    const int blocksparse_block_size, const int blocksparse_head_sliding_step) {
  vllm::paged_attention_kernel<scalar_t, cache_t, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS, KV_DTYPE,
                               IS_BLOCK_SPARSE>(
      /* exp_sums */ nullptr, /* max_logits */ nullptr, out, q, k_cache, v_cache, num_kv_heads,
      scale, block_tables, seq_lens, max_num_blocks_per_seq, alibi_slopes, q_stride,
      kv_block_stride, kv_head_stride, k_scale, v_scale, tp_rank, blocksparse_local_blocks,
      blocksparse_vert_stride, blocksparse_block_size, blocksparse_head_sliding_step);
}

#if !defined(USE_ROCM)
// CTAs of `threads` threads of `kernel` one SM keeps resident with no dynamic shared memory
// (the registers' and the static part's limit), asked once per kernel and device: the
// runtime's occupancy calculator, not a copy of its arithmetic. 0 when it cannot tell.
template <auto kernel>
int resident_ctas(const int dev, const int threads) {
  static std::atomic<int> known[64];  // CTAs + 1; 0 = not asked yet
  if (dev < 0 || dev >= 64) return 0;
  int n = known[dev].load(std::memory_order_relaxed);
  if (n == 0) {
    int ctas = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, threads, 0) != cudaSuccess) {
      (void)cudaGetLastError();  // ours: leave no error for the launcher's check
      ctas = 0;
    }
    n = ctas + 1;
    known[dev].store(n, std::memory_order_relaxed);
  }
  return n - 1;
}
// The same at `smem` bytes of dynamic shared memory on SMs of `smem_per_sm` bytes, which can
// only lower it (smem_ctas).
template <auto kernel>
int resident_ctas_at(const int dev, const int threads, const long long smem_per_sm,
                     const int smem) {
  return static_cast<int>(
      std::min<long long>(resident_ctas<kernel>(dev, threads), smem_ctas(smem_per_sm, smem)));
}

// CTAs per SM of stock's code for this v1 instantiation at `smem` bytes of dynamic shared
// memory: its unbounded copy's where the rule bounds it, else vLLM's kernel's (stock as is).
template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS,
          vllm::Fp8KVCacheDataType KV_DTYPE, bool IS_BLOCK_SPARSE>
int stock_v1_ctas_per_sm(const int dev, const long long smem_per_sm, const int smem) {
  if constexpr (min_blocks<HEAD_SIZE, BLOCK_SIZE, int(sizeof(CACHE_T)), int(KV_DTYPE)>(false) >
                0) {
    return resident_ctas_at<unbounded_v1_kernel<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS,
                                                KV_DTYPE, IS_BLOCK_SPARSE>>(
        dev, NUM_THREADS, smem_per_sm, smem);
  } else {
    return resident_ctas_at<vllm::paged_attention_v1_kernel<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE,
                                                            NUM_THREADS, KV_DTYPE,
                                                            IS_BLOCK_SPARSE>>(
        dev, NUM_THREADS, smem_per_sm, smem);
  }
}

// Runs unbounded_v1_kernel instead of the bounded paged_attention_v1_kernel where
// stock_v1_wins says the bound could cost this grid a wave for some lengths; true when it did.
// Instantiations the rule leaves unbounded return false at compile time. The block-table width
// (`max_num_blocks_per_seq`) no longer decides: under graph replay it is the capture length's
// whatever the real lengths, and a long chain does not win a wave back (launch_policy.cuh).
// `smem`: the launch's dynamic shared memory, which can only lower both kernels' residency.
template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS,
          vllm::Fp8KVCacheDataType KV_DTYPE, bool IS_BLOCK_SPARSE, typename... Args>
bool launch_stock_v1(const dim3 grid, const dim3 block, const int smem,
                     const cudaStream_t stream, const int /*max_num_blocks_per_seq*/,
                     Args... args) {
  if constexpr (min_blocks<HEAD_SIZE, BLOCK_SIZE, int(sizeof(CACHE_T)), int(KV_DTYPE)>(false) ==
                0) {
    return false;
  } else {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    const DeviceFacts f = device_facts(dev);
    constexpr auto bounded = vllm::paged_attention_v1_kernel<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE,
                                                             NUM_THREADS, KV_DTYPE,
                                                             IS_BLOCK_SPARSE>;
    constexpr auto stock = unbounded_v1_kernel<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS,
                                               KV_DTYPE, IS_BLOCK_SPARSE>;
    const int b = resident_ctas_at<bounded>(dev, NUM_THREADS, f.smem_per_sm, smem);
    const int s = stock_v1_ctas_per_sm<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS, KV_DTYPE,
                                       IS_BLOCK_SPARSE>(dev, f.smem_per_sm, smem);
    if (!stock_v1_wins(grid.x, 1LL * grid.y * grid.z, f.sm_count, b, s)) {
      return false;
    }
    // What vLLM's launch macro does before its launch, on every call.
    VLLM_DevFuncAttribute_SET_MaxDynamicSharedMemorySize((void*)stock, smem);
    stock<<<grid, block, smem, stream>>>(args...);
    return true;
  }
}
#endif  // !USE_ROCM

}  // namespace
}  // namespace kvprefetch
