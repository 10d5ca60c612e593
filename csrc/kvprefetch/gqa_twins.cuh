// kvprefetch: GQA-grouped twins of vLLM v0.10.2's paged attention decode kernel, with outputs
// bitwise equal to vLLM's own kernels.
//
// Why. vLLM's kernels run one CTA per (query head, sequence[, partition]), so the
// num_heads / num_kv_heads query heads of a GQA group each read the same K and V: for
// Llama-3.1-8B (4 query heads per kv head) every KV byte crosses the L2-to-SM path 4 times.
// On Hopper that path, not DRAM, is what large steps wait on (Nsight Compute: L2 throughput
// near its peak, DRAM well below; with every KV load an L2 hit stock runs only a little
// faster). Sharing the loads through L1 instead (several stock CTAs in one) measured slower.
//
// What. One CTA of S x NUM_THREADS threads per (GQA group of G query heads, sequence[,
// partition]): each warp loads a block's K (then V) once and computes all G heads with it. For
// every head the arithmetic is vLLM's, operation for operation: the same thread group and lane
// compute the same token's dot product with the same vllm::Qk_dot; the softmax and its max/sum
// reductions (vllm::block_sum) run over stock's 128-thread layout; stock's warp w adds the V
// products of its blocks w, w + 4, ... in that order (with S > 1 the CTA's other warps compute
// some of those products and hand them over in shared memory), and the cross-warp output
// reduction is stock's. So each head's output is bitwise the stock kernel's (bench kernel and
// verify-kernel check it). G > 1 reads each K/V chunk once instead of G times (large steps
// wait on the L2-to-SM path); S > 1 cuts each warp's chain of blocks S times (small grids wait
// on it: at b8 x 512 each of stock's warps walks 8 blocks one after the other).
//
// Where. The twins of rules.inc (kTwins, launch_policy.cuh), compiled beside the
// instantiations twin_rule names (rules.inc's KVP_TWIN_AT head and block sizes, fp16 caches,
// bf16 in v2 and in unbounded v1, no block sparsity) and launched by the launchers
// (launch_grouped_v1/_v2, from the first line the patch adds to each launcher's launch macro,
// so that a build narrowed to some head sizes compiles the twins of those only) when the
// model has at least G query heads per kv head (any number: a kv head's last CTA holds what
// is left of its heads); `auto` picks the twin by the grid's stock CTAs per SM (auto_twin).
// KVPREFETCH_GQA=off|auto|on|<twin name> at run time. The S = 2 twins also come staged: each
// warp's next K/V block is copied into a shared-memory ring with Hopper's bulk copy
// ("Staging", below). vLLM's kernels are untouched; this header is included by the two
// launchers after attention_kernels.cuh.
//
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cfloat>
#include <cstdint>
#include <cstring>
#include <atomic>
#include <mutex>
#include <type_traits>

// vLLM's attention_kernels.cuh (no include guard) must come first: the launchers include this
// header right after it.
#include "launch_policy.cuh"
#include "stock_v1.cuh"

