// kvprefetch: the GQA-grouped twins' device helpers (a part of gqa_twins.cuh, which says what
// the twins are and includes this inside its anonymous namespace): how the twins load (load_dep,
// load_ro, load_l2), programmatic dependent launch's start (pdl_start), the shared-memory layout
// that the kernels and the host both size (v_rows_per_thread, twin_smem_before, staged,
// stage_ring_at), the staging ring (stage_copy, WarpBlockNumbers, WarpStage), v2's reduction
// inside the twin (arrive, fusable, reduce_in_twin) and a CTA's query heads (head_group).
// Its kernels: gqa_twins_kernel.cuh; their launch: gqa_twins_launch.cuh.
//
// SPDX-License-Identifier: Apache-2.0
#ifndef KVPREFETCH_GQA_TWINS_PARTS
  #error "gqa_twins_device.cuh is a part of gqa_twins.cuh (inside its namespace): include that"
#endif

constexpr int cmax(const int a, const int b) { return a > b ? a : b; }
constexpr int cmin(const int a, const int b) { return a < b ? a : b; }
constexpr int cdiv(const int a, const int b) { return (a + b - 1) / b; }

// How load_as_word loads: an ordinary cached load (ld.global.ca, SASS LDG.E.STRONG.SM), which
// stays after griddepcontrol.wait; through the read-only path (ld.global.nc), which ptxas may
// move above it; or from L2 only (ld.global.cg), for what another CTA of the grid wrote.
enum class Via { kCached, kReadOnly, kL2 };

// A 2-, 4-, 8- or 16-byte value loaded as one word of its size, `VIA` as above.
template <Via VIA, typename V>
__device__ __forceinline__ V load_as_word(const V* p) {
  static_assert(sizeof(V) == 2 || sizeof(V) == 4 || sizeof(V) == 8 || sizeof(V) == 16,
                "2-, 4-, 8- or 16-byte values");
  using Word = std::conditional_t<
      sizeof(V) == 2, unsigned short,
      std::conditional_t<sizeof(V) == 4, unsigned int,
                         std::conditional_t<sizeof(V) == 8, uint2, uint4>>>;
  const Word* w = reinterpret_cast<const Word*>(p);
  Word r;
  if constexpr (VIA == Via::kCached) {
    r = __ldca(w);
  } else if constexpr (VIA == Via::kReadOnly) {
    r = __ldg(w);
  } else {
    r = __ldcg(w);
  }
  V v;
  memcpy(&v, &r, sizeof(v));
  return v;
}

// A K or V vector through the read-only path, stated (ld.global.nc): the staged twins take
// cache addresses into asm (the ring's bulk copies), and NVVM would no longer infer .nc itself.
template <typename V>
__device__ __forceinline__ V load_ro(const V* p) {
  static_assert(sizeof(V) == 8 || sizeof(V) == 16, "8- or 16-byte vectors");
  return load_as_word<Via::kReadOnly>(p);
}


