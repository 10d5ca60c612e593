// kvprefetch: the `prefetch` variant's in-kernel prologue for vLLM's v2 (partitioned) kernels.
// Before its loop over the blocks, each warp's lanes ask the bulk-copy engine for the K and V
// chunks of the blocks the warp will walk. Which instantiations carry it: prologue_rule
// (launch_policy.cuh). In `auto` it does not run (rules.inc's kAutoMaxCtasPct is 0: the
// launcher's prefetch kernel, launcher_prefetch.cuh, was faster at every grid where it used to
// run); it runs with KVPREFETCH=on. It stays compiled in because with it ptxas issues all of a
// block's K loads before their first use, which makes those kernels faster on its own.
// Nothing is added inside the loop.
//
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "l2_prefetch.cuh"
#include "launch_policy.cuh"

namespace kvprefetch {

#if !KVPREFETCH_LAUNCHER_ONLY
namespace {
// One copy per translation unit (non-relocatable device code), written at most once per
// device by that unit's launcher before its first eager launch. In global memory, not in a
// __constant__: a user constant bank in the module made every kernel launched from it slower
// on short steps, the instruction-identical ones included.
__device__ int kvprefetch_mode = KVPREFETCH_DEFAULT_MODE;
}  // namespace

// Whether this launch prefetches. Uniform over the CTA and computed from what every thread
// knows (grid shape, the SM count in %nsmid, `group_size` = query heads per kv head), so
// gating costs a few uniform instructions. Only the first CTA of a GQA group issues requests
// (prefetch_prologue): the others find the chunks on their way into L2.
__device__ __forceinline__ bool prefetch_enabled(const int group_size) {
#if KVPREFETCH_HAS_BULK_PREFETCH
  const int mode = kvprefetch_mode;
  if (mode != 2) return mode == 1;
  unsigned int nsm;
  asm("mov.u32 %0, %%nsmid;" : "=r"(nsm));
  const unsigned int ctas = gridDim.x * gridDim.y * gridDim.z;
  const unsigned int issuing = ctas / static_cast<unsigned int>(group_size);
  return 100u * ctas <= kAutoMaxCtasPct * nsm && 100u * issuing <= kAutoMaxIssuingPct * nsm;
#else
  (void)group_size;
  return false;
#endif
}
#endif  // !KVPREFETCH_LAUNCHER_ONLY

// ---- The prefetch base: the cache address, without capturing the cache pointer -----------
// Any use of a k_cache/v_cache-derived address in an asm operand (or a ptrtoint) *captures* the
// kernel argument. NVVM then can no longer prove the cache read-only and drops the read-only
// path for K/V loads of the kernel (`LDG.E.64.CONSTANT` becomes plain `LDG.E.64`).
//
// So the prefetches take their base addresses from a small device table instead: each launcher
// registers the cache tensors it is called with (before_launch, host side, once per tensor),
// and each warp finds its cache in the table by *comparing pointers*, which is not a capture.
// The table's entry is numerically the same address, but to the compiler it is a value loaded
// from unrelated memory, so k_cache and v_cache stay read-only (verify-kernel checks the
// `.CONSTANT` loads against stock). A cache that is not in the table (table full, first launch
// inside a CUDA graph capture) gets no prefetch: the kernel is then exactly as fast as stock.
static_assert(kBaseSlots % 32 == 0 && kBaseSlots > 0,
              "kBaseSlots must be a positive multiple of 32");

// The table's copies of k_cache and v_cache (see prefetch_bases).
template <typename T>
struct PrefetchBases {
  const T* k = nullptr;
  const T* v = nullptr;
};

#if !KVPREFETCH_LAUNCHER_ONLY
namespace {
// One table per translation unit, like kvprefetch_mode; written only by register_base.
__device__ const void* kvprefetch_bases[kBaseSlots];
}  // namespace

// The table's copies of k_cache and v_cache, or nullptr for each when this launch does not
// prefetch (prefetch_enabled) or that cache is not registered. Must be called by all 32 lanes
// of the warp together: each lane compares kBaseSlots/32 entries (their loads in flight
// together) against both pointers, then one ballot per cache.
template <typename T>
__device__ __forceinline__ const T* table_entry(const int hit) {
  const unsigned found = __ballot_sync(0xffffffffu, hit >= 0);
  if (found == 0u) return nullptr;
  const int slot = __shfl_sync(0xffffffffu, hit, __ffs(found) - 1);
  return static_cast<const T*>(kvprefetch_bases[slot]);
}

template <typename T>
__device__ __forceinline__ PrefetchBases<T> prefetch_bases(const T* k_cache, const T* v_cache,
                                                           const int lane, const int group_size) {
  PrefetchBases<T> bases;
#if KVPREFETCH_HAS_BULK_PREFETCH
  if (!prefetch_enabled(group_size)) return bases;
  int k_hit = -1, v_hit = -1;
  #pragma unroll
  for (int i = 0; i < kBaseSlots / 32; ++i) {
    const int slot = i * 32 + lane;
    const void* entry = kvprefetch_bases[slot];
    if (entry == static_cast<const void*>(k_cache)) k_hit = slot;
    if (entry == static_cast<const void*>(v_cache)) v_hit = slot;
  }
  bases.k = table_entry<T>(k_hit);
  bases.v = table_entry<T>(v_hit);
#else
  (void)k_cache; (void)v_cache; (void)lane; (void)group_size;
#endif
  return bases;
}
#endif  // !KVPREFETCH_LAUNCHER_ONLY

// Called by all 32 lanes of a warp right before its loop over the blocks first_block_idx,
// first_block_idx + STRIDE, ... < end_block_idx (STRIDE = NUM_WARPS); `bases` from
// prefetch_bases, `head_offset` = kv_head_idx * kv_head_stride. Lane l requests the K and the
// V chunk of the warp's blocks l, l+32, ... (kPrologueRounds rounds at most, so a whole v2
// partition); returns a token for consume_token.
//  - The bound is end_block_idx (this partition's end), an index: block_table is never read
//    past the sequence's row, and physical block 0 is prefetched like any other (the original
//    patch's "next block 0 = none" sentinel skipped a real block).
//  - Block numbers widen to int64 before the multiply, as vLLM does for its own loads.
template <int HEAD_SIZE, int BLOCK_SIZE, int STRIDE, typename cache_t>
__device__ __forceinline__ unsigned prefetch_warp_blocks(
    const PrefetchBases<cache_t> bases, const int* __restrict__ block_table,
    const int first_block_idx, const int end_block_idx, const int64_t kv_block_stride,
    const int64_t head_offset, const int lane) {
  unsigned token = 0;
#if KVPREFETCH_HAS_BULK_PREFETCH
  static_assert(kPrologueRounds >= 1, "kPrologueRounds must be >= 1");
  constexpr uint32_t kBytes = KvChunk<HEAD_SIZE, BLOCK_SIZE, cache_t>::kBytes;
  if (bases.k == nullptr && bases.v == nullptr) return 0;
  #pragma unroll 1
  for (int round = 0; round < kPrologueRounds; ++round) {
    const int k = round * 32 + lane;
    const int idx = first_block_idx + k * STRIDE;
    if (idx >= end_block_idx) break;
    const int64_t offset =
        static_cast<int64_t>(block_table[idx]) * kv_block_stride + head_offset;
    if (bases.k != nullptr) token |= l2_prefetch_bulk<kBytes>(bases.k + offset);
    if (bases.v != nullptr) token |= l2_prefetch_bulk<kBytes>(bases.v + offset);
  }
#else
  (void)bases; (void)block_table; (void)first_block_idx; (void)end_block_idx;
  (void)kv_block_stride; (void)head_offset; (void)lane;
#endif
  return token;
}

// What the patch calls: prefetch_bases + prefetch_warp_blocks, from the first CTA of each GQA
// group only (`group_rank` of `group_size`, adjacent in blockIdx.x, so they run together): the
// group's other CTAs read the same chunks and find them on their way into L2, and repeating
// the requests per CTA measured slower.
template <int HEAD_SIZE, int BLOCK_SIZE, int STRIDE, typename cache_t>
__device__ __forceinline__ unsigned prefetch_prologue(
    const cache_t* k_cache, const cache_t* v_cache, const int* __restrict__ block_table,
    const int first_block_idx, const int end_block_idx, const int64_t kv_block_stride,
    const int64_t head_offset, const int lane, const int group_rank, const int group_size)
#if KVPREFETCH_LAUNCHER_ONLY
    ;  // declared for the kernel's discarded `if constexpr` branch; never instantiated here
#else
{
  if (group_rank != 0) return 0;
  return prefetch_warp_blocks<HEAD_SIZE, BLOCK_SIZE, STRIDE>(
      prefetch_bases(k_cache, v_cache, lane, group_size), block_table, first_block_idx,
      end_block_idx, kv_block_stride, head_offset, lane);
}
#endif

// ---- Host side, called by the v2 launcher before it launches ------------------------------
// Applies KVPREFETCH=off|on|auto from the environment, read once per process. Nothing is
// written when it asks for the compiled-in default, or while the stream is being captured into
// a CUDA graph (vLLM's warm-up runs eagerly first, so the setting is in place before capture).
#if !defined(USE_ROCM) && !KVPREFETCH_LAUNCHER_ONLY
namespace {
std::atomic<unsigned long long> kvprefetch_devices_set{0};

inline void sync_runtime_mode(cudaStream_t stream) {
  static const int mode = kvprefetch_host_mode();
  if (mode == KVPREFETCH_DEFAULT_MODE) return;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev >= 64) return;
  const unsigned long long bit = 1ull << dev;
  if (kvprefetch_devices_set.load() & bit) return;
  if (capturing_or_unknown(stream)) return;
  if (cudaMemcpyToSymbolAsync(kvprefetch_mode, &mode, sizeof(int), 0,
                              cudaMemcpyHostToDevice, stream) == cudaSuccess) {
    kvprefetch_devices_set.fetch_or(bit);
  } else {
    (void)cudaGetLastError();  // ours: do not leave it for the next launch check
  }
}

// The host half of prefetch_bases: which cache tensors this translation unit's table holds, per
// device. A new tensor takes the next slot round-robin (the oldest entry is overwritten: it is
// only ever used when it equals the kernel's own pointer, so a stale entry is harmless) and is
// written with one 8-byte copy on the launch stream, ordered before the kernel that needs it.
// vLLM calls each layer's cache with the same tensors every step, so after the first decode
// step (eager, before any CUDA graph capture) nothing more is copied.
struct BaseRegistry {
  std::mutex mu;
  std::unordered_map<const void*, int> slot_of;
  const void* slots[kBaseSlots] = {};  // also the copies' host source
  int next = 0;
};

inline void register_base(cudaStream_t stream, int dev, const void* ptr) {
  static BaseRegistry registries[64];
  if (ptr == nullptr || dev < 0 || dev >= 64) return;
  BaseRegistry& r = registries[dev];
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.slot_of.count(ptr) != 0) return;
  const int slot = r.next;
  if (r.slots[slot] != nullptr) r.slot_of.erase(r.slots[slot]);
  r.slots[slot] = ptr;
  if (cudaMemcpyToSymbolAsync(kvprefetch_bases, &r.slots[slot], sizeof(void*),
                              slot * sizeof(void*), cudaMemcpyHostToDevice,
                              stream) != cudaSuccess) {
    (void)cudaGetLastError();  // ours; this cache simply gets no prefetch
    r.slots[slot] = nullptr;
    return;
  }
  r.slot_of.emplace(ptr, slot);
  r.next = (slot + 1) % kBaseSlots;
}

// Called by the v2 launcher (paged_attention_v2.cu) right before its launch: applies
// KVPREFETCH once, then registers the two cache tensors for prefetch_bases. Nothing is
// registered when the prologue cannot run (KVPREFETCH=off, or `auto` while kAutoMaxCtasPct
// is 0), before Hopper, or while the stream is being captured.
inline void before_launch(cudaStream_t stream, const void* k_cache, const void* v_cache) {
  sync_runtime_mode(stream);
  const int mode = kvprefetch_host_mode();
  if (mode == 0 || (mode == 2 && kAutoMaxCtasPct == 0)) return;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || device_facts(dev).cc_major < 9) return;
  if (capturing_or_unknown(stream)) return;
  register_base(stream, dev, k_cache);
  register_base(stream, dev, v_cache);
}
}  // namespace
#endif  // !USE_ROCM && !KVPREFETCH_LAUNCHER_ONLY

}  // namespace kvprefetch