namespace kvprefetch {
// Everything here has internal linkage: each tree's library is loaded into one benchmark
// process, and a function-local static of an inline function with external linkage (the
// KVPREFETCH_GQA mode) is unified across libraries by the dynamic loader (STB_GNU_UNIQUE),
// so one tree's compiled-in default would silently apply to all.
namespace {

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

// Grid: (num_kv_heads * cdiv(num_queries_per_kv, G), num_seqs, max_num_partitions) (twin_heads,
// launch_policy.cuh); PARTITION_SIZE 0 is v1. `logits_stride`: floats of dynamic shared memory
// per head (stock's shared_mem_size / 4). The comments name the step of vLLM's
// paged_attention_kernel each part mirrors.
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

// ---- Host side: whether a launch runs a twin, which one, and the launch -------------------
// The twins and `auto`'s rule: kTwins and auto_twin (launch_policy.cuh).
// KVPREFETCH_GQA=off|auto|on|<twin name>, read once per process (`on` is the first twin, 4x1);
// a named twin runs at every launch it can take. The default:
// -DKVPREFETCH_GQA_DEFAULT_MODE=0 off, 1 on, 2 auto (the default), 3 + i twin i. A launch can
// take a twin when its G is at most the query heads per kv head and its shared memory fits the
// device; otherwise vLLM's kernel runs.
#ifndef KVPREFETCH_GQA_DEFAULT_MODE
  #define KVPREFETCH_GQA_DEFAULT_MODE 2
#endif
static_assert(KVPREFETCH_GQA_DEFAULT_MODE >= 0 && KVPREFETCH_GQA_DEFAULT_MODE < 3 + kNumTwins,
              "KVPREFETCH_GQA_DEFAULT_MODE: 0 off, 1 on, 2 auto, 3 + i twin i");
constexpr int twin_mode_of(const int default_mode) {
  if (default_mode == 0) return kTwinOff;
  if (default_mode == 1) return 0;  // on: 4x1
  if (default_mode == 2) return kTwinAuto;
  return default_mode - 3;
}

#if !defined(USE_ROCM)
// kTwinOff, kTwinAuto or the index of the twin to run.
inline int twin_mode() {
  static const int mode = [] {
    const char* v = std::getenv("KVPREFETCH_GQA");
    bool unknown = false;
    const int m = twin_mode_from(v, twin_mode_of(KVPREFETCH_GQA_DEFAULT_MODE), &unknown);
    if (unknown) {
      std::fprintf(stderr,
                   "kvprefetch: ignoring KVPREFETCH_GQA=%s (use off, auto, on, 4x1, 4x2, 2x2 or "
                   "2x4)\n", v);
    }
    return m;
  }();
  return mode;
}

// Which twin (an index into kTwins) this launch runs, or -1 for vLLM's kernel (twin_pick, with
// the device's SM count and shared memory). `grid`: stock's; `cta_blocks`: the blocks of its
// longest CTA; `smem(i)`: the shared memory twin i needs, bytes; `stock_per_sm`: CTAs per SM
// of stock's code (0: unknown).
template <typename SmemOf>
inline int twin_for(const dim3 grid, const bool partitioned, const int cta_blocks,
                    const int num_kv_heads, const DeviceFacts& f, const SmemOf& smem,
                    const int stock_per_sm) {
  const int mode = twin_mode();
  const int num_heads = static_cast<int>(grid.x);
  if (mode == kTwinOff || num_kv_heads <= 0 || num_heads % num_kv_heads != 0) return -1;
  long long bytes[kNumTwins];
  for (int i = 0; i < kNumTwins; ++i) bytes[i] = smem(i);
  const TwinStep step{1LL * grid.x * grid.y * grid.z, 1LL * grid.x * (grid.y + grid.z - 1),
                      partitioned, cta_blocks, stock_per_sm, static_cast<long long>(grid.y)};
  return twin_pick(mode, step, f.sm_count, num_heads / num_kv_heads, bytes, f.max_smem_optin,
                   f.smem_per_sm);
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
  // v2 where the reduction may run in the twin (KVPREFETCH_TWIN_FUSE; launch_grouped_v2 says
  // where): the final output; nullptr otherwise.
  T* fused_out = nullptr;
};

// Whether the build asks for programmatic dependent launches (KVPREFETCH_TWIN_PDL) and the
// device takes them (Hopper on).
inline bool pdl_on(const DeviceFacts& f) { return KVPREFETCH_TWIN_PDL != 0 && f.cc_major >= 9; }

// Launches kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream
// serialization when `pdl` (see pdl_start); if the launch with it is refused, without.
template <typename... KernelArgs, typename... Args>
void launch_pdl(void (*kernel)(KernelArgs...), const dim3 grid, const dim3 block, const int smem,
                const cudaStream_t stream, const bool pdl, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = pdl ? 1 : 0;
  if (cudaLaunchKernelEx(&config, kernel, static_cast<KernelArgs>(args)...) == cudaSuccess ||
      !pdl) {
    return;
  }
  cudaGetLastError();  // refused with the attribute: launch as vLLM would
  config.numAttrs = 0;
  cudaLaunchKernelEx(&config, kernel, static_cast<KernelArgs>(args)...);
}

// The (G, S) twin's shared memory in bytes, given stock's; a staged twin's with `stages` slots
// per warp (the kernel derives the count back from it).
template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS, int G,
          int S>
constexpr long long twin_smem(const int shared_mem_size, const int stages = 0) {
  const long long before =
      twin_smem_before<T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS, G, S>(shared_mem_size);
  if constexpr (staged<G, S>()) {
    constexpr int CTA_WARPS = NUM_THREADS * S / 32;
    if (stages > 0) {
      return stage_ring_at(before, CTA_WARPS) +
             1LL * stages * CTA_WARPS * HEAD_SIZE * BLOCK_SIZE *
                 static_cast<int>(sizeof(CACHE_T));
    }
  }
  return before;
}

// pdl_reduce_after and twin_reduces, which reduce kernel follows a v2 twin: launch_policy.cuh.

// Counters: kFuseSlots streams per device at once, each (sequence, head group) pairs up to
// kFuseCounters per launch; zero when the module loads, and every launch leaves them zero.
constexpr int kFuseSlots = 8;
constexpr int kFuseCounters = 8192;
template <int N>
__device__ unsigned int fuse_counters[N];
// This stream's counters on device `dev`, or nullptr (the launch then runs a reduce kernel):
// each stream holds a slot of its own from its first launch on, so launches that may run at
// the same time (other streams) never share counters, while one stream's launches run in turn
// (a kernel boundary, or griddepcontrol.wait, orders each after the last CTA's reset). A CUDA
// graph keeps the slot of the stream it was captured on: replaying the same graph on two
// streams at once would race here as it would on its tmp_out, and so would a stream destroyed
// while its launches still run if a new stream got its handle at once. Streams past
// kFuseSlots, and the per-thread default stream (one handle for many streams), get none.
// (A template, so that only the v2 launcher's unit, which calls it, holds the counters.)
template <int N = kFuseSlots * kFuseCounters>
unsigned int* fuse_slot(const int dev, const cudaStream_t stream) {
  if (dev < 0 || dev >= 64 || stream == cudaStreamPerThread) return nullptr;
  static std::mutex lock;
  static unsigned int* base[64] = {};
  static StreamSlots<kFuseSlots> slots[64];
  const std::lock_guard<std::mutex> guard(lock);
  if (base[dev] == nullptr) {
    void* p = nullptr;
    if (cudaGetSymbolAddress(&p, fuse_counters<N>) != cudaSuccess) {
      cudaGetLastError();  // leave no error behind for the caller's check
      return nullptr;
    }
    base[dev] = static_cast<unsigned int*>(p);
  }
  const int slot = slots[dev].take(static_cast<const void*>(stream));
  return slot < 0 ? nullptr : base[dev] + slot * kFuseCounters;
}

// Launches twin kernel `kernel` (a staged one when STAGED) with `smem` bytes of dynamic shared
// memory, for a model of `per_kv` query heads per kv head.
// `counters`: a fused twin's (fuse_slot), else nullptr.
template <auto kernel, bool STAGED, typename T, typename CACHE_T>
void launch_twin_kernel_as(const GqaArgs<T, CACHE_T>& a, const dim3 grid, const int threads,
                           const int smem, const int shared_mem_size, const int per_kv,
                           const cudaStream_t stream, const DeviceFacts& f,
                           unsigned int* counters = nullptr) {
  // A kernel's attributes are set once per device, not per launch: each cudaFuncSetAttribute is
  // host time on every eager step (what it sets stays set). Statics of this template: one set
  // per kernel instantiation.
  static std::atomic<unsigned long long> carveout_set{0};
  static std::atomic<int> smem_set[64];
  const int dev = f.device;
  const bool known = dev >= 0 && dev < 64;
  if constexpr (STAGED) {
    // Shared memory before L1 (the kernels' L1 hit rate is about 1%), so that the CTAs the
    // rings were sized for fit on one SM.
    if (!known || !(carveout_set.load(std::memory_order_relaxed) & (1ull << dev))) {
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared) == cudaSuccess && known) {
        carveout_set.fetch_or(1ull << dev);
      }
    }
  }
  // A CTA's static and dynamic shared memory together may pass 48 KiB only with the opt-in;
  // the twins' static part is at most 3 KiB (a launch of 48 KiB dynamic, the 4x1 twin's at a
  // 3072-token v1 context, failed with "invalid argument" when only the dynamic part was
  // compared with 48 KiB). The opt-in is a maximum, so it is raised only when a launch needs
  // more than the largest set so far.
  if (smem + 3072 > 48 * 1024 &&
      (!known || smem > smem_set[dev].load(std::memory_order_relaxed))) {
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) ==
            cudaSuccess && known) {
      int seen = smem_set[dev].load(std::memory_order_relaxed);
      while (smem > seen && !smem_set[dev].compare_exchange_weak(seen, smem)) {
      }
    }
  }
  launch_pdl(kernel, grid, dim3(threads), smem, stream, pdl_on(f), a.exp_sums,
             a.max_logits, a.out, a.q, a.k_cache, a.v_cache, a.num_kv_heads, a.scale,
             a.block_tables, a.seq_lens, a.max_num_blocks_per_seq, a.alibi_slopes, a.q_stride,
             a.kv_block_stride, a.kv_head_stride,
             shared_mem_size / static_cast<int>(sizeof(float)), counters, a.fused_out, per_kv);
}