// Programmatic dependent launch (Hopper, compute capability 9+; KVPREFETCH_TWIN_PDL, on by
// default, launch_policy.cuh): the twins, and in v2 kvprefetch's reduce kernel after them
// where pdl_reduce_after says so, are launched with
// cudaLaunchAttributeProgrammaticStreamSerialization. Each of their CTAs first lets the
// stream's next kernel start launching (that kernel's CTAs wait for this grid only if they
// wait for it themselves: griddepcontrol.wait), then waits until the stream's previous kernel
// has completed and its writes are visible (pdl_start), before it touches global memory: what
// an earlier kernel may write (seq_lens, q, alibi, the reduction's inputs) is loaded so that
// ptxas keeps it after the wait (load_dep), and verify-kernel checks the order in each
// kernel's SASS ("twins wait for the previous kernel before touching memory"). So only the
// launch and the grid's ramp-up overlap the previous kernel's tail. With
// KVPREFETCH_TWIN_PDL=0 the twins are launched as vLLM launches its kernels.
__device__ __forceinline__ void pdl_start() {
#if KVPREFETCH_TWIN_PDL && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}


// The staged warps' first requests (KVPREFETCH_TWIN_STAGE_SPLIT, 1 by default): each warp asks
// for its first chunk before the query load and the barrier after it, and for the rest of its
// ring after them, instead of for its whole ring at once (0). Every warp of every CTA starting
// its ring in the same instant is a burst that the first chunks wait behind. Only the staged
// kernels change.
#ifndef KVPREFETCH_TWIN_STAGE_SPLIT
  #define KVPREFETCH_TWIN_STAGE_SPLIT 1
#endif
static_assert(KVPREFETCH_TWIN_STAGE_SPLIT == 0 || KVPREFETCH_TWIN_STAGE_SPLIT == 1,
              "KVPREFETCH_TWIN_STAGE_SPLIT must be 0 or 1");

// A load of data an earlier kernel may have written: seq_lens, the block tables, q, the alibi
// slopes, the reduction's inputs. In a programmatic dependent launch (KVPREFETCH_TWIN_PDL) it
// must stay after pdl_start's wait in the SASS: an ordinary cached load (ld.global.ca, SASS
// LDG.E.STRONG.SM) does, as does a coherent one (ld.global.cg, LDG.E.STRONG.GPU; both timed
// the same), and the K/V loads, whose addresses come from the block tables, follow it; a
// read-only one (ld.global.nc, which nvcc infers from const __restrict__) promises data that
// does not change while the kernel runs, and ptxas did move one above the wait.
// ORDERED = false keeps the read-only path under KVPREFETCH_TWIN_PDL for a load that cannot
// issue before the wait anyway: the block-table entries, each guarded by the warp's token
// range, which comes from seq_lens (verify-kernel's order check confirms it per kernel).
// Without KVPREFETCH_TWIN_PDL: a plain load, as vLLM's code.
template <bool ORDERED = true, typename T>
__device__ __forceinline__ T load_dep(const T* p) {
  if constexpr (KVPREFETCH_TWIN_PDL == 0) {
    return *p;
  } else {
    return load_as_word<ORDERED ? Via::kCached : Via::kReadOnly>(p);
  }
}

// The V pass's layout (stock's): V_VEC_SIZE elements per vector, a block row in
// BLOCK_SIZE / V_VEC_SIZE lanes, so each lane accumulates this many of the HEAD_SIZE rows. The
// kernel's registers and the shared memory the host gives the twins both follow from it.
template <typename scalar_t, int BLOCK_SIZE>
constexpr int v_vec_size() {
  return cmin(16 / int(sizeof(scalar_t)), BLOCK_SIZE);
}
template <typename scalar_t, int HEAD_SIZE, int BLOCK_SIZE>
constexpr int v_rows_per_thread() {
  return cdiv(HEAD_SIZE, 32 / (BLOCK_SIZE / v_vec_size<scalar_t, BLOCK_SIZE>()));
}

// Floats of shared memory the twin (G, S) needs beyond G times stock's: the V products that
// warps >= NUM_WARPS hand to their stock warp (the kernel's V pass).
template <typename scalar_t, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS, int G, int S>
constexpr int products_floats() {
  return (S - 1) * (NUM_THREADS / 32) * G * v_rows_per_thread<scalar_t, HEAD_SIZE, BLOCK_SIZE>() *
         32;
}

// Dynamic shared memory of the twin (G, S) before any staging ring, in bytes: G times stock's
// (`stock_bytes`: each head's logits, later its output scratch), then the V products of the
// warps beyond stock's. The host sizes the launch with it, a staged kernel finds its ring after it.
template <typename scalar_t, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS, int G, int S>
constexpr long long twin_smem_before(const long long stock_bytes) {
  return G * stock_bytes +
         4LL * products_floats<scalar_t, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS, G, S>();
}

// Staging (kTwinStage slots per warp, launch_policy.cuh; -DKVPREFETCH_TWIN_STAGE=0 compiles
// none): the S = kStagedSplit twins copy each warp's K and V chunks, one (block, kv head) chunk
// of HEAD_SIZE * BLOCK_SIZE cache elements per copy, from global into a ring of slots of
// shared memory with Hopper's asynchronous bulk copy (cp.async.bulk, completion counted on one
// mbarrier per slot), and compute from there. A warp's chunks are its blocks' K, then the same
// blocks' V, in the order the passes use them; a slot is refilled with the chunk `stages` ahead
// as soon as the warp is done with it, so the next chunk is in flight while the warp computes
// (and its first V chunks during the softmax) without holding it in registers. The arithmetic
// is unchanged: the same vectors, read from shared memory instead of global, go through the
// same operations (bench kernel and verify-kernel check the outputs bitwise). The host launches
// the staged instantiation where two slots per warp fit beside the CTAs an SM holds
// (stage_count), else the unstaged one. Two slots measured fastest (more ran slower, one slot,
// no overlap, far slower), and the S = 4 twin ran slower staged. A kernel holding both paths
// behind a run-time test spilled, so the staged and unstaged paths are two instantiations (the
// STAGED template argument).
template <int G, int S>
constexpr bool staged() {
  return kTwinStage > 0 && S == kStagedSplit;
}
constexpr long long round_up(const long long v, const long long to) {
  return (v + to - 1) / to * to;
}
// Dynamic shared memory of a staged twin: `before` bytes (the logits and V products), then
// one 8-byte mbarrier per slot and warp (room for the most slots), then each warp's ring.
constexpr long long stage_bars_at(const long long before) { return round_up(before, 128); }
constexpr long long stage_ring_at(const long long before, const int cta_warps) {
  return stage_bars_at(before) + round_up(8LL * cta_warps * cmax(kTwinStage, 1), 128);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void stage_init(const uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
#endif
}
__device__ __forceinline__ void stage_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
// One lane: copy `bytes` from global `src` into shared `dst`, completing on mbarrier `bar`.
// The proxy fence orders the warp's earlier generic reads of the slot before the async copy's
// writes (the caller synchronises the warp first).
__device__ __forceinline__ void stage_copy(const uint32_t dst, const void* src,
                                           const uint32_t bytes, const uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
      : "memory");
#else
  (void)dst; (void)src; (void)bytes; (void)bar;
#endif
}
// Every lane: wait until the copy into the slot of mbarrier `bar` for phase `parity` is done.
__device__ __forceinline__ void stage_wait(const uint32_t bar, const uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
#else
  (void)bar; (void)parity;
#endif
}

// The physical numbers of one warp's blocks first, first + stride, ... (< end): 32 at a time,
// one load per lane, handed out by shuffle. Stock reads each from block_table right before
// loading the block's K (and again before its V): a dependent global load on every iteration
// of the warp's chain. k must be warp-uniform and all 32 lanes must call.
struct WarpBlockNumbers {
  const int* table;
  int first, stride, end, lane;
  int held = 0, chunk = -1;
  __device__ __forceinline__ int64_t operator()(const int k) {
    if (k / 32 != chunk) {
      chunk = k / 32;
      const int idx = first + (chunk * 32 + lane) * stride;
      held = idx < end ? load_dep<false>(table + idx) : 0;
    }
    return static_cast<int64_t>(__shfl_sync(0xffffffffu, held, k % 32));
  }
};

// One warp's staging ring (kTwinStage): its chunks c = 0 .. 2n - 1 are the K of its
// n blocks, then their V; chunk c goes to slot c % stages. issue and release are warp-collective
// (the block numbers are handed out by shuffle); lane 0 issues the copy.
template <typename cache_t, int CHUNK>
struct WarpStage {
  char* ring;     // this warp's slots
  uint32_t bars;  // shared address of this warp's first mbarrier
  int stages, n, lane;
  const cache_t* k;  // this kv head's K and V at block 0
  const cache_t* v;
  int64_t block_stride;
  WarpBlockNumbers numbers;
  __device__ __forceinline__ void issue(const int c) {
    if (c >= 2 * n) return;
    const int64_t block = numbers(c < n ? c : c - n);
    if (lane == 0) {
      const int slot = c % stages;
      stage_copy(smem_addr(ring + slot * CHUNK), (c < n ? k : v) + block * block_stride, CHUNK,
                 bars + 8 * slot);
    }
  }
  // The chunk c, once it has landed.
  __device__ __forceinline__ const cache_t* wait(const int c) const {
    const int slot = c % stages;
    stage_wait(bars + 8 * slot, (c / stages) & 1);
    return reinterpret_cast<const cache_t*>(ring + slot * CHUNK);
  }
  // The warp is done with chunk c: its slot takes chunk c + stages.
  __device__ __forceinline__ void release(const int c) {
    __syncwarp();
    issue(c + stages);
  }
};

// v2's reduction inside the twin (KVPREFETCH_TWIN_FUSE, on by default): the CTA of a (sequence,
// head group) that finishes its partition last reduces the group's live heads over the sequence's
// partitions, with the arithmetic of vllm::paged_attention_v2_reduce_kernel in the same order
// over the same 128-thread layout (one 128-thread group of the CTA per head; the max logit,
// then the rescaled exp sums and their vllm::block_sum, then each output element summed over
// the partitions in order), reading what the other CTAs left in tmp_out, max_logits and
// exp_sums through L2. "Last" is counted on one counter per (sequence, head group) by one
// thread after a barrier, with an acquire-release atomic (arrive, below); the last CTA sets it
// back to 0 for the next launch, which the kernel boundary (or griddepcontrol.wait) orders after
// it. The host gives each stream its own counters (fuse_slot). Saves the reduce kernel's launch
// and the wait for the whole grid before it. What the last CTA reads first it requests at once
// (one trip to L2 in the common case). A
// single-partition sequence's output is its partition's, copied (as vLLM's reduce kernel); a
// sequence of no tokens gets 0, as there (the kernel's first lines).
// Where it runs: KVPREFETCH_TWIN_FUSE and fusable, below.
template <typename T>
__device__ __forceinline__ T load_l2(const T* p) {  // ld.global.cg: another CTA's write
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "2- or 4-byte values");
  return load_as_word<Via::kL2>(p);
}
// KVPREFETCH_TWIN_FUSE, where the v2 twins reduce themselves: launch_policy.cuh.
// Counts this CTA's arrival: the counter's value before, with release (this CTA's writes, which
// the barrier before made thread 0's) and acquire (the writes of the CTAs counted before it)
// at GPU scope, as CUTLASS's GenericBarrier arrives.
__device__ __forceinline__ unsigned int arrive(unsigned int* counter) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  unsigned int old;
  asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;"
               : "=r"(old) : "l"(counter) : "memory");
  return old;
