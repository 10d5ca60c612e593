// kvprefetch: a GQA-grouped twin of vLLM v0.10.2's paged attention decode kernel, for large
// steps, with outputs bitwise equal to vLLM's own kernels.
//
// Why. vLLM's kernels run one CTA per (query head, sequence[, partition]), so the
// num_heads / num_kv_heads query heads of a GQA group each read the same K and V: for
// Llama-3.1-8B (4 query heads per kv head) every KV byte crosses the L2-to-SM path 4 times.
// On the H200 that path, not DRAM, is what large steps wait on: Nsight Compute puts stock's L2
// throughput at 73-86% of peak and its DRAM throughput at 38-45% on b128 x 4k (v1) and
// b8 x 16k (v2), and with every KV load an L2 hit stock runs only 1.09-1.2x faster there
// (docs/results/2026-11-30-h200-prefetch-explore/17-ncu-limits, 2026-11-29-h200-l2-bound).
// Sharing the loads through L1 instead (4 stock CTAs in one, exploration run 16) lost.
//
// What. One CTA of NUM_THREADS threads per (GQA group of G query heads, sequence[, partition]):
// each warp loads a block's K (then V) once and computes all G heads with it. For every head
// the arithmetic is vLLM's, operation for operation: the same thread group and lane compute
// the same token's dot product with the same vllm::Qk_dot, the same warp walks the same
// blocks in the same order, the softmax, the max/sum reductions (vllm::block_sum) and the
// cross-warp output reduction run in the same order over the same 128-thread layout, so each
// head's output is bitwise the stock kernel's (bench kernel and verify-kernel check it). The
// CTA reads each K/V chunk once instead of G times; it holds G heads' logits in shared memory
// (G times stock's size) and G heads' accumulators in registers.
//
// Where. Compiled for what grouped_size names (head 128, block 16, fp16 caches, bf16 in v2, no
// block sparsity) and launched by the launchers (launch_grouped_v1/_v2, from one line the
// patch adds before each launcher's `switch (head_size)`) when the model's query heads per kv
// head are a multiple of G and, in `auto`, the grid is large (gqa_wanted): small grids need
// every CTA they have. KVPREFETCH_GQA=off|on|auto at run time. vLLM's kernels are untouched;
// this header is included by the two launchers after attention_kernels.cuh.
//
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cfloat>
#include <cstdint>

// vLLM's attention_kernels.cuh (no include guard) must come first: the launchers include this
// header right after it.
#include "prefetch_ptx.cuh"