// Launches one instantiation of the (G, S) twin with `smem` bytes of dynamic shared memory: the
// fused one where the launch may fuse (a.fused_out), twin_reduces says so for its grid and the
// stream gets counters (fuse_slot). True when the twin does the reduction.
template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS,
          vllm::Fp8KVCacheDataType KV_DTYPE, int PARTITION_SIZE, int G, int S, bool STAGED>
bool launch_twin_kernel(const GqaArgs<T, CACHE_T>& a, const dim3 grid, const int smem,
                        const int shared_mem_size, const int per_kv, const cudaStream_t stream,
                        const DeviceFacts& f) {
  if constexpr (fusable<G, S, PARTITION_SIZE, HEAD_SIZE>()) {
    unsigned int* const counters =
        twin_reduces(true, a.fused_out != nullptr, 1LL * grid.x * grid.y * grid.z, f.sm_count)
            ? fuse_slot(f.device, stream)
            : nullptr;
    if (counters != nullptr) {
      launch_twin_kernel_as<gqa_decode_kernel<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS,
                                              KV_DTYPE, PARTITION_SIZE, G, S, STAGED, true>,
                            STAGED>(a, grid, NUM_THREADS * S, smem, shared_mem_size, per_kv,
                                    stream, f, counters);
      return true;
    }
  }
  launch_twin_kernel_as<gqa_decode_kernel<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS,
                                          KV_DTYPE, PARTITION_SIZE, G, S, STAGED>,
                        STAGED>(a, grid, NUM_THREADS * S, smem, shared_mem_size, per_kv, stream,
                                f);
  return false;
}