#else
  __threadfence();
  const unsigned int old = atomicAdd(counter, 1u);
  __threadfence();
  return old;
#endif
}
// The twin that reduces inside (v2 only): rules.inc's kFusedGroup x kFusedSplit, the only one
// fusing measured faster. (The fused code is its own instantiation, FUSED, so the twin's
// unfused kernel compiles as it did without it.)
// Only up to head size 128: the reduction gives each output element one thread of a 128-thread
// group (reduce_in_twin).
template <int G, int S, int PARTITION_SIZE, int HEAD_SIZE>
constexpr bool fusable() {
  return KVPREFETCH_TWIN_FUSE != 0 && PARTITION_SIZE > 0 && G == kFusedGroup &&
         S == kFusedSplit && HEAD_SIZE <= kStockWarps * 32;
}
// vllm::paged_attention_v2_reduce_kernel's largest max logit over a 128-thread group (its
// NUM_WARPS warps): each warp's by butterfly, lane 0 leaves it in red[warp] (when `write`; a
// group with no head this round leaves nothing), then the group's by butterfly over red, every
// lane given lane 0's. Every thread of the CTA calls it (it holds a barrier).
template <int NUM_WARPS>
__device__ __forceinline__ float reduce_max_logit(float max_logit, float* red, const int warp,
                                                  const int lane, const bool write) {
  constexpr int WARP = 32;
#pragma unroll
  for (int mask = WARP / 2; mask >= 1; mask /= 2) {
    max_logit = fmaxf(max_logit, VLLM_SHFL_XOR_SYNC(max_logit, mask));
  }
  if (write && lane == 0) red[warp] = max_logit;
  __syncthreads();
  max_logit = lane < NUM_WARPS ? red[lane] : -FLT_MAX;
#pragma unroll
  for (int mask = NUM_WARPS / 2; mask >= 1; mask /= 2) {
    max_logit = fmaxf(max_logit, VLLM_SHFL_XOR_SYNC(max_logit, mask));
  }
  return VLLM_SHFL_SYNC(max_logit, 0);
}
template <typename scalar_t, int HEAD_SIZE, int NUM_THREADS, int PARTITION_SIZE, int G,
          int CTA_WARPS>