namespace kvprefetch {
// Everything here has internal linkage: each tree's library is loaded into one benchmark
// process, and a function-local static of an inline function with external linkage (the
// KVPREFETCH_GQA mode) is unified across libraries by the dynamic loader (STB_GNU_UNIQUE),
// so one tree's compiled-in default would silently apply to all (seen on the H200).
namespace {

// Which instantiations get a twin, and its G: kvprefetch::grouped_size (prefetch_ptx.cuh).

constexpr int cmax(const int a, const int b) { return a > b ? a : b; }
constexpr int cmin(const int a, const int b) { return a < b ? a : b; }
constexpr int cdiv(const int a, const int b) { return (a + b - 1) / b; }

// Grid: (num_heads / G, num_seqs, max_num_partitions); PARTITION_SIZE 0 is v1. `logits_stride`:
// floats of dynamic shared memory per head (stock's shared_mem_size / 4). The comments name
// the step of vLLM's paged_attention_kernel each part mirrors.
template <typename scalar_t, typename cache_t, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS,
          vllm::Fp8KVCacheDataType KV_DTYPE, int PARTITION_SIZE, int G>
__global__ void __launch_bounds__(NUM_THREADS) gqa_decode_kernel(
    float* __restrict__ exp_sums, float* __restrict__ max_logits, scalar_t* __restrict__ out,
    const scalar_t* __restrict__ q, const cache_t* __restrict__ k_cache,
    const cache_t* __restrict__ v_cache, const int num_kv_heads, const float scale,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    const int max_num_blocks_per_seq, const float* __restrict__ alibi_slopes,
    const int q_stride, const int kv_block_stride, const int kv_head_stride,
    const int logits_stride) {
  static_assert(KV_DTYPE == vllm::Fp8KVCacheDataType::kAuto, "16-bit caches only");
  using vllm::Vec;
  constexpr bool USE_PARTITIONING = PARTITION_SIZE > 0;
  constexpr int WARP = 32;
  // Partition and token range (as stock).
  const int seq_idx = blockIdx.y;
  const int partition_idx = blockIdx.z;
  const int max_num_partitions = gridDim.z;
  const int seq_len = seq_lens[seq_idx];
  if (USE_PARTITIONING && partition_idx * PARTITION_SIZE >= seq_len) return;
  const int num_seq_blocks = cdiv(seq_len, BLOCK_SIZE);
  const int num_blocks_per_partition =
      USE_PARTITIONING ? PARTITION_SIZE / BLOCK_SIZE : num_seq_blocks;
  const int start_block_idx = USE_PARTITIONING ? partition_idx * num_blocks_per_partition : 0;
  const int end_block_idx = cmin(start_block_idx + num_blocks_per_partition, num_seq_blocks);
  const int num_blocks = end_block_idx - start_block_idx;
  const int start_token_idx = start_block_idx * BLOCK_SIZE;
  const int end_token_idx = cmin(start_token_idx + num_blocks * BLOCK_SIZE, seq_len);
  const int num_tokens = end_token_idx - start_token_idx;

  constexpr int THREAD_GROUP_SIZE = cmax(WARP / BLOCK_SIZE, 1);
  constexpr int NUM_THREAD_GROUPS = NUM_THREADS / THREAD_GROUP_SIZE;
  constexpr int NUM_TOKENS_PER_THREAD_GROUP = cdiv(BLOCK_SIZE, WARP);
  constexpr int NUM_WARPS = NUM_THREADS / WARP;
  const int thread_idx = threadIdx.x;
  const int warp_idx = thread_idx / WARP;
  const int lane = thread_idx % WARP;

  // The group's heads: G consecutive query heads of one kv head.
  const int num_heads = gridDim.x * G;
  const int first_head = blockIdx.x * G;
  const int num_queries_per_kv = num_heads / num_kv_heads;
  const int kv_head_idx = first_head / num_queries_per_kv;
  float alibi_slope[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    alibi_slope[g] = alibi_slopes == nullptr ? 0.f : alibi_slopes[first_head + g];
  }

  // Query vectors in shared memory, one set per head (as stock's q_vecs).
  constexpr int VEC_SIZE = cmax(16 / (THREAD_GROUP_SIZE * int(sizeof(scalar_t))), 1);
  using K_vec = typename Vec<scalar_t, VEC_SIZE>::Type;
  using Q_vec = typename Vec<scalar_t, VEC_SIZE>::Type;
  constexpr int NUM_ELEMS_PER_THREAD = HEAD_SIZE / THREAD_GROUP_SIZE;
  constexpr int NUM_VECS_PER_THREAD = NUM_ELEMS_PER_THREAD / VEC_SIZE;
  const int thread_group_idx = thread_idx / THREAD_GROUP_SIZE;
  const int thread_group_offset = thread_idx % THREAD_GROUP_SIZE;
  __shared__ Q_vec q_vecs[G][THREAD_GROUP_SIZE][NUM_VECS_PER_THREAD];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const scalar_t* q_ptr = q + seq_idx * q_stride + (first_head + g) * HEAD_SIZE;
#pragma unroll
    for (int i = thread_group_idx; i < NUM_VECS_PER_THREAD; i += NUM_THREAD_GROUPS) {
      const int vec_idx = thread_group_offset + i * THREAD_GROUP_SIZE;
      q_vecs[g][thread_group_offset][i] =
          *reinterpret_cast<const Q_vec*>(q_ptr + vec_idx * VEC_SIZE);
    }
  }
  __syncthreads();

