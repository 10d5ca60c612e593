// kvprefetch: the GQA-grouped twins' kernels (a part of gqa_twins.cuh, which says what the
// twins are and includes this inside its anonymous namespace): gqa_decode_kernel<..., G, S,
// STAGED, FUSED>, the twin of vLLM's paged_attention_kernel for v1 (PARTITION_SIZE 0) and v2,
// and gqa_reduce_kernel, v2's reduction after a twin under KVPREFETCH_TWIN_PDL=2; with their
// launch bounds. Their helpers: gqa_twins_device.cuh; their launch: gqa_twins_launch.cuh.
// Past ~500 lines because gqa_decode_kernel is one function of about 435 (see its top).
//
// SPDX-License-Identifier: Apache-2.0
#ifndef KVPREFETCH_GQA_TWINS_PARTS
  #error "gqa_twins_kernel.cuh is a part of gqa_twins.cuh (inside its namespace): include that"
#endif

// The twins' launch bounds. Launched as programmatic dependents, the next layer's CTAs are
// placed while this layer's still run and wait there, which helps only where they fit: under
// KVPREFETCH_TWIN_PDL every twin is bounded to <= 128 registers (kTwinBoundThreads / THREADS
// CTAs per SM: four of 128 threads, two of 256, one of 512), the count ptxas picks for most of
// them unbounded. More registers (a twin unbounded, or a minimum of 1 CTA) halved the CTAs per
// SM and made those grids slower. With KVPREFETCH_TWIN_PDL=0 the bounds are stock's form, the
// thread count alone (minimum CTAs left out, not given as 1: ptxas allocates differently then).
#if KVPREFETCH_TWIN_PDL
  #define KVPREFETCH_TWIN_BOUNDS(THREADS) \
    __launch_bounds__(THREADS, kvprefetch::kTwinBoundThreads / (THREADS))
#else
  #define KVPREFETCH_TWIN_BOUNDS(THREADS) __launch_bounds__(THREADS)
#endif

// Grid: (num_kv_heads * cdiv(num_queries_per_kv, G), num_seqs, max_num_partitions) (twin_heads,
// launch_policy.cuh); PARTITION_SIZE 0 is v1. `logits_stride`: floats of dynamic shared memory
// per head (stock's shared_mem_size / 4). The comments name the step of vLLM's
// paged_attention_kernel each part mirrors.
//
// One function, on purpose. Its passes (the query load, K, the max, the softmax, V, the
// reductions across warps, the output, the fused reduction) share the CTA's indices, its
// shared-memory pointers and the per-head register arrays (qk_max, exp_sum, accs: G times
// stock's), and a twin is held to 128 registers (KVPREFETCH_TWIN_BOUNDS). Moved into
// __forceinline__ functions they would compile to the same machine code only as far as NVVM and
// ptxas happened to inline, allocate and schedule them alike, and nothing here may change that
// code: the outputs are bitwise stock's and the register budget is tight. When gqa_twins.cuh
// was split into parts (issue 45) the compiler's input was kept token for token, so that every
// kernel's SASS and register use stay identical (scripts/device/sass-identity.sh compares
// them over the full instantiation set); an extraction cannot keep that. Read it by its pass
// comments; each names the step of vLLM's paged_attention_kernel it mirrors.
template <typename scalar_t, typename cache_t, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS,
          vllm::Fp8KVCacheDataType KV_DTYPE, int PARTITION_SIZE, int G, int S, bool STAGED,
          bool FUSED = false>
