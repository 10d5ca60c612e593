// Prints the launch bound csrc/prefetch_ptx.cuh declares for every paged_attention instantiation
// vLLM v0.10.2 compiles (kvprefetch::min_blocks, the compile-time rule behind
// KVPREFETCH_KERNEL_BOUNDS): one line per instantiation, "version head block cache_bytes
// kv_dtype min_blocks". Host code only: it runs on a machine without a GPU. tests/test_sass.py
// compiles it with nvcc, with and without -DKVPREFETCH_V1_MIN_BLOCKS, and compares the table
// with kvprefetch.upstream.min_blocks (what verify-kernel expects).
#define KVPREFETCH_LAUNCHER_ONLY 1
#include <cstdio>
#include "prefetch_ptx.cuh"

template <int HEAD, int BLOCK, int BYTES, int KV>
void row() {
  std::printf("v1 %d %d %d %d %d\n", HEAD, BLOCK, BYTES, KV,
              kvprefetch::min_blocks<HEAD, BLOCK, BYTES, KV>(false));
  std::printf("v2 %d %d %d %d %d\n", HEAD, BLOCK, BYTES, KV,
              kvprefetch::min_blocks<HEAD, BLOCK, BYTES, KV>(true));
}
template <int HEAD, int BLOCK>
void caches() {
  row<HEAD, BLOCK, 2, 0>();  // fp16 / bf16 cache
  row<HEAD, BLOCK, 4, 0>();  // fp32 cache
  row<HEAD, BLOCK, 1, 1>();  // fp8 e4m3
  row<HEAD, BLOCK, 1, 2>();  // fp8 e5m2
}
template <int HEAD>
void blocks() {
  caches<HEAD, 8>();
  caches<HEAD, 16>();
  caches<HEAD, 32>();
}

int main() {
  blocks<32>(); blocks<64>(); blocks<80>(); blocks<96>(); blocks<112>();
  blocks<120>(); blocks<128>(); blocks<192>(); blocks<256>();
  return 0;
}