  // Logits: head g's at shared_mem + g * logits_stride floats, later its output scratch.
  extern __shared__ char shared_mem[];
  float* const logits0 = reinterpret_cast<float*>(shared_mem);
  __shared__ float red_smem[G][2 * NUM_WARPS];

  // K pass: each warp loads a block's keys once and scores them against every head.
  constexpr int x = 16 / sizeof(cache_t);
  float qk_max[G];
#pragma unroll
  for (int g = 0; g < G; ++g) qk_max[g] = -FLT_MAX;
  const int* block_table = block_tables + seq_idx * max_num_blocks_per_seq;
  for (int block_idx = start_block_idx + warp_idx; block_idx < end_block_idx;
       block_idx += NUM_WARPS) {
    const int64_t physical_block_number = static_cast<int64_t>(block_table[block_idx]);
    for (int i = 0; i < NUM_TOKENS_PER_THREAD_GROUP; i++) {
      const int physical_block_offset = (thread_group_idx + i * WARP) % BLOCK_SIZE;
      const int token_idx = block_idx * BLOCK_SIZE + physical_block_offset;
      K_vec k_vecs[NUM_VECS_PER_THREAD];
#pragma unroll
      for (int j = 0; j < NUM_VECS_PER_THREAD; j++) {
        const cache_t* k_ptr = k_cache + physical_block_number * kv_block_stride +
                               kv_head_idx * kv_head_stride + physical_block_offset * x;
        const int vec_idx = thread_group_offset + j * THREAD_GROUP_SIZE;
        const int offset1 = (vec_idx * VEC_SIZE) / x;
        const int offset2 = (vec_idx * VEC_SIZE) % x;
        k_vecs[j] = *reinterpret_cast<const K_vec*>(k_ptr + offset1 * BLOCK_SIZE * x + offset2);
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float qk = scale * vllm::Qk_dot<scalar_t, THREAD_GROUP_SIZE>::dot(
                               q_vecs[g][thread_group_offset], k_vecs);
        qk += (alibi_slope[g] != 0) ? alibi_slope[g] * (token_idx - seq_len + 1) : 0;
        if (thread_group_offset == 0) {
          const bool mask = token_idx >= seq_len;
          logits0[g * logits_stride + token_idx - start_token_idx] = mask ? 0.f : qk;
          qk_max[g] = mask ? qk_max[g] : fmaxf(qk_max[g], qk);
        }
      }
    }
  }

  // Max over the CTA, per head (as stock).
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int mask = WARP / 2; mask >= THREAD_GROUP_SIZE; mask /= 2) {
      qk_max[g] = fmaxf(qk_max[g], VLLM_SHFL_XOR_SYNC(qk_max[g], mask));
    }
    if (lane == 0) red_smem[g][warp_idx] = qk_max[g];
  }
  __syncthreads();