__device__ __forceinline__ void reduce_in_twin(
    scalar_t* __restrict__ out, const float* exp_sums, const float* max_logits,
    const scalar_t* tmp_out, unsigned int* counter, const int num_partitions, const int seq_idx,
    const int first_head, const int live, const int num_heads, const int max_num_partitions,
    float* __restrict__ scratch, const int scratch_stride, float* __restrict__ red) {
  constexpr int WARP = 32;
  constexpr int NUM_WARPS = NUM_THREADS / WARP;
  constexpr int GROUPS = CTA_WARPS / NUM_WARPS;  // heads reduced at once
  const int group = threadIdx.x / NUM_THREADS;
  const int t = threadIdx.x % NUM_THREADS;
  const int warp = t / WARP;
  const int lane = t % WARP;
  const int64_t seq_first = static_cast<int64_t>(seq_idx) * num_heads;
  __shared__ unsigned int is_last;
  __syncthreads();  // every thread's writes of this partition, before thread 0's release
  if (threadIdx.x == 0) {
    is_last = num_partitions == 1 || arrive(counter) == unsigned(num_partitions - 1);
    if (is_last && num_partitions > 1) *counter = 0u;  // for the next launch
  }
  __syncthreads();  // the other partitions' writes, acquired by thread 0, for every thread
  if (!is_last) return;
  static_assert(HEAD_SIZE <= NUM_THREADS, "one output element per thread of a 128-thread group");
  constexpr int BATCH = 8;  // partitions' outputs loaded at once per thread
  for (int g0 = 0; g0 < G; g0 += GROUPS) {
    const int g = g0 + group;
    const bool active = g < live;  // whole 128-thread groups; the CTA's live heads only
    const int head = first_head + (active ? g : 0);
    const int64_t at = (seq_first + head) * max_num_partitions;  // (seq, head, partition 0)
    const scalar_t* tmp_out_ptr = tmp_out + at * HEAD_SIZE;
    scalar_t* out_ptr = out + (seq_first + head) * HEAD_SIZE;
    if (num_partitions == 1) {
      if (active && t < HEAD_SIZE) out_ptr[t] = load_l2(tmp_out_ptr + t);
      continue;
    }
    // Everything this thread reads first, requested at once (one trip to L2 when the sequence
    // has at most NUM_THREADS partitions and BATCH of them): its partition's max logit and exp
    // sum, and its output element of the first BATCH partitions. The arithmetic below is
    // vLLM's, in vLLM's order, whichever load a value came from.
    const bool first_part = active && t < num_partitions;
    const float max_logit0 = first_part ? load_l2(max_logits + at + t) : -FLT_MAX;
    const float exp_sum0 = first_part ? load_l2(exp_sums + at + t) : 0.0f;
    scalar_t part[BATCH];
#pragma unroll
    for (int j = 0; j < BATCH; ++j) {
      if (active && t < HEAD_SIZE && j < num_partitions) {
        part[j] = load_l2(tmp_out_ptr + j * HEAD_SIZE + t);
      }
    }
    float* shared_max_logits = scratch + (active ? g : 0) * scratch_stride;
    float* shared_exp_sums = shared_max_logits + num_partitions;
    float* red_smem = red + (active ? g : 0) * 2 * CTA_WARPS;
    float max_logit = -FLT_MAX;
    if (active) {
      for (int i = t; i < num_partitions; i += NUM_THREADS) {
        const float l = i == t ? max_logit0 : load_l2(max_logits + at + i);
        shared_max_logits[i] = l;
        max_logit = fmaxf(max_logit, l);
      }
    }
    __syncthreads();
    max_logit = reduce_max_logit<NUM_WARPS>(max_logit, red_smem, warp, lane, active);
    float global_exp_sum = 0.0f;
    if (active) {
      for (int i = t; i < num_partitions; i += NUM_THREADS) {
        float l = shared_max_logits[i];
        float rescaled_exp_sum =
            (i == t ? exp_sum0 : load_l2(exp_sums + at + i)) * expf(l - max_logit);
        global_exp_sum += rescaled_exp_sum;
        shared_exp_sums[i] = rescaled_exp_sum;
      }
    }
    __syncthreads();
    // vllm::block_sum<NUM_WARPS> over this group's warps (its own rows of red_smem).
#pragma unroll
    for (int mask = WARP / 2; mask >= 1; mask /= 2) {
      global_exp_sum += VLLM_SHFL_XOR_SYNC(global_exp_sum, mask);
    }
    if (active && lane == 0) red_smem[NUM_WARPS + warp] = global_exp_sum;
    __syncthreads();
    if (lane < NUM_WARPS) global_exp_sum = red_smem[NUM_WARPS + lane];
#pragma unroll
    for (int mask = NUM_WARPS / 2; mask >= 1; mask /= 2) {
      global_exp_sum += VLLM_SHFL_XOR_SYNC(global_exp_sum, mask);
    }
    global_exp_sum = VLLM_SHFL_SYNC(global_exp_sum, 0);
    const float inv_global_exp_sum = __fdividef(1.0f, global_exp_sum + 1e-6f);
    if (active && t < HEAD_SIZE) {
      // vLLM's sum over the partitions in order.
      float acc = 0.0f;
      for (int j0 = 0; j0 < num_partitions; j0 += BATCH) {
        if (j0 > 0) {
#pragma unroll
          for (int j = 0; j < BATCH; ++j) {
            if (j0 + j < num_partitions) {
              part[j] = load_l2(tmp_out_ptr + (j0 + j) * HEAD_SIZE + t);
            }
          }
        }
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
          if (j0 + j < num_partitions) {
            acc += vllm::to_float(part[j]) * shared_exp_sums[j0 + j] * inv_global_exp_sum;
          }
        }
      }
      vllm::from_float(out_ptr[t], acc);
    }
  }
}