__global__ void KVPREFETCH_TWIN_BOUNDS(NUM_THREADS * S) gqa_decode_kernel(
    float* __restrict__ exp_sums, float* __restrict__ max_logits, scalar_t* __restrict__ out,
    const scalar_t* __restrict__ q, const cache_t* __restrict__ k_cache,
    const cache_t* __restrict__ v_cache, const int num_kv_heads, const float scale,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    const int max_num_blocks_per_seq, const float* __restrict__ alibi_slopes,
    const int q_stride, const int kv_block_stride, const int kv_head_stride,
    const int logits_stride, unsigned int* __restrict__ fuse_counters,
    scalar_t* __restrict__ fused_out, const int num_queries_per_kv) {
  static_assert(KV_DTYPE == vllm::Fp8KVCacheDataType::kAuto, "16-bit caches only");
  pdl_start();  // before any global memory access
  using vllm::Vec;
  constexpr bool USE_PARTITIONING = PARTITION_SIZE > 0;
  constexpr int WARP = 32;
  // Partition and token range (as stock).
  const int seq_idx = blockIdx.y;
  const int partition_idx = blockIdx.z;
  const int max_num_partitions = gridDim.z;
  // The group's heads (head_group). A slot past its live heads computes the CTA's last head
  // again (the same operations on the same values) and writes nothing, so that every number
  // of heads per kv head runs the one instantiation of G slots.
  const HeadGroup heads = head_group<G>(num_kv_heads, num_queries_per_kv);
  const int kv_head_idx = heads.kv_head;
  const auto head_of = [&](const int g) { return heads.first + cmin(g, heads.live - 1); };
  const int seq_len = load_dep(seq_lens + seq_idx);
  if (USE_PARTITIONING && partition_idx * PARTITION_SIZE >= seq_len) {
    if constexpr (FUSED) {
      // A sequence of no tokens has no partition to reduce, and no CTA of it gets further:
      // write what vLLM's reduce kernel writes for it, 0 (its sum over no partitions).
      if (seq_len <= 0 && partition_idx == 0) {
        const int64_t first = (static_cast<int64_t>(seq_idx) * heads.num_heads + heads.first) *
                              HEAD_SIZE;
        for (int i = threadIdx.x; i < heads.live * HEAD_SIZE; i += blockDim.x) {
          vllm::from_float(fused_out[first + i], 0.0f);
        }
      }
    }
    return;
  }
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
  // Stock's layout is NUM_THREADS threads (NUM_WARPS warps); the CTA has S times as many.
  // Warp w (< NUM_WARPS * S) stands in for stock's warp w % NUM_WARPS: see the V pass.
  constexpr int NUM_WARPS = NUM_THREADS / WARP;
  constexpr int CTA_WARPS = NUM_WARPS * S;
  static_assert(S >= 1 && CTA_WARPS <= WARP, "S: 1 .. 32 / NUM_WARPS");
  const int thread_idx = threadIdx.x;
  const int warp_idx = thread_idx / WARP;
  const int lane = thread_idx % WARP;

  // Staging (kTwinStage): the ring's layout from the dynamic shared memory the host
  // gave, then each warp's first `stages` chunks requested before the query is read.
  constexpr int CHUNK = HEAD_SIZE * BLOCK_SIZE * int(sizeof(cache_t));
  [[maybe_unused]] WarpStage<cache_t, CHUNK> stage{};
  static_assert(!STAGED || staged<G, S>(), "staged: see staged(), kTwinStage > 0");
  if constexpr (STAGED) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    __trap();  // no bulk copy before sm_90; the host never launches a staged twin there
#endif
    extern __shared__ char stage_mem[];
    const long long before = twin_smem_before<scalar_t, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS, G, S>(
        4LL * logits_stride);
    uint32_t dynamic_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic_bytes));
    const int ring_at = static_cast<int>(stage_ring_at(before, CTA_WARPS));
    const int ring_bytes = static_cast<int>(dynamic_bytes) - ring_at;
    stage.stages = cmin(cmax(ring_bytes / (CTA_WARPS * CHUNK), 1), kTwinStage);
    stage.ring = stage_mem + ring_at + warp_idx * stage.stages * CHUNK;
    stage.bars =
        smem_addr(stage_mem + stage_bars_at(before)) + 8 * warp_idx * kTwinStage;
    stage.n = cmax(cdiv(end_block_idx - start_block_idx - warp_idx, CTA_WARPS), 0);
    stage.lane = lane;
    stage.k = k_cache + kv_head_idx * kv_head_stride;
    stage.v = v_cache + kv_head_idx * kv_head_stride;
    stage.block_stride = kv_block_stride;
    stage.numbers = {block_tables + seq_idx * max_num_blocks_per_seq, start_block_idx + warp_idx,
                     CTA_WARPS, end_block_idx, lane};
    if (lane == 0) {
      for (int slot = 0; slot < stage.stages; ++slot) stage_init(stage.bars + 8 * slot);
      stage_init_fence();
    }
    __syncwarp();
    for (int c = 0; c < (KVPREFETCH_TWIN_STAGE_SPLIT ? 1 : stage.stages); ++c) stage.issue(c);
  }
  float alibi_slope[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    alibi_slope[g] = alibi_slopes == nullptr ? 0.f : load_dep(alibi_slopes + head_of(g));
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
    const scalar_t* q_ptr = q + seq_idx * q_stride + head_of(g) * HEAD_SIZE;
#pragma unroll
    for (int i = thread_group_idx; i < NUM_VECS_PER_THREAD; i += NUM_THREAD_GROUPS) {
      const int vec_idx = thread_group_offset + i * THREAD_GROUP_SIZE;
      q_vecs[g][thread_group_offset][i] =
          load_dep(reinterpret_cast<const Q_vec*>(q_ptr + vec_idx * VEC_SIZE));
    }
  }
  __syncthreads();
  if constexpr (STAGED && KVPREFETCH_TWIN_STAGE_SPLIT) {  // the rest of each warp's ring
    for (int c = 1; c < stage.stages; ++c) stage.issue(c);
  }

  // Logits: head g's at shared_mem + g * logits_stride floats, later its output scratch.
  extern __shared__ char shared_mem[];
  float* const logits0 = reinterpret_cast<float*>(shared_mem);
  __shared__ float red_smem[G][2 * CTA_WARPS];

  // K pass: each warp loads a block's keys once and scores them against every head. A token's
  // score does not depend on which warp computes it, so the CTA's CTA_WARPS warps share the
  // blocks (the maximum below is exact in any order).
  constexpr int x = 16 / sizeof(cache_t);
  float qk_max[G];