#pragma unroll
  for (int g = 0; g < G; ++g) {
    qk_max[g] = lane < NUM_WARPS ? red_smem[g][lane] : -FLT_MAX;
#pragma unroll
    for (int mask = NUM_WARPS / 2; mask >= 1; mask /= 2) {
      qk_max[g] = fmaxf(qk_max[g], VLLM_SHFL_XOR_SYNC(qk_max[g], mask));
    }
    qk_max[g] = VLLM_SHFL_SYNC(qk_max[g], 0);
  }

  // Softmax, per head (as stock; vllm::block_sum over the same 128-thread layout).
  float exp_sum[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float* logits = logits0 + g * logits_stride;
    exp_sum[g] = 0.f;
    for (int i = thread_idx; i < num_tokens; i += NUM_THREADS) {
      float val = __expf(logits[i] - qk_max[g]);
      logits[i] = val;
      exp_sum[g] += val;
    }
    exp_sum[g] = vllm::block_sum<NUM_WARPS>(&red_smem[g][NUM_WARPS], exp_sum[g]);
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float* logits = logits0 + g * logits_stride;
    const float inv_sum = __fdividef(1.f, exp_sum[g] + 1e-6f);
    for (int i = thread_idx; i < num_tokens; i += NUM_THREADS) {
      logits[i] *= inv_sum;
    }
  }
  __syncthreads();
  if (USE_PARTITIONING && thread_idx == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int at = seq_idx * num_heads * max_num_partitions +
                     (first_head + g) * max_num_partitions + partition_idx;
      max_logits[at] = qk_max[g];
      exp_sums[at] = exp_sum[g];
    }
  }

  // V pass: each warp loads a block's values once and accumulates every head.
  constexpr int V_VEC_SIZE = cmin(16 / int(sizeof(scalar_t)), BLOCK_SIZE);
  using V_vec = typename Vec<scalar_t, V_VEC_SIZE>::Type;
  using L_vec = typename Vec<scalar_t, V_VEC_SIZE>::Type;
  using Float_L_vec = typename vllm::FloatVec<L_vec>::Type;
  constexpr int NUM_V_VECS_PER_ROW = BLOCK_SIZE / V_VEC_SIZE;
  constexpr int NUM_ROWS_PER_ITER = WARP / NUM_V_VECS_PER_ROW;
  constexpr int NUM_ROWS_PER_THREAD = cdiv(HEAD_SIZE, NUM_ROWS_PER_ITER);
  float accs[G][NUM_ROWS_PER_THREAD];
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int i = 0; i < NUM_ROWS_PER_THREAD; i++) accs[g][i] = 0.f;
  }
  scalar_t zero_value;
  vllm::zero(zero_value);
  for (int block_idx = start_block_idx + warp_idx; block_idx < end_block_idx;
       block_idx += NUM_WARPS) {
    const int64_t physical_block_number = static_cast<int64_t>(block_table[block_idx]);
    const int physical_block_offset = (lane % NUM_V_VECS_PER_ROW) * V_VEC_SIZE;
    const int token_idx = block_idx * BLOCK_SIZE + physical_block_offset;
    L_vec logits_vec[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      vllm::from_float(logits_vec[g], *reinterpret_cast<Float_L_vec*>(
                                          logits0 + g * logits_stride + token_idx -
                                          start_token_idx));
    }
    const cache_t* v_ptr =
        v_cache + physical_block_number * kv_block_stride + kv_head_idx * kv_head_stride;
#pragma unroll
    for (int i = 0; i < NUM_ROWS_PER_THREAD; i++) {
      const int row_idx = lane / NUM_V_VECS_PER_ROW + i * NUM_ROWS_PER_ITER;
      if (row_idx < HEAD_SIZE) {
        const int offset = row_idx * BLOCK_SIZE + physical_block_offset;
        V_vec v_vec = *reinterpret_cast<const V_vec*>(v_ptr + offset);
        if (block_idx == num_seq_blocks - 1) {
          // Tokens past the context may hold NaNs: zeroed, as stock does.
          scalar_t* v_vec_ptr = reinterpret_cast<scalar_t*>(&v_vec);
#pragma unroll
          for (int j = 0; j < V_VEC_SIZE; j++) {
            v_vec_ptr[j] = token_idx + j < seq_len ? v_vec_ptr[j] : zero_value;
          }
        }
#pragma unroll
        for (int g = 0; g < G; ++g) accs[g][i] += vllm::dot(logits_vec[g], v_vec);
      }
    }
  }

  // Reductions within each warp, then across warps, per head (as stock).
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int i = 0; i < NUM_ROWS_PER_THREAD; i++) {
      float acc = accs[g][i];
#pragma unroll
      for (int mask = NUM_V_VECS_PER_ROW / 2; mask >= 1; mask /= 2) {
        acc += VLLM_SHFL_XOR_SYNC(acc, mask);
      }
      accs[g][i] = acc;
    }
  }
  __syncthreads();  // the logits' space becomes each head's output scratch
