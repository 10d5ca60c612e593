// Prints what csrc/kvprefetch/launch_policy.cuh compiles into every paged_attention instantiation
// vLLM v0.10.2 builds: the launch bound (kvprefetch::min_blocks, behind
// KVPREFETCH_KERNEL_BOUNDS), whether the prologue is compiled in
// (kvprefetch::prologue_compiled) and whether the GQA-grouped twins are (kvprefetch::has_twins;
// block-sparse kernels never have them), through the templates the kernels use.
// One line per instantiation: "version head block cache kv_dtype min_blocks prologue twins",
// cache one of fp16, bf16, fp32, u8. Then the twins, "twin G S min_ctas_pct name" each,
// KVPREFETCH_GQA's parsing ("mode ...") and the per-stream counter slots ("slot ...":
// StreamSlots).
// Host code only: it runs on a machine without a GPU. tests/integration/test_sass.py compiles it
// with nvcc and compares the tables with kvprefetch.kernels.policy's min_blocks /
// prefetches_in / twin_shapes / TWIN_SHAPES (what verify-kernel expects). The launch-time
// decisions (more_waves_for_some, stock_v1_wins, twin_pick, stage_count, twin_reduces, ...) are
// run on any inputs by policy_oracle.cu, as launch_policy.cuh's comments say.
#define KVPREFETCH_LAUNCHER_ONLY 1
#include <cstdio>
#include <cuda_bf16.h>
#include "kvprefetch/launch_policy.cuh"

template <int HEAD, int BLOCK, typename cache_t, int KV>
void row(const char* cache) {
  for (const bool partitioned : {false, true}) {
    std::printf("%s %d %d %s %d %d %d %d\n", partitioned ? "v2" : "v1", HEAD, BLOCK, cache, KV,
                kvprefetch::min_blocks<HEAD, BLOCK, int(sizeof(cache_t)), KV>(partitioned),
                int(kvprefetch::prologue_compiled<HEAD, BLOCK, cache_t>(partitioned, KV == 0)),
                int(kvprefetch::has_twins<HEAD, BLOCK, cache_t, KV, false>(partitioned)));
  }
}
template <int HEAD, int BLOCK>
void caches() {
  row<HEAD, BLOCK, uint16_t, 0>("fp16");
  row<HEAD, BLOCK, __nv_bfloat16, 0>("bf16");
  row<HEAD, BLOCK, float, 0>("fp32");
  row<HEAD, BLOCK, uint8_t, 1>("u8");  // fp8 e4m3
  row<HEAD, BLOCK, uint8_t, 2>("u8");  // fp8 e5m2
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
  for (const kvprefetch::TwinShape& t : kvprefetch::kTwins) {
    std::printf("twin %d %d %d %s\n", t.g, t.s, t.min_ctas_pct, t.name);
  }
  // KVPREFETCH_GQA's values as modes (fallback 99), "mode VALUE MODE UNKNOWN"; "-" = unset.
  for (const char* v : {"-", "", "off", "auto", "on", "4x1", "4x2", "2x2", "2x4", "ON", "3x3"}) {
    bool unknown = false;
    const int m = kvprefetch::twin_mode_from(v[0] == '-' ? nullptr : v, 99, &unknown);
    std::printf("mode %s %d %d\n", v[0] ? v : "''", m, int(unknown));
  }
  // "slot KEY SLOT": StreamSlots<8>.take over ten streams, then two of them again.
  kvprefetch::StreamSlots<8> slots;
  static char streams[10];
  for (const int k : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 5, 8}) {
    std::printf("slot %d %d\n", k, slots.take(&streams[k]));
  }
  return 0;
}