#pragma unroll
  for (int g = 0; g < G; ++g) qk_max[g] = -FLT_MAX;
  // This warp's blocks, in both passes: start_block_idx + warp_idx + k * CTA_WARPS.
  WarpBlockNumbers block_number{block_tables + seq_idx * max_num_blocks_per_seq,
                                start_block_idx + warp_idx, CTA_WARPS, end_block_idx, lane};
  for (int block_idx = start_block_idx + warp_idx, k = 0; block_idx < end_block_idx;
       block_idx += CTA_WARPS, ++k) {
    // Staged: the block's K chunk in this warp's ring; else its physical number, as stock.
    [[maybe_unused]] const cache_t* staged_chunk = nullptr;
    [[maybe_unused]] int64_t physical_block_number = 0;
    if constexpr (STAGED) {
      staged_chunk = stage.wait(k);
    } else {
      physical_block_number = block_number(k);
    }
    for (int i = 0; i < NUM_TOKENS_PER_THREAD_GROUP; i++) {
      const int physical_block_offset = (thread_group_idx + i * WARP) % BLOCK_SIZE;
      const int token_idx = block_idx * BLOCK_SIZE + physical_block_offset;
      K_vec k_vecs[NUM_VECS_PER_THREAD];
#pragma unroll
      for (int j = 0; j < NUM_VECS_PER_THREAD; j++) {
        const int vec_idx = thread_group_offset + j * THREAD_GROUP_SIZE;
        const int offset1 = (vec_idx * VEC_SIZE) / x;
        const int offset2 = (vec_idx * VEC_SIZE) % x;
        if constexpr (STAGED) {
          k_vecs[j] = *reinterpret_cast<const K_vec*>(
              staged_chunk + physical_block_offset * x + offset1 * BLOCK_SIZE * x + offset2);
        } else {
          const cache_t* k_ptr = k_cache + physical_block_number * kv_block_stride +
                                 kv_head_idx * kv_head_stride + physical_block_offset * x;
          k_vecs[j] = load_ro(reinterpret_cast<const K_vec*>(k_ptr + offset1 * BLOCK_SIZE * x +
                                                               offset2));
        }
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
    if constexpr (STAGED) stage.release(k);
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
    qk_max[g] = lane < CTA_WARPS ? red_smem[g][lane] : -FLT_MAX;
#pragma unroll
    for (int mask = CTA_WARPS / 2; mask >= 1; mask /= 2) {
      qk_max[g] = fmaxf(qk_max[g], VLLM_SHFL_XOR_SYNC(qk_max[g], mask));
    }
    qk_max[g] = VLLM_SHFL_SYNC(qk_max[g], 0);
  }

  // Softmax, per head (as stock; vllm::block_sum over the same 128-thread layout: the first
  // NUM_THREADS threads sum what stock's do, the others add nothing and block_sum reads only
  // the first NUM_WARPS warps' sums).
  float exp_sum[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float* logits = logits0 + g * logits_stride;
    exp_sum[g] = 0.f;
    if (thread_idx < NUM_THREADS) {
      for (int i = thread_idx; i < num_tokens; i += NUM_THREADS) {
        float val = __expf(logits[i] - qk_max[g]);
        logits[i] = val;
        exp_sum[g] += val;
      }
    }
    exp_sum[g] = vllm::block_sum<NUM_WARPS>(&red_smem[g][CTA_WARPS], exp_sum[g]);
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float* logits = logits0 + g * logits_stride;
    const float inv_sum = __fdividef(1.f, exp_sum[g] + 1e-6f);
    for (int i = thread_idx; i < num_tokens; i += NUM_THREADS * S) {
      logits[i] *= inv_sum;
    }
  }
  __syncthreads();
  if (USE_PARTITIONING && thread_idx == 0) {
    const HeadGroup h = head_group<G>(num_kv_heads, num_queries_per_kv);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (g >= h.live) break;
      const int at = seq_idx * h.num_heads * max_num_partitions +
                     (h.first + g) * max_num_partitions + partition_idx;
      max_logits[at] = qk_max[g];
      exp_sums[at] = exp_sum[g];
    }
  }

  // V pass: each warp loads a block's values once and accumulates every head. Stock's warp w
  // adds its blocks w, w + NUM_WARPS, ... in that order, and a float sum is only bitwise the
  // same in the same order: so with S > 1 the CTA's warps take CTA_WARPS blocks per round, warp
  // w < NUM_WARPS adds its own block's products, then those of the blocks w + k * NUM_WARPS
  // (k = 1 .. S-1) that warps w + k * NUM_WARPS computed and left in shared memory.
  constexpr int V_VEC_SIZE = v_vec_size<scalar_t, BLOCK_SIZE>();
  using V_vec = typename Vec<scalar_t, V_VEC_SIZE>::Type;
  using L_vec = typename Vec<scalar_t, V_VEC_SIZE>::Type;
  using Float_L_vec = typename vllm::FloatVec<L_vec>::Type;
  constexpr int NUM_V_VECS_PER_ROW = BLOCK_SIZE / V_VEC_SIZE;
  constexpr int NUM_ROWS_PER_ITER = WARP / NUM_V_VECS_PER_ROW;
  constexpr int NUM_ROWS_PER_THREAD = v_rows_per_thread<scalar_t, HEAD_SIZE, BLOCK_SIZE>();
  float accs[G][NUM_ROWS_PER_THREAD];
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int i = 0; i < NUM_ROWS_PER_THREAD; i++) accs[g][i] = 0.f;
  }
  scalar_t zero_value;
  vllm::zero(zero_value);
  // One block's products (vllm::dot of the logits and a V vector) for every head and row,
  // handed to use(g, i, product) in stock's order.
  // `staged_chunk`: the block's V chunk in this warp's ring (staged twins), else unused.
  const auto block_products = [&](const int block_idx, const int64_t physical_block_number,
                                  [[maybe_unused]] const cache_t* staged_chunk, auto&& use) {
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
        STAGED ? staged_chunk
               : v_cache + physical_block_number * kv_block_stride +
                     kv_head_idx * kv_head_stride;
#pragma unroll
    for (int i = 0; i < NUM_ROWS_PER_THREAD; i++) {
      const int row_idx = lane / NUM_V_VECS_PER_ROW + i * NUM_ROWS_PER_ITER;
      if (row_idx < HEAD_SIZE) {
        const int offset = row_idx * BLOCK_SIZE + physical_block_offset;
        V_vec v_vec;
        if constexpr (STAGED) {
          v_vec = *reinterpret_cast<const V_vec*>(v_ptr + offset);
        } else {
          v_vec = load_ro(reinterpret_cast<const V_vec*>(v_ptr + offset));
        }
        if (block_idx == num_seq_blocks - 1) {
          // Tokens past the context may hold NaNs: zeroed, as stock does.
          scalar_t* v_vec_ptr = reinterpret_cast<scalar_t*>(&v_vec);
#pragma unroll
          for (int j = 0; j < V_VEC_SIZE; j++) {
            v_vec_ptr[j] = token_idx + j < seq_len ? v_vec_ptr[j] : zero_value;
          }
        }
#pragma unroll
        for (int g = 0; g < G; ++g) use(g, i, vllm::dot(logits_vec[g], v_vec));
      }
    }
  };
  const auto add = [&](const int g, const int i, const float product) { accs[g][i] += product; };
  if constexpr (S == 1) {
    for (int block_idx = start_block_idx + warp_idx, k = 0; block_idx < end_block_idx;
         block_idx += NUM_WARPS, ++k) {
      block_products(block_idx, block_number(k), nullptr, add);
    }
  } else {
    // Warp w >= NUM_WARPS's products: G * NUM_ROWS_PER_THREAD * WARP floats after the logits.
    constexpr int SLOT = G * NUM_ROWS_PER_THREAD * WARP;
    float* const products = logits0 + G * logits_stride;
    const auto slot_of = [&](const int warp, const int g, const int i) {
      return products + (warp - NUM_WARPS) * SLOT + (g * NUM_ROWS_PER_THREAD + i) * WARP + lane;
    };
    for (int first = start_block_idx, k = 0; first < end_block_idx; first += CTA_WARPS, ++k) {
      const int block_idx = first + warp_idx;
      if (block_idx < end_block_idx) {
        if constexpr (STAGED) {
          const cache_t* staged_chunk = stage.wait(stage.n + k);
          if (warp_idx < NUM_WARPS) {
            block_products(block_idx, 0, staged_chunk, add);
          } else {
            block_products(block_idx, 0, staged_chunk,
                           [&](const int g, const int i, const float product) {
                             *slot_of(warp_idx, g, i) = product;
                           });
          }
          stage.release(stage.n + k);
        } else if (warp_idx < NUM_WARPS) {
          block_products(block_idx, block_number(k), nullptr, add);
        } else {
          block_products(block_idx, block_number(k), nullptr,
                         [&](const int g, const int i, const float product) {
                           *slot_of(warp_idx, g, i) = product;
                         });
        }
      }
      __syncthreads();
      if (warp_idx < NUM_WARPS) {
#pragma unroll
        for (int h = 1; h < S; ++h) {
          if (block_idx + h * NUM_WARPS >= end_block_idx) break;
#pragma unroll
          for (int g = 0; g < G; ++g) {
#pragma unroll
            for (int i = 0; i < NUM_ROWS_PER_THREAD; i++) {
              const int row_idx = lane / NUM_V_VECS_PER_ROW + i * NUM_ROWS_PER_ITER;
              if (row_idx < HEAD_SIZE) accs[g][i] += *slot_of(warp_idx + h * NUM_WARPS, g, i);
            }
          }
        }
      }
      __syncthreads();
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
  const HeadGroup h = head_group<G>(num_kv_heads, num_queries_per_kv);
  if (warp_idx == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (g >= h.live) break;
      scalar_t* out_ptr = out + seq_idx * h.num_heads * max_num_partitions * HEAD_SIZE +
                          (h.first + g) * max_num_partitions * HEAD_SIZE +
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
  static_assert(!FUSED || fusable<G, S, PARTITION_SIZE, HEAD_SIZE>(), "fused: see fusable()");
  if constexpr (FUSED) {
    reduce_in_twin<scalar_t, HEAD_SIZE, NUM_THREADS, PARTITION_SIZE, G, CTA_WARPS>(
        fused_out, exp_sums, max_logits, out, fuse_counters + seq_idx * gridDim.x + blockIdx.x,
        cdiv(seq_len, PARTITION_SIZE), seq_idx, h.first, h.live, h.num_heads, max_num_partitions,
        logits0, logits_stride, &red_smem[0][0]);
  }
}

// vLLM's v2 reduction after a twin, for KVPREFETCH_TWIN_PDL=2: the arithmetic of
// vllm::paged_attention_v2_reduce_kernel in the same order over the same 128-thread layout (a
// head's output is the partitions' outputs, as the twin rounded them into tmp_out, weighted by
// their exp sums rescaled to the largest max logit), preceded by pdl_start. One CTA per
// (head, sequence); 2 * max_num_partitions floats of dynamic shared memory.
template <typename scalar_t, int HEAD_SIZE, int NUM_THREADS, int PARTITION_SIZE>
__global__ void __launch_bounds__(NUM_THREADS) gqa_reduce_kernel(
    scalar_t* __restrict__ out, const float* __restrict__ exp_sums,
    const float* __restrict__ max_logits, const scalar_t* __restrict__ tmp_out,
    const int* __restrict__ seq_lens, const int max_num_partitions) {
  pdl_start();  // before any global memory access
  constexpr int WARP = 32;
  constexpr int NUM_WARPS = NUM_THREADS / WARP;
  const int num_heads = gridDim.x;
  const int head_idx = blockIdx.x;
  const int seq_idx = blockIdx.y;
  const int seq_len = load_dep(seq_lens + seq_idx);
  const int num_partitions = cdiv(seq_len, PARTITION_SIZE);
  const int first = seq_idx * num_heads * max_num_partitions + head_idx * max_num_partitions;
  const scalar_t* tmp_out_ptr = tmp_out + static_cast<int64_t>(first) * HEAD_SIZE;
  scalar_t* out_ptr = out + seq_idx * num_heads * HEAD_SIZE + head_idx * HEAD_SIZE;
  if (num_partitions == 1) {  // one partition: its output as it is
    for (int i = threadIdx.x; i < HEAD_SIZE; i += blockDim.x) {
      out_ptr[i] = load_dep(tmp_out_ptr + i);
    }
    return;
  }
  const int warp_idx = threadIdx.x / WARP;
  const int lane = threadIdx.x % WARP;
  extern __shared__ char shared_mem[];
  __shared__ float red_smem[2 * NUM_WARPS];
  // The largest max logit over the partitions.
  float* shared_max_logits = reinterpret_cast<float*>(shared_mem);
  float max_logit = -FLT_MAX;
  for (int i = threadIdx.x; i < num_partitions; i += blockDim.x) {
    const float l = load_dep(max_logits + first + i);
    shared_max_logits[i] = l;
    max_logit = fmaxf(max_logit, l);
  }
  __syncthreads();
  max_logit = reduce_max_logit<NUM_WARPS>(max_logit, red_smem, warp_idx, lane, true);
  // Each partition's exp sum rescaled to it, and their total.
  float* shared_exp_sums = reinterpret_cast<float*>(shared_mem + sizeof(float) * num_partitions);
  float global_exp_sum = 0.0f;
  for (int i = threadIdx.x; i < num_partitions; i += blockDim.x) {
    float l = shared_max_logits[i];
    float rescaled_exp_sum = load_dep(exp_sums + first + i) * expf(l - max_logit);
    global_exp_sum += rescaled_exp_sum;
    shared_exp_sums[i] = rescaled_exp_sum;
  }
  __syncthreads();
  global_exp_sum = vllm::block_sum<NUM_WARPS>(&red_smem[NUM_WARPS], global_exp_sum);
  const float inv_global_exp_sum = __fdividef(1.0f, global_exp_sum + 1e-6f);
  // The weighted sum of the partitions' outputs.
#pragma unroll
  for (int i = threadIdx.x; i < HEAD_SIZE; i += NUM_THREADS) {
    float acc = 0.0f;
    for (int j = 0; j < num_partitions; ++j) {
      acc += vllm::to_float(load_dep(tmp_out_ptr + j * HEAD_SIZE + i)) * shared_exp_sums[j] *
             inv_global_exp_sum;
    }
    vllm::from_float(out_ptr[i], acc);
  }
}
