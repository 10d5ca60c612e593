// A kernel declared the way the `prefetch` patch declares vLLM's paged_attention_v1_kernel:
// KVPREFETCH_KERNEL_BOUNDS(false) between its template head and __global__, with template
// parameters of the same names. tests/test_sass.py compiles it for sm_90 with and without
// -DSAMPLE_PLAIN (no bound line at all, i.e. stock) for a head size the rule leaves alone and
// one it bounds: the cubins must be byte-identical for the first and differ for the second.
#define KVPREFETCH_LAUNCHER_ONLY 1  // no device state: the cubin holds the kernel alone
#include "prefetch_ptx.cuh"

namespace vllm {
enum class Fp8KVCacheDataType { kAuto = 0, kFp8E4M3 = 1, kFp8E5M2 = 2 };

template <typename cache_t, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS,
          Fp8KVCacheDataType KV_DTYPE>
#ifndef SAMPLE_PLAIN
KVPREFETCH_KERNEL_BOUNDS(false)
#endif
__global__ void sample_kernel(float* __restrict__ out, const cache_t* __restrict__ k,
                              const int n) {
  float acc[HEAD_SIZE / 16] = {};
  for (int i = threadIdx.x; i < n; i += NUM_THREADS) {
#pragma unroll
    for (int j = 0; j < HEAD_SIZE / 16; j++) acc[j] += float(k[(i * HEAD_SIZE + j) % n]);
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < HEAD_SIZE / 16; j++) s += acc[j] * float(BLOCK_SIZE);
  out[blockIdx.x * NUM_THREADS + threadIdx.x] = s;
}

template __global__ void sample_kernel<unsigned short, SAMPLE_HEAD, 16, 128,
                                       Fp8KVCacheDataType::kAuto>(float*, const unsigned short*,
                                                                  int);
}  // namespace vllm