#pragma unroll
  for (int i = NUM_WARPS; i > 1; i /= 2) {
    const int mid = i / 2;
    if (warp_idx >= mid && warp_idx < i) {
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float* dst = logits0 + g * logits_stride + (warp_idx - mid) * HEAD_SIZE;
#pragma unroll
        for (int r = 0; r < NUM_ROWS_PER_THREAD; r++) {
          const int row_idx = lane / NUM_V_VECS_PER_ROW + r * NUM_ROWS_PER_ITER;
          if (row_idx < HEAD_SIZE && lane % NUM_V_VECS_PER_ROW == 0) dst[row_idx] = accs[g][r];
        }
      }
    }
    __syncthreads();
    if (warp_idx < mid) {
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float* src = logits0 + g * logits_stride + warp_idx * HEAD_SIZE;
#pragma unroll
        for (int r = 0; r < NUM_ROWS_PER_THREAD; r++) {
          const int row_idx = lane / NUM_V_VECS_PER_ROW + r * NUM_ROWS_PER_ITER;
          if (row_idx < HEAD_SIZE && lane % NUM_V_VECS_PER_ROW == 0) accs[g][r] += src[row_idx];
        }
      }
    }
    __syncthreads();
  }
  if (warp_idx == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      scalar_t* out_ptr = out + seq_idx * num_heads * max_num_partitions * HEAD_SIZE +
                          (first_head + g) * max_num_partitions * HEAD_SIZE +
                          partition_idx * HEAD_SIZE;
#pragma unroll
      for (int r = 0; r < NUM_ROWS_PER_THREAD; r++) {
        const int row_idx = lane / NUM_V_VECS_PER_ROW + r * NUM_ROWS_PER_ITER;
        if (row_idx < HEAD_SIZE && lane % NUM_V_VECS_PER_ROW == 0) {
          vllm::from_float(*(out_ptr + row_idx), accs[g][r]);
        }
      }
    }
  }
}

// ---- Host side: whether a launch runs the twin, and the launch ----------------------------
// KVPREFETCH_GQA=off|on|auto (read once per process; default KVPREFETCH_GQA_DEFAULT_MODE,
// 2 = auto). A launch can be grouped when G divides the query heads per kv head and G times
// stock's shared memory fits the device; `auto` groups grids of at least
// KVPREFETCH_GQA_MIN_CTAS_PCT stock CTAs as a percentage of the SM count. Calibrated on the
// H200 (Llama-3.1-8B fp16, exploration run 19): at 3.9 stock CTAs per SM the twin ran
// 0.81-0.90x of stock (the `prefetch` kernels without it: 1.10-1.19x), at 5.8 per SM 1.29-1.37x
// (without: 1.15-1.18x), from 7.8 per SM on 1.28-1.91x; 500 (5 per SM) lies between.
#ifndef KVPREFETCH_GQA_DEFAULT_MODE
  #define KVPREFETCH_GQA_DEFAULT_MODE 2
#endif
#ifndef KVPREFETCH_GQA_MIN_CTAS_PCT
  #define KVPREFETCH_GQA_MIN_CTAS_PCT 500
#endif
#if !defined(USE_ROCM)
inline int gqa_host_mode() {
  static const int mode = env_mode("KVPREFETCH_GQA", KVPREFETCH_GQA_DEFAULT_MODE);
  return mode;
}

inline bool gqa_wanted(const int group, const dim3 grid, const int num_kv_heads,
                       const int shared_mem_bytes) {
  const int mode = gqa_host_mode();
  const int num_heads = static_cast<int>(grid.x);
  if (mode == 0 || group <= 1 || num_kv_heads <= 0 || num_heads % num_kv_heads != 0 ||
      (num_heads / num_kv_heads) % group != 0) {
    return false;
  }
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  const DeviceFacts f = device_facts(dev);
  if (static_cast<long long>(group) * shared_mem_bytes > f.max_smem_optin) return false;
  const long long stock_ctas = static_cast<long long>(grid.x) * grid.y * grid.z;
  return mode == 1 ||
         100LL * stock_ctas >= static_cast<long long>(KVPREFETCH_GQA_MIN_CTAS_PCT) * f.sm_count;
}

