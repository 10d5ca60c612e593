// Prints what csrc/kvprefetch/launch_policy.cuh compiles into every paged_attention instantiation vLLM
// v0.10.2 builds: the launch bound (kvprefetch::min_blocks, behind KVPREFETCH_KERNEL_BOUNDS),
// whether the prologue is compiled in (kvprefetch::prologue_compiled) and whether the
// GQA-grouped twins are (kvprefetch::has_twins; block-sparse kernels never have them).
// One line per instantiation: "version head block cache kv_dtype min_blocks prologue twins",
// cache one of fp16, bf16, fp32, u8. Then the twins, "twin G S min_ctas_pct name" each,
// `auto`'s pick for a range of grids, "auto ctas_pct index", KVPREFETCH_GQA's parsing and
// twin_pick's answers (the lines "mode ..." and "pick ...") and the staged twins' ring slots
// (stage_count, "stage ..."), then which reduction follows a v2 twin ("reduce ...":
// pdl_reduce_after, twin_reduces), where a bounded v1 kernel runs stock's code ("stockv1 ...":
// stock_v1_wins; "waves ...": more_waves_for_some), where a twin could outlast stock's code ("least ...": outlasts_stock) and the
// per-stream counter slots ("slot ...": StreamSlots).
// Host code only: it runs on a
// machine without a GPU. tests/test_sass.py compiles it with nvcc (and with ablation switches)
// and compares the tables with kvprefetch.upstream.min_blocks / prefetches_in / twin_shapes /
// TWIN_SHAPES / auto_twin (what verify-kernel expects, and what the docs describe).
#define KVPREFETCH_LAUNCHER_ONLY 1
#include <cstdio>
#include <utility>
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
  for (long long pct = 0; pct <= 3000; pct += 25) {
    std::printf("auto %lld %d %d\n", pct, kvprefetch::auto_twin(pct),
                kvprefetch::auto_twin(pct, true));
  }
  // KVPREFETCH_GQA's values as modes (fallback 99), "mode VALUE MODE UNKNOWN"; "-" = unset.
  for (const char* v : {"-", "", "off", "auto", "on", "4x1", "4x2", "2x2", "2x4", "ON", "3x3"}) {
    bool unknown = false;
    const int m = kvprefetch::twin_mode_from(v[0] == '-' ? nullptr : v, 99, &unknown);
    std::printf("mode %s %d %d\n", v[0] ? v : "''", m, int(unknown));
  }
  // twin_pick: "pick MODE HEADS KV_HEADS BATCH CONTEXT KERNEL TWIN" over modes and decode steps
  // of head-128, block-16 models on the H200 (132 SMs, 233472 bytes of shared memory each, at
  // most 232448 per CTA), each twin's shared memory as the launchers size it: G times stock's
  // (v1: the padded context's logits; v2: a partition's, at least the output scratch) plus the
  // V products of the warps beyond stock's (gqa_twins.cuh twin_smem_before).
  for (const int mode : {kvprefetch::kTwinOff, kvprefetch::kTwinAuto, 0, 1, 2, 3}) {
    for (const auto& m : {std::pair{32, 32}, std::pair{32, 16}, std::pair{32, 8},
                          std::pair{8, 1}, std::pair{28, 4}, std::pair{40, 8}}) {
      for (const int batch : {1, 8, 32, 64, 96, 123, 128, 256}) {
        for (const int context : {33, 64, 65, 114, 129, 512, 2048, 3072, 4096, 6016, 6032, 7040, 7056,
                                  8192}) {
          for (const bool v2 : {false, true}) {
            const long long logits = v2 ? 512 * 4 : (context + 15) / 16 * 16 * 4;
            const long long stock = logits > 1024 ? logits : 1024;
            long long smem[kvprefetch::kNumTwins];
            for (int i = 0; i < kvprefetch::kNumTwins; ++i) {
              const kvprefetch::TwinShape& t = kvprefetch::kTwins[i];
              smem[i] = t.g * stock + 4LL * (t.s - 1) * 4 * t.g * 8 * 32;
            }
            const int parts = v2 ? (context + 511) / 512 : 1;
            const int blocks = (context + 15) / 16;
            // stock's code: vLLM's head-128 kernels, 96 registers, 5 CTAs per SM (the
            // sample's contexts leave v1's shared memory room for 6)
            const kvprefetch::TwinStep step{1LL * m.first * batch * parts,
                                            1LL * m.first * (batch + parts - 1), v2,
                                            v2 && blocks > 32 ? 32 : blocks, 5, batch};
            std::printf("pick %d %d %d %d %d %s %d\n", mode, m.first, m.second, batch, context,
                        v2 ? "v2" : "v1",
                        kvprefetch::twin_pick(mode, step, 132, m.first / m.second, smem,
                                              232448, 233472));
          }
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
  // "stockv1 HEADS SEQS SM_COUNT BOUNDED STOCK WINS": stock_v1_wins over v1 grids of 8, 28 and
  // 32 heads and the CTAs per SM of the bounded and the unbounded kernel (head 128: 4 and 5;
  // head 64: 6 and 9; head 256: 3 and 3; head 64 at a capture length's shared memory: 6 and 6).
  for (const auto& occ : {std::pair{4, 5}, std::pair{6, 9}, std::pair{3, 3}, std::pair{6, 6}}) {
    for (const int heads : {8, 28, 32}) {
      for (const long long seqs : {1LL, 2LL, 16LL, 17LL, 20LL, 24LL, 40LL, 64LL, 65LL, 66LL,
                                   72LL, 96LL, 128LL, 256LL}) {
        std::printf("stockv1 %d %lld %d %d %d %d\n", heads, seqs, 132, occ.first, occ.second,
                    int(kvprefetch::stock_v1_wins(heads, seqs, 132, occ.first, occ.second)));
      }
    }
  }
  // "waves SEQS STOCK_PER_SEQ STOCK_PER_SM VAR_PER_SEQ VAR_PER_SM SM_COUNT MORE": the closed
  // form of more_waves_for_some over grids of stock's v1 and v2 CTAs per sequence and the
  // bounded kernel's or a twin's (a half, a quarter or a seventh-rounded-up of them), on the
  // H200's 132 SMs and a 16-SM part.
  for (const int sms : {132, 16}) {
    for (const long long seqs : {0LL, 1LL, 5LL, 17LL, 24LL, 40LL, 64LL, 96LL, 256LL}) {
      for (const long long per_seq : {8LL, 28LL, 32LL, 448LL, 512LL}) {
        for (const int stock_per_sm : {0, 5, 6, 9}) {
          for (const long long div : {1LL, 2LL, 4LL}) {
            for (const int var_per_sm : {1, 2, 4, 6}) {
              const long long var_per_seq = (per_seq + div - 1) / div;
              std::printf("waves %lld %lld %d %lld %d %d %d\n", seqs, per_seq, stock_per_sm,
                          var_per_seq, var_per_sm, sms,
                          int(kvprefetch::more_waves_for_some(seqs, per_seq, stock_per_sm,
                                                              var_per_seq, var_per_sm, sms)));
            }
          }
        }
      }
    }
  }
  // "least STOCK_CTAS STOCK_SURE STOCK_PER_SM TWIN_CTAS TWIN_SURE TWIN_PER_SM BLOCKS OUTLASTS":
  // outlasts_stock on the H200's 132 SMs over grids of a 2-head twin (half stock's CTAs) and a
  // 4-head one (a quarter), all or a tenth of their CTAs sure, stock's code at 4-9 CTAs per SM
  // and the twin at 1-4, and the longest CTA's blocks.
  for (const long long ctas : {64LL, 528LL, 1688LL, 3920LL, 6272LL, 24200LL}) {
    for (const long long sure_div : {1LL, 10LL}) {
      for (const long long g : {2LL, 4LL}) {
        for (const int stock_per_sm : {0, 4, 5, 9}) {
          for (const int twin_per_sm : {1, 2, 4}) {
            for (const int blocks : {5, 14, 32, 51, 680}) {
              const long long sure = ctas / sure_div;
              std::printf("least %lld %lld %d %lld %lld %d %d %d\n", ctas, sure, stock_per_sm,
                          ctas / g, sure / g, twin_per_sm, blocks,
                          int(kvprefetch::outlasts_stock(ctas, sure, stock_per_sm, ctas / g,
                                                         sure / g, twin_per_sm, 132, blocks)));
            }
          }
        }
      }
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