// The grid of a twin of G heads per CTA for stock's `stock_grid` (heads x sequences x
// partitions): each kv head's query heads in groups of G (twin_heads; twin_for checked that
// the kv heads divide the heads).
inline dim3 twin_grid(const dim3 stock_grid, const int num_kv_heads, const int g) {
  const int per_kv = static_cast<int>(stock_grid.x) / num_kv_heads;
  return dim3(static_cast<unsigned>(twin_heads(stock_grid.x, per_kv, g)), stock_grid.y,
              stock_grid.z);
}

// The (G, S) twin for a stock grid: staged where it is compiled and two slots per warp fit
// (stage_count), else loading from global. True when the twin does v2's reduction.
template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS,
          vllm::Fp8KVCacheDataType KV_DTYPE, int PARTITION_SIZE, int G, int S>
bool launch_twin(const GqaArgs<T, CACHE_T>& a, const dim3 stock_grid, const int shared_mem_size,
                 const cudaStream_t stream, const DeviceFacts& f) {
  const int per_kv = static_cast<int>(stock_grid.x) / a.num_kv_heads;
  const dim3 grid = twin_grid(stock_grid, a.num_kv_heads, G);
  const long long fixed =
      twin_smem<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS, G, S>(shared_mem_size);
  if constexpr (staged<G, S>()) {
    // The bulk copy and its mbarriers are Hopper's (sm_90 on): before it, never staged.
    const int stages =
        f.cc_major < 9 ? 0
                       : stage_count(1LL * grid.x * grid.y * grid.z, f.sm_count, f.smem_per_sm,
                                     fixed, NUM_THREADS * S / 32,
                                     HEAD_SIZE * BLOCK_SIZE * static_cast<int>(sizeof(CACHE_T)),
                                     PARTITION_SIZE > 0 ? PARTITION_SIZE / BLOCK_SIZE
                                                        : a.max_num_blocks_per_seq);
    if (stages > 0) {
      return launch_twin_kernel<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS, KV_DTYPE,
                                PARTITION_SIZE, G, S, true>(
          a, grid,
          static_cast<int>(twin_smem<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS, G, S>(
              shared_mem_size, stages)),
          shared_mem_size, per_kv, stream, f);
    }
  }
  return launch_twin_kernel<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS, KV_DTYPE,
                            PARTITION_SIZE, G, S, false>(a, grid, static_cast<int>(fixed),
                                                         shared_mem_size, per_kv, stream, f);
}