// Everything the launchers pass, by the names they use.
template <typename T, typename CACHE_T>
struct GqaArgs {
  float* exp_sums;
  float* max_logits;
  T* out;  // v2: tmp_out
  const T* q;
  const CACHE_T* k_cache;
  const CACHE_T* v_cache;
  int num_kv_heads;
  float scale;
  const int* block_tables;
  const int* seq_lens;
  int max_num_blocks_per_seq;
  const float* alibi_slopes;
  int q_stride;
  int kv_block_stride;
  int kv_head_stride;
};

template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS,
          vllm::Fp8KVCacheDataType KV_DTYPE, int PARTITION_SIZE, int G>
void launch_gqa_kernel(const GqaArgs<T, CACHE_T>& a, const dim3 stock_grid,
                       const int shared_mem_size, const cudaStream_t stream) {
  const auto kernel = gqa_decode_kernel<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS,
                                        KV_DTYPE, PARTITION_SIZE, G>;
  const int smem = G * shared_mem_size;
  if (smem > 48 * 1024) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  }
  kernel<<<dim3(stock_grid.x / G, stock_grid.y, stock_grid.z), NUM_THREADS, smem, stream>>>(
      a.exp_sums, a.max_logits, a.out, a.q, a.k_cache, a.v_cache, a.num_kv_heads, a.scale,
      a.block_tables, a.seq_lens, a.max_num_blocks_per_seq, a.alibi_slopes, a.q_stride,
      a.kv_block_stride, a.kv_head_stride, shared_mem_size / static_cast<int>(sizeof(float)));
}

// The v1 launcher's added line: true when it launched the twin (the launcher then returns).
template <typename T, typename CACHE_T, int BLOCK_SIZE, vllm::Fp8KVCacheDataType KV_DTYPE,
          bool IS_BLOCK_SPARSE, int NUM_THREADS>
bool launch_grouped_v1(const int head_size, const dim3 grid, const int shared_mem_size,
                       const cudaStream_t stream, const GqaArgs<T, CACHE_T>& a) {
  constexpr int G =
      grouped_size<128, BLOCK_SIZE, CACHE_T, int(KV_DTYPE), IS_BLOCK_SPARSE>(false);
  if constexpr (G <= 1) {
    return false;
  } else {
    if (head_size != 128 || !gqa_wanted(G, grid, a.num_kv_heads, shared_mem_size)) return false;
    launch_gqa_kernel<T, CACHE_T, 128, BLOCK_SIZE, NUM_THREADS, KV_DTYPE, 0, G>(
        a, grid, shared_mem_size, stream);
    return true;
  }
}

// The v2 launcher's added line: the twin, then vLLM's own reduce kernel, as the launcher's
// macro would have launched it.
template <typename T, typename CACHE_T, int BLOCK_SIZE, vllm::Fp8KVCacheDataType KV_DTYPE,
          bool IS_BLOCK_SPARSE, int NUM_THREADS, int PARTITION_SIZE>
bool launch_grouped_v2(const int head_size, const dim3 grid, const int shared_mem_size,
                       const cudaStream_t stream, const GqaArgs<T, CACHE_T>& a, T* out,
                       const dim3 reduce_grid, const int reduce_shared_mem_size,
                       const int max_num_partitions) {
  constexpr int G =
      grouped_size<128, BLOCK_SIZE, CACHE_T, int(KV_DTYPE), IS_BLOCK_SPARSE>(true);
  if constexpr (G <= 1) {
    return false;
  } else {
    if (head_size != 128 || !gqa_wanted(G, grid, a.num_kv_heads, shared_mem_size)) return false;
    launch_gqa_kernel<T, CACHE_T, 128, BLOCK_SIZE, NUM_THREADS, KV_DTYPE, PARTITION_SIZE, G>(
        a, grid, shared_mem_size, stream);
    vllm::paged_attention_v2_reduce_kernel<T, 128, NUM_THREADS, PARTITION_SIZE>
        <<<reduce_grid, dim3(NUM_THREADS), reduce_shared_mem_size, stream>>>(
            out, a.exp_sums, a.max_logits, a.out, a.seq_lens, max_num_partitions);
    return true;
  }
}
#endif  // !USE_ROCM

}  // namespace
}  // namespace kvprefetch