// A twin CTA's query heads: up to G consecutive heads of one kv head. A kv head's `per_kv`
// heads take cdiv(per_kv, G) CTAs (the grid's x: twin_heads, launch_policy.cuh), G heads each
// but the last, which holds the rest: `live` of its G slots (Qwen2.5-7B's 7 heads per kv head:
// 4 + 3). The CTA's index is read with a volatile move each call, so that each call computes
// these anew where it is made instead of ptxas holding them in registers across the passes
// (held, they cost a 128-register twin 8-24 bytes of stack).
struct HeadGroup {
  int kv_head;    // the kv head the CTA reads
  int first;      // its first query head
  int live;       // its heads: first .. first + live - 1
  int num_heads;  // the model's query heads (one GPU's)
};
template <int G>
__device__ __forceinline__ HeadGroup head_group(const int num_kv_heads, const int per_kv) {
  unsigned int cta;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(cta));
  const int groups_per_kv = static_cast<int>(gridDim.x) / num_kv_heads;
  const int kv_head = static_cast<int>(cta) / groups_per_kv;
  const int group_first = (static_cast<int>(cta) - kv_head * groups_per_kv) * G;
  return {kv_head, kv_head * per_kv + group_first, cmin(G, per_kv - group_first),
          num_kv_heads * per_kv};
}