// Calls f(std::integral_constant<int, i>{}) for twin i of kTwins, so that f can name the
// twin's G and S as template arguments (kTwins[decltype(t)::value]); returns what f returns.
template <int I = 0, typename F>
auto with_twin(const int i, F&& f) {
  if constexpr (I + 1 < kNumTwins) {
    if (i != I) return with_twin<I + 1>(i, f);
  }
  return f(std::integral_constant<int, I>{});
}


// Runs the twin twin_for picks, if any: its index in kTwins, or -1. PARTITION_SIZE 0 is v1.
// `f`: the current device's facts, read here once per launch where a twin may run (the v2
// launcher's reduction uses them too); `reduced`: whether the twin did v2's reduction.
template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE,
          vllm::Fp8KVCacheDataType KV_DTYPE, bool IS_BLOCK_SPARSE, int NUM_THREADS,
          int PARTITION_SIZE>
int launch_some_twin(const dim3 grid, const int shared_mem_size, const cudaStream_t stream,
                     const GqaArgs<T, CACHE_T>& a, DeviceFacts& f, bool& reduced) {
  if constexpr (!has_twins<HEAD_SIZE, BLOCK_SIZE, CACHE_T, int(KV_DTYPE), IS_BLOCK_SPARSE>(
                    PARTITION_SIZE > 0)) {
    return -1;
  } else {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return -1;
    f = device_facts(dev);
    constexpr int kPartitionBlocks = PARTITION_SIZE > 0 ? PARTITION_SIZE / BLOCK_SIZE : 0;
    const int cta_blocks = kPartitionBlocks > 0 ? cmin(a.max_num_blocks_per_seq, kPartitionBlocks)
                                                : a.max_num_blocks_per_seq;
    // stock's CTAs per SM, for outlasts_stock (asked of the runtime once per kernel)
    int stock_per_sm = 0;
    if constexpr (PARTITION_SIZE == 0) {
      stock_per_sm = stock_v1_ctas_per_sm<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS,
                                          KV_DTYPE, IS_BLOCK_SPARSE>(dev, f.smem_per_sm,
                                                                     shared_mem_size);
    } else {
      stock_per_sm =
          resident_ctas_at<vllm::paged_attention_v2_kernel<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE,
                                                           NUM_THREADS, KV_DTYPE,
                                                           IS_BLOCK_SPARSE, PARTITION_SIZE>>(
              dev, NUM_THREADS, f.smem_per_sm, shared_mem_size);
    }
    const int i = twin_for(grid, PARTITION_SIZE > 0, cta_blocks, a.num_kv_heads, f,
                           [&](const int j) {
      return with_twin(j, [&](auto t) {
        constexpr TwinShape twin = kTwins[decltype(t)::value];
        return twin_smem<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS, twin.g, twin.s>(
            shared_mem_size);
      });
    }, stock_per_sm);
    if (i < 0) return -1;
    reduced = with_twin(i, [&](auto t) {
      constexpr TwinShape twin = kTwins[decltype(t)::value];
      return launch_twin<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS, KV_DTYPE,
                         PARTITION_SIZE, twin.g, twin.s>(a, grid, shared_mem_size, stream, f);
    });
    return i;
  }
}

