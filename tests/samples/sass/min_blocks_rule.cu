// Prints what csrc/prefetch_ptx.cuh compiles into every paged_attention instantiation vLLM
// v0.10.2 builds: the launch bound (kvprefetch::min_blocks, behind KVPREFETCH_KERNEL_BOUNDS),
// whether the prologue is compiled in (kvprefetch::prologue_compiled) and whether the
// GQA-grouped twins are (kvprefetch::has_twins; block-sparse kernels never have them).
// One line per instantiation: "version head block cache kv_dtype min_blocks prologue twins",
// cache one of fp16, bf16, fp32, u8. Then the twins, "twin G S min_ctas_pct name" each,
// `auto`'s pick for a range of grids, "auto ctas_pct index", KVPREFETCH_GQA's parsing and
// twin_pick's answers (the lines "mode ..." and "pick ...") and the staged twins' ring slots
// (stage_count, "stage ..."), then which reduction follows a v2 twin ("reduce ...":
// pdl_reduce_after, twin_reduces) and the per-stream counter slots ("slot ...": StreamSlots).
// Host code only: it runs on a
// machine without a GPU. tests/test_sass.py compiles it with nvcc, with and without overrides,
// and compares the tables with kvprefetch.upstream.min_blocks / prefetches_in / twin_shapes /
// TWIN_SHAPES / auto_twin (what verify-kernel expects, and what the docs describe).
#define KVPREFETCH_LAUNCHER_ONLY 1
#include <cstdio>
#include <cuda_bf16.h>
#include "prefetch_ptx.cuh"

template <int HEAD, int BLOCK, typename cache_t, int KV>
void row(const char* cache) {
  for (const bool partitioned : {false, true}) {
    std::printf("%s %d %d %s %d %d %d %d\n", partitioned ? "v2" : "v1", HEAD, BLOCK, cache, KV,
                kvprefetch::min_blocks<HEAD, BLOCK, int(sizeof(cache_t)), KV>(partitioned),
                int(kvprefetch::prologue_compiled<HEAD, cache_t>(partitioned, KV == 0)),
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
  for (long long pct = 0; pct <= 3000; pct += 25) {
    std::printf("auto %lld %d\n", pct, kvprefetch::auto_twin(pct));
  }
  // KVPREFETCH_GQA's values as modes (fallback 99), "mode VALUE MODE UNKNOWN"; "-" = unset.
  for (const char* v : {"-", "", "off", "auto", "on", "4x1", "4x2", "2x2", "2x4", "ON", "3x3"}) {
    bool unknown = false;
    const int m = kvprefetch::twin_mode_from(v[0] == '-' ? nullptr : v, 99, &unknown);
    std::printf("mode %s %d %d\n", v[0] ? v : "''", m, int(unknown));
  }
  // twin_pick: "pick MODE CTAS_PCT PER_KV SMEM_LIMIT TWIN" over modes, grids, GQA ratios, limits;
  // twin i needs (i + 1) * 10000 bytes of shared memory.
  const long long smem[] = {10000, 20000, 30000, 40000};
  for (const int mode : {kvprefetch::kTwinOff, kvprefetch::kTwinAuto, 0, 1, 2, 3}) {
    for (const long long pct : {24, 194, 776, 1551}) {
      for (const int per_kv : {1, 2, 4, 8}) {
        for (const long long limit : {25000LL, 232448LL}) {
          std::printf("pick %d %lld %d %lld %d\n", mode, pct, per_kv, limit,
                      kvprefetch::twin_pick(mode, pct, per_kv, smem, limit));
        }
      }
    }
  }
  // stage_count: "stage CTAS SM_COUNT SMEM_PER_SM FIXED CTA_WARPS CHUNK BLOCKS SLOTS" over grids,
  // shared memory besides the ring, warps per CTA and blocks per CTA (the H200: 132 SMs,
  // 233472 bytes each; a smaller part: 32 SMs, 101376 bytes).
  for (const int sms : {132, 32}) {
    const long long per_sm = sms == 132 ? 233472 : 101376;
    for (const long long ctas : {64LL, 128LL, 256LL, 512LL, 1024LL}) {
      for (const long long fixed : {4096LL, 12288LL, 24576LL, 40960LL, 81920LL}) {
        for (const int warps : {8, 16}) {
          for (const int blocks : {1, 8, 32, 64, 256}) {
            std::printf("stage %lld %d %lld %lld %d %d %d %d\n", ctas, sms, per_sm, fixed,
                        warps, 4096, blocks,
                        kvprefetch::stage_count(ctas, sms, per_sm, fixed, warps, 4096, blocks));
          }
        }
      }
    }
  }
  // "reduce TWIN_CTAS SM_COUNT PDL_REDUCE TWIN_REDUCES" (twin_reduces for a fusable twin where
  // the launcher allows it; "reduce-off ..." where it does not, and for a twin not fusable).
  for (const int sms : {132, 114, 16}) {
    for (const long long ctas : {8LL, 32LL, 57LL, 58LL, 65LL, 66LL, 67LL, 100LL, 114LL, 115LL,
                                 128LL, 132LL, 133LL, 256LL, 1024LL}) {
      std::printf("reduce %lld %d %d %d\n", ctas, sms,
                  int(kvprefetch::pdl_reduce_after(ctas, sms)),
                  int(kvprefetch::twin_reduces(true, true, ctas, sms)));
      std::printf("reduce-off %lld %d %d %d\n", ctas, sms,
                  int(kvprefetch::twin_reduces(true, false, ctas, sms)),
                  int(kvprefetch::twin_reduces(false, true, ctas, sms)));
    }
  }
  // "slot KEY SLOT": StreamSlots<8>.take over ten streams, then two of them again.
  kvprefetch::StreamSlots<8> slots;
  static char streams[10];
  for (const int k : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 5, 8}) {
    std::printf("slot %d %d\n", k, slots.take(&streams[k]));
  }
  return 0;
}
