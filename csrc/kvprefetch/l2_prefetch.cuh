// kvprefetch: the bulk L2 prefetch instruction (cp.async.bulk.prefetch.L2.global) and what
// keeps the compiler from dropping it or from losing the read-only path of the KV loads.
//
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

namespace kvprefetch {

// One (block, kv-head) chunk of the K or V cache is contiguous in both of vLLM's layouts:
//   K [num_blocks, kv_heads, HEAD/x, BLOCK, x]   V [num_blocks, kv_heads, HEAD, BLOCK]
// so it is HEAD_SIZE * BLOCK_SIZE * sizeof(cache_t) bytes: 256 B .. 32 KiB over vLLM's
// instantiations, not the fixed 4096 B of the original patch (right only for 128 x 16 x 2 B).
template <int HEAD_SIZE, int BLOCK_SIZE, typename cache_t>
struct KvChunk {
  static constexpr uint32_t kBytes =
      static_cast<uint32_t>(HEAD_SIZE) * BLOCK_SIZE * sizeof(cache_t);
  // cp.async.bulk.prefetch: size a multiple of 16 B, at most 1 MiB - 16 (PTX ISA 8.0).
  static_assert(kBytes % 16 == 0, "bulk prefetch size must be a multiple of 16 bytes");
  static_assert(kBytes <= 1048560, "bulk prefetch size must be at most 1 MiB - 16");
};

// True where the bulk L2 prefetch assembles: sm_90 and newer, PTX ISA 8.0 (CUDA >= 12.0).
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && !defined(USE_ROCM)
  #define KVPREFETCH_HAS_BULK_PREFETCH 1
#else
  #define KVPREFETCH_HAS_BULK_PREFETCH 0
#endif

// Ask for BYTES starting at `src` (16-byte aligned) to be brought into L2. A hint only: no
// completion, no register or shared-memory effect, so results are bitwise unchanged.
// On pre-Hopper targets it compiles to nothing, so a TORCH_CUDA_ARCH_LIST such as
// "8.0;9.0a" still builds; the sm_80 kernels are then exactly stock.
//
// Why the asm is NOT volatile and returns a token: an `asm volatile` is a memory side effect
// to NVVM. A non-volatile asm with an output is side-effect free to the compiler; its output
// (always 0) is folded into a token that the kernel "uses" in a never-taken shared-memory store
// (consume_token), so the asm is kept. The address it is given must not be derived from the
// kernel's k_cache/v_cache arguments either: see prefetch_bases (prologue.cuh).
template <uint32_t BYTES>
__device__ __forceinline__ unsigned l2_prefetch_bulk(const void* src) {
  unsigned token = 0;
#if KVPREFETCH_HAS_BULK_PREFETCH
  const unsigned long long addr = reinterpret_cast<unsigned long long>(src);
  asm("cp.async.bulk.prefetch.L2.global [%1], %2;\n\tmov.u32 %0, 0;"
      : "=r"(token) : "l"(addr), "n"(BYTES));
#else
  (void)src;
#endif
  return token;
}

// The same request with a run-time size, as a memory side effect (`asm volatile`): for a
// kernel that needs nothing else of the compiler (kv_l2_prefetch_kernel, launcher_prefetch.cuh).
// Compiles to nothing before sm_90.
__device__ __forceinline__ void l2_prefetch_bytes(const void* src, const uint32_t bytes) {
#if KVPREFETCH_HAS_BULK_PREFETCH
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes));
#else
  (void)src; (void)bytes;
#endif
}

// Keeps the prefetches alive (see l2_prefetch_bulk): a store that never happens, to shared
// memory, which cannot alias the KV cache.
__device__ __forceinline__ void consume_token(const unsigned token, float* shared_scratch) {
  if (token == 0x5eedu) shared_scratch[0] = 0.f;
}

}  // namespace kvprefetch