// The first line of the v1 launcher's launch macro (one head size): true when it launched a
// twin (the macro then leaves the launcher's switch).
template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE,
          vllm::Fp8KVCacheDataType KV_DTYPE, bool IS_BLOCK_SPARSE, int NUM_THREADS>
bool launch_grouped_v1(const dim3 grid, const int shared_mem_size, const cudaStream_t stream,
                       const GqaArgs<T, CACHE_T>& a) {
  DeviceFacts f;
  bool reduced = false;  // v1 has no reduction
  return launch_some_twin<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, KV_DTYPE, IS_BLOCK_SPARSE,
                          NUM_THREADS, 0>(grid, shared_mem_size, stream, a, f, reduced) >= 0;
}


// The first line of the v2 launcher's launch macro (one head size): a twin that reduces the
// partitions itself (KVPREFETCH_TWIN_FUSE, where the launch fits: counters for its (sequence,
// head group) pairs, and room for 2 floats per partition in each head's logits;
// launch_twin_kernel decides the rest), else a twin, then the reduction: vLLM's reduce kernel
// as the launcher's macro would have launched it, or with KVPREFETCH_TWIN_PDL=2 kvprefetch's
// where pdl_reduce_after says so.
template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE,
          vllm::Fp8KVCacheDataType KV_DTYPE, bool IS_BLOCK_SPARSE, int NUM_THREADS,
          int PARTITION_SIZE>
bool launch_grouped_v2(const dim3 grid, const int shared_mem_size, const cudaStream_t stream,
                       const GqaArgs<T, CACHE_T>& args, T* out, const dim3 reduce_grid,
                       const int reduce_shared_mem_size, const int max_num_partitions) {
  if constexpr (!has_twins<HEAD_SIZE, BLOCK_SIZE, CACHE_T, int(KV_DTYPE), IS_BLOCK_SPARSE>(
                    true)) {
    return false;
  } else {
    DeviceFacts f;
    GqaArgs<T, CACHE_T> a = args;
    if (KVPREFETCH_TWIN_FUSE && 2LL * max_num_partitions * sizeof(float) <= shared_mem_size &&
        1LL * grid.x * grid.y <= kFuseCounters) {
      // grid.x: stock's heads, so this bounds the (sequence, head group) pairs of every twin.
      a.fused_out = out;
    }
    bool reduced = false;
    const int i = launch_some_twin<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, KV_DTYPE, IS_BLOCK_SPARSE,
                                   NUM_THREADS, PARTITION_SIZE>(grid, shared_mem_size, stream, a,
                                                                f, reduced);
    if (i < 0) return false;
    if (reduced) return true;
    const dim3 twin = twin_grid(grid, a.num_kv_heads, kTwins[i].g);
    const long long twin_ctas = 1LL * twin.x * twin.y * twin.z;
    if constexpr (KVPREFETCH_TWIN_PDL >= 2) {
      if (pdl_on(f) && pdl_reduce_after(twin_ctas, f.sm_count)) {
        launch_pdl(gqa_reduce_kernel<T, HEAD_SIZE, NUM_THREADS, PARTITION_SIZE>, reduce_grid,
                   dim3(NUM_THREADS), reduce_shared_mem_size, stream, true, out, a.exp_sums,
                   a.max_logits, a.out, a.seq_lens, max_num_partitions);
        return true;
      }
    }
    vllm::paged_attention_v2_reduce_kernel<T, HEAD_SIZE, NUM_THREADS, PARTITION_SIZE>
        <<<reduce_grid, dim3(NUM_THREADS), reduce_shared_mem_size, stream>>>(
            out, a.exp_sums, a.max_logits, a.out, a.seq_lens, max_num_partitions);
    return true;
  }
}
#endif  // !USE_ROCM

}  // namespace
}  // namespace kvprefetch
