// A kernel declared the way the `prefetch` patch declares vLLM's paged_attention_v1_kernel:
// KVPREFETCH_KERNEL_BOUNDS(false) between its template head and __global__, with the same name,
// namespace and template parameters (so verify-kernel reads its mangled name as vLLM's; the
// body and arguments are a stand-in). tests/test_sass.py compiles it for sm_90 with and without
// -DSAMPLE_PLAIN (no bound line at all, i.e. stock) for a head size the rule leaves alone and
// one it bounds: the cubins must be byte-identical for the first and differ for the second,
// and verify-kernel's launch-bounds check must find the bound exactly where the rule puts it.
#define KVPREFETCH_LAUNCHER_ONLY 1  // no device state: the cubin holds the kernel alone
#include "kvprefetch/prefetch.cuh"

namespace vllm {
enum class Fp8KVCacheDataType { kAuto = 0, kFp8E4M3 = 1, kFp8E5M2 = 2 };

template <typename scalar_t, typename cache_t, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS,
          Fp8KVCacheDataType KV_DTYPE, bool IS_BLOCK_SPARSE>
#ifndef SAMPLE_PLAIN
KVPREFETCH_KERNEL_BOUNDS(false)
#endif
__global__ void paged_attention_v1_kernel(float* __restrict__ out,
                                          const cache_t* __restrict__ k, const int n) {
  float acc[HEAD_SIZE / 16] = {};
  for (int i = threadIdx.x; i < n; i += NUM_THREADS) {
#pragma unroll
    for (int j = 0; j < HEAD_SIZE / 16; j++) acc[j] += float(k[(i * HEAD_SIZE + j) % n]);
  }
  float s = IS_BLOCK_SPARSE ? 1.f : 0.f;
#pragma unroll
  for (int j = 0; j < HEAD_SIZE / 16; j++) s += acc[j] * float(BLOCK_SIZE);
  out[blockIdx.x * NUM_THREADS + threadIdx.x] = s;
}

template __global__ void paged_attention_v1_kernel<unsigned short, unsigned short, SAMPLE_HEAD, 16,
                                                   128, Fp8KVCacheDataType::kAuto, false>(
    float*, const unsigned short*, int);
}  // namespace vllm
