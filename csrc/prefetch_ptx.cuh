// kvprefetch: asynchronous L2 prefetch of the KV-cache blocks for vLLM v0.10.2's
// PagedAttention decode kernel (csrc/attention/attention_kernels.cuh).
//
// In that kernel warp w walks the blocks w, w+NUM_WARPS, ... of its sequence (or of its v2
// partition) and loads each block only when its iteration starts, paying the full global-load
// latency in the open: the address comes from block_table, a pointer chase no hardware
// prefetcher follows. kvprefetch's `prefetch` variant:
//  - both launchers (v1 and v2), for steps whose KV is at most L2/2, fire kv_l2_prefetch_kernel
//    (below) on a side stream beside the attention kernel: one bulk L2 prefetch per K and V
//    chunk of the step, issued while the attention kernel's warps start on their first blocks.
//  - v2 (partitioned) kernels with fp16 caches and head size >= 128 or bf16 caches and head 128
//    (prologue_compiled) also carry an in-kernel prologue (prefetch_prologue): before the loop,
//    the warp's lanes ask the bulk-copy engine for the K and V chunks of the blocks the warp
//    will walk. In `auto` it does not run (KVPREFETCH_AUTO_MAX_CTAS_PCT = 0): on the H200 the
//    launcher's kernel beat it at every grid where it used to run (docs/tuning-log.md,
//    row 25). It stays compiled in because with it ptxas issues all 16 K loads of a block
//    before their first use (stock: 2 of 16), which made those kernels 1.2-1.3x faster, and it
//    runs with KVPREFETCH=on. Nothing is added inside the loop.
//  - v1 kernels with fp16/bf16 caches, block size 16 and head size 64/128/256 are declared
//    __launch_bounds__(128, 6/4/3) (KVPREFETCH_KERNEL_BOUNDS, min_blocks_rule): the same effect
//    on v1's K loop (7 of 16 K loads before their first use in stock, all 16 with the bound),
//    1.01-1.8x on the H200 (3.2x on TinyLlama's smallest steps).
//  - every other kernel is instruction-identical to stock (verify-kernel checks it).
//  - not a prefetch, and not in this header: where vLLM's launchers would run a head-128,
//    block-16 kernel for a GQA model, they run one of four GQA-grouped twins of it instead
//    (csrc/gqa_grouped.cuh; which instantiations have them: twin_rule below, which twin a grid
//    gets: auto_twin), bitwise equal to vLLM's kernels.
//
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>

#ifndef USE_ROCM
  #include <cuda_runtime.h>
#endif

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
// kernel's k_cache/v_cache arguments either: see prefetch_bases below.
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

// The same request with a run-time size, as a memory side effect (`asm volatile`): for kernels
// that need nothing else of the compiler, kv_l2_prefetch_kernel below and the GQA twins'
// KVPREFETCH_TWIN_PREFETCH (csrc/gqa_grouped.cuh). Compiles to nothing before sm_90.
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

// ---- Tuning (compile-time defaults; each can be overridden with -D) ---------------------
// How many blocks each warp requests before its loop: 32 per round (one per lane), at most
// this many rounds. 4 rounds = 128 blocks per warp, 512 per CTA: a whole v2 partition, and the
// first 8192 tokens of a v1 sequence at block size 16.
#ifndef KVPREFETCH_PROLOGUE_ROUNDS
  #define KVPREFETCH_PROLOGUE_ROUNDS 4
#endif
// The prologue's `auto` rule: it prefetches only when the grid (heads x sequences x
// partitions) has at most KVPREFETCH_AUTO_MAX_CTAS_PCT CTAs and at most
// KVPREFETCH_AUTO_MAX_ISSUING_PCT CTAs that issue requests (KVPREFETCH_GQA_SHARE), each as a
// percentage of the SM count. The default 0 means never: with the launcher's prefetch kernel
// before these kernels too (KVPREFETCH_V2_L2_KERNEL=2), the H200 measured the launcher alone
// faster than the prologue, and than both, at every grid where the prologue used to run
// (64-256 CTAs: Llama-3.1-8B fp16 b1 x 1k 1.49 -> 1.58x, b1 x 4k 1.27 -> 1.44x; Gemma-2B
// b1 x 16k 1.16 -> 1.22x; docs/tuning-log.md row 25). -DKVPREFETCH_AUTO_MAX_CTAS_PCT=200
// brings back the earlier rule (at most 2 CTAs and 1 requesting CTA per SM, rows 10, 18, 19).
#ifndef KVPREFETCH_AUTO_MAX_CTAS_PCT
  #define KVPREFETCH_AUTO_MAX_CTAS_PCT 0
#endif
#ifndef KVPREFETCH_AUTO_MAX_ISSUING_PCT
  #define KVPREFETCH_AUTO_MAX_ISSUING_PCT 100
#endif
// Which CTAs of a GQA group (the num_heads / num_kv_heads query heads that read the same kv
// head, adjacent in blockIdx.x, so they run together) issue the prologue's prefetches:
// 1 = only the group's first CTA (the default: the others find the chunks on their way into
// L2); 0 = each CTA requests all of its blocks (the group's requests are then repeated
// num_queries_per_kv times); 2 = the group's CTAs split the blocks, each requesting every
// num_queries_per_kv-th. On the H200 (Llama-3.1-8B, 4 query heads per kv head, prefetch forced
// on) 1 ran 5-30% faster than 0 on every v2 grid, and 0-9% faster than 2 (docs/tuning-log.md,
// docs/results/2026-11-29-h200-prefetch-explore/5-gqa-share).
#ifndef KVPREFETCH_GQA_SHARE
  #define KVPREFETCH_GQA_SHARE 1
#endif
static_assert(KVPREFETCH_GQA_SHARE >= 0 && KVPREFETCH_GQA_SHARE <= 2,
              "KVPREFETCH_GQA_SHARE must be 0, 1 or 2");
// 0 = off, 1 = on (every launch), 2 = auto. The runtime switch KVPREFETCH=off|on|auto
// overrides it without a rebuild (read once per process, see sync_runtime_mode below).
#ifndef KVPREFETCH_DEFAULT_MODE
  #define KVPREFETCH_DEFAULT_MODE 2
#endif

// A translation unit whose kernels never carry the prologue (the `prefetch` variant's v1
// launcher, both of the `launch` variant's) defines KVPREFETCH_LAUNCHER_ONLY before this header
// is first included. It then gets none of the prologue's device state (the mode, the base
// table) and none of the functions that use it: its module holds stock's kernels plus
// kv_l2_prefetch_kernel, and nothing else. (With that state in the module, the mode then in a
// __constant__, instruction-identical v1 kernels measured ~0.6% slower than stock on small
// steps on the H200, in every run; docs/tuning-log.md.)
#ifndef KVPREFETCH_LAUNCHER_ONLY
  #define KVPREFETCH_LAUNCHER_ONLY 0
#endif

// __launch_bounds__ for vLLM's paged_attention_v1_kernel / paged_attention_v2_kernel: the patch
// puts KVPREFETCH_KERNEL_BOUNDS(false) before the v1 declaration and (true) before the v2 one.
// __launch_bounds__(0, 0) is no bound at all (nvcc 13.0 emits a byte-identical cubin), so every
// instantiation the rule leaves alone compiles exactly as stock; verify-kernel checks that.
//
// Why bounds: ptxas schedules stock's K loop with only some of a block's K loads issued before
// the first FMA that consumes one (head 128, fp16: 7 of 16 in v1, 2 of 16 in v2; head 64: 2 of
// 8), so each block costs about two memory round trips. Given minBlocksPerMultiprocessor it
// schedules differently: head 128 at N=4 issues all 16 first (125 registers, 4 CTAs per SM
// instead of 5), head 64 at N=6 all 8 (80 instead of 55 registers), head 256 at N=3 16 of 32.
// The v2 kernels that carry the prologue get the all-loads-first schedule from it at 94
// registers, which measured faster than any bound, so v2 has none.
//
// The rule: v1, block size 16, 16-bit caches, N = 6 / 4 / 3 for head size 64 / 128 / 256;
// everything else 0 (stock). Measured on the H200 (docs/tuning-log.md rows 27-28): the
// chosen N was the best of N = 3..6 per preset and dtype overall; a wrong N costs up to 3x (head
// 128 at N=6, head 256 at N=5), so configurations nobody measured stay stock. fp8 caches are
// left out although head 128 gained (1.05 -> 1.09x): a bounded fp8 kernel changed the code of
// an unbounded fp8 kernel in the same translation unit (head 256, block-sparse; NVVM shares
// the fp8 conversion helpers between them), and every kernel the rule leaves alone must stay
// instruction-identical to stock. Keep in sync with kvprefetch.upstream.V1_MIN_BLOCKS.
// -DKVPREFETCH_V1_MIN_BLOCKS=N / -DKVPREFETCH_V2_MIN_BLOCKS=N override it for every v1 / v2
// instantiation (0 = none; -1, the default, = the rule).
#ifndef KVPREFETCH_V1_MIN_BLOCKS
  #define KVPREFETCH_V1_MIN_BLOCKS -1
#endif
#ifndef KVPREFETCH_V2_MIN_BLOCKS
  #define KVPREFETCH_V2_MIN_BLOCKS -1
#endif
constexpr int min_blocks_rule(const bool partitioned, const int head_size, const int block_size,
                              const int cache_bytes, const int kv_dtype) {
  if (partitioned || block_size != 16) return 0;
  if (kv_dtype != 0 || cache_bytes != 2) return 0;  // only fp16 / bf16 caches
  return head_size == 64 ? 6 : head_size == 128 ? 4 : head_size == 256 ? 3 : 0;
}
template <int HEAD_SIZE, int BLOCK_SIZE, int CACHE_BYTES, int KV_DTYPE>
constexpr int min_blocks(const bool partitioned) {
  const int forced = partitioned ? KVPREFETCH_V2_MIN_BLOCKS : KVPREFETCH_V1_MIN_BLOCKS;
  return forced >= 0 ? forced
                     : min_blocks_rule(partitioned, HEAD_SIZE, BLOCK_SIZE, CACHE_BYTES, KV_DTYPE);
}
constexpr int bounded_threads(const int num_threads, const int min_blocks_per_sm) {
  return min_blocks_per_sm > 0 ? num_threads : 0;
}
// Which of vLLM's instantiations get the GQA-grouped twins (csrc/gqa_grouped.cuh): head 128,
// block 16, not block-sparse, fp16 caches in v1 and v2, bf16 caches in v2 only (bf16 v1 ran
// faster as the launch-bounded stock kernel: b64 x 4k 1.72x vs the twin's 1.54x,
// docs/tuning-log.md). Keep in sync with kvprefetch.upstream.twin_shapes.
// -DKVPREFETCH_GQA_TWINS=0 compiles no twin at all.
#ifndef KVPREFETCH_GQA_TWINS
  #define KVPREFETCH_GQA_TWINS 1
#endif
constexpr bool twin_rule(const bool partitioned, const int head_size, const int block_size,
                         const bool fp16_cache, const bool bf16_cache, const bool block_sparse) {
  const bool cache_ok = fp16_cache || (bf16_cache && partitioned);
  return KVPREFETCH_GQA_TWINS != 0 && cache_ok && !block_sparse && block_size == 16 &&
         head_size == 128;
}
// The twins compiled beside each instantiation twin_rule names: G query heads per CTA and S
// times stock's threads per CTA. Few CTAs want short chains (large S, and G = 2 to keep more
// CTAs); many want the L2 traffic cut by G = 4 and at most one CTA of stock's size per group.
// `auto` runs the first twin whose min_ctas_pct the grid reaches, in stock CTAs per 100 SMs
// (auto_twin). Calibrated on the H200 (Llama-3.1-8B fp16; exploration runs 19 and 21-23,
// docs/tuning-log.md rows 35-38): the rule picked the fastest of the four at every shape of
// run 22's fp16 tables but one: up to 1 stock CTA per SM 2x4 (b1-b4 x 512-2k, 1.73-1.81x), at
// 1.9-3.9 per SM 2x2 (1.23-1.52x), at 7.8 per SM 4x2 (1.39-1.56x), from 15.5 per SM on 4x1
// (1.73-1.91x; the exception, b64 x 4k in v1: 4x1 1.38x, 4x2 1.55x).
// Keep in sync with kvprefetch.upstream.TWIN_SHAPES.
struct TwinShape {
  int g, s;          // query heads per CTA; threads per CTA over stock's
  int min_ctas_pct;  // `auto`: grids of at least this many stock CTAs per 100 SMs
  const char* name;  // KVPREFETCH_GQA=<name> runs it at every launch it can take
};
// -DKVPREFETCH_TWIN_SMALL_G=1: the two small-grid twins with G = 1 (exploration run 23).
#ifndef KVPREFETCH_TWIN_SMALL_G
  #define KVPREFETCH_TWIN_SMALL_G 2
#endif
// -DKVPREFETCH_TWIN_4X2_PCT=N: `auto` runs 4x2 from N stock CTAs per 100 SMs (exploration).
#ifndef KVPREFETCH_TWIN_4X2_PCT
  #define KVPREFETCH_TWIN_4X2_PCT 500
#endif
// -DKVPREFETCH_TWIN_4X4_PCT=N (N > 0): a fifth twin, 4x4 (G = 4, 16 warps), that `auto` runs
// from N stock CTAs per 100 SMs up to 4x2's (exploration run 45); 0 (the default) compiles none.
#ifndef KVPREFETCH_TWIN_4X4_PCT
  #define KVPREFETCH_TWIN_4X4_PCT 0
#endif
constexpr TwinShape kTwins[] = {{4, 1, 1000, "4x1"},
                                {4, 2, KVPREFETCH_TWIN_4X2_PCT, "4x2"},
#if KVPREFETCH_TWIN_4X4_PCT > 0
                                {4, 4, KVPREFETCH_TWIN_4X4_PCT, "4x4"},
#endif
                                {KVPREFETCH_TWIN_SMALL_G, 2, 150, "2x2"},
                                {KVPREFETCH_TWIN_SMALL_G, 4, 0, "2x4"}};
constexpr int kNumTwins = static_cast<int>(sizeof(kTwins) / sizeof(kTwins[0]));
constexpr int auto_twin(const long long ctas_pct) {
  for (int i = 0; i < kNumTwins; ++i) {
    if (ctas_pct >= kTwins[i].min_ctas_pct) return i;
  }
  return kNumTwins - 1;
}
// The twins' modes: off, auto, or the index of the twin every launch runs where it can.
constexpr int kTwinOff = -1, kTwinAuto = -2;
// KVPREFETCH_GQA's value `v` as a mode: off, auto, on (4x1) or a twin's name; `fallback` when
// it is unset or empty, and when it is unknown (then *unknown is set).
inline int twin_mode_from(const char* v, const int fallback, bool* unknown) {
  *unknown = false;
  if (v == nullptr || *v == '\0') return fallback;
  const std::string s(v);
  if (s == "off") return kTwinOff;
  if (s == "auto") return kTwinAuto;
  if (s == "on") return 0;
  for (int i = 0; i < kNumTwins; ++i) {
    if (s == kTwins[i].name) return i;
  }
  *unknown = true;
  return fallback;
}
// CTAs of twin i that its launch bound keeps resident on one SM: every twin is bounded to
// 512 threads' worth of 128 registers (KVPREFETCH_TWIN_BOUNDS, gqa_grouped.cuh), so four
// 128-thread CTAs (S = 1), two of 256 (S = 2), one of 512 (S = 4).
constexpr int twin_bound_ctas(const int i) { return 4 / kTwins[i].s; }
// CTAs of `smem` bytes of dynamic shared memory that one SM of `smem_per_sm` bytes holds: per
// CTA 1 KiB is the system's and up to 3 KiB the kernel's static part (the same allowance as
// stage_count's).
inline long long smem_ctas(const long long smem_per_sm, const long long smem) {
  return smem_per_sm / (smem + 1024 + 3072);
}
// Whether twin i, given `smem` bytes of dynamic shared memory, keeps a second CTA beside each
// CTA on an SM where its grid of `twin_ctas` CTAs has one to give it (and its launch bound
// allows two). Why two: a twin's CTA is a pipeline of phases with CTA-wide barriers between
// them (the K pass, the softmax's max and sum over all its warps, the V pass, the cross-warp
// output reduction), and while one CTA waits at a barrier or drains a phase, its SM issues
// loads only for the CTAs beside it. A v1 twin keeps G heads' logits for the whole context
// in shared memory (4 G bytes per token: 128 KiB for 4 heads at 8192 tokens), so at long
// contexts shared memory leaves a lone CTA per SM, and the twin's G-fold cut of the L2-to-SM
// traffic no longer pays. Measured on the H200 (docs/results/2026-12-01-h200-long-context,
// Llama-3.1-8B v1, each twin forced): one CTA per SM ran 0.70-0.82x stock (4x1 at 8k) and
// 0.88-1.04x (4x2 at 6k-8k, 8 warps in the one CTA), two or more 1.13-1.66x (4x1 at 3k-6k
// with 2-4 CTAs of 4 warps, 4x2 at 3k-4k and 2x2 at 3k-8k with 2), whatever the warps per SM.
inline bool keeps_occupancy(const int i, const long long twin_ctas, const int sm_count,
                            const long long smem, const long long smem_per_sm) {
  const long long sms = sm_count > 0 ? sm_count : 1;
  const long long per_sm = (twin_ctas + sms - 1) / sms;
  const long long need = std::min<long long>({per_sm, twin_bound_ctas(i), 2});
  return smem_ctas(smem_per_sm, smem) >= need;
}
// Which twin (an index into kTwins) a launch of `stock_ctas` stock CTAs on `sm_count` SMs runs,
// or -1 for vLLM's kernel. A twin can run where its G divides `per_kv` (query heads per kv
// head) and its shared memory `smem[i]` (bytes; 0: not compiled) fits `max_smem`. A forced
// mode runs its twin wherever it can. `auto` takes auto_twin's pick, if its G divides per_kv
// (else vLLM's kernel), and where the pick does not keep two CTAs per SM (keeps_occupancy, on
// SMs of `smem_per_sm` bytes) the next twin of kTwins that can run and does: the twins are in
// order of shrinking logits per CTA (4 heads, then 2), so a long context moves to a twin of
// fewer heads per CTA, and past the last to vLLM's kernel. Host code
// (twin_for in gqa_grouped.cuh asks the device; tests/samples/sass/min_blocks_rule.cu runs this
// on the CPU).
inline int twin_pick(const int mode, const long long stock_ctas, const int sm_count,
                     const int per_kv, const long long* smem, const long long max_smem,
                     const long long smem_per_sm) {
  if (mode == kTwinOff || per_kv <= 0 || mode >= kNumTwins) return -1;
  const long long sms = sm_count > 0 ? sm_count : 1;
  const auto fits = [&](const int j) {
    return per_kv % kTwins[j].g == 0 && smem[j] > 0 && smem[j] <= max_smem;
  };
  if (mode != kTwinAuto) return mode >= 0 && fits(mode) ? mode : -1;
  const int first = auto_twin(100LL * stock_ctas / sms);
  if (per_kv % kTwins[first].g != 0) return -1;
  for (int j = first; j < kNumTwins; ++j) {
    if (fits(j) && keeps_occupancy(j, stock_ctas / kTwins[j].g, sm_count, smem[j], smem_per_sm)) {
      return j;
    }
  }
  return -1;
}
// Slots per warp of the S = 2 twins' shared-memory ring (csrc/gqa_grouped.cuh, "Staging"):
// 2 by default; 0 compiles no staged twin.
#ifndef KVPREFETCH_TWIN_STAGE
  #define KVPREFETCH_TWIN_STAGE 2
#endif
// Slots per warp a staged twin's launch gets: as many as the shared memory of one SM
// (`smem_per_sm` bytes) leaves each of the CTAs it holds at once (the grid's `ctas` per SM,
// up to what the twins' launch bound lets run: 16 warps), at most the warp's 2 x ceil(blocks /
// warps) chunks (K and V) and KVPREFETCH_TWIN_STAGE; 0 (the launcher then runs the unstaged
// twin) where fewer than two fit: with one slot a warp would wait for every chunk in turn
// (docs/tuning-log.md row 47). `fixed`: the CTA's dynamic shared memory besides the ring;
// per CTA 1 KiB is the system's and 3 KiB are kept for the static part (at most 2.3 KiB in
// the twins), the mbarriers and the ring's alignment. Host code
// (tests/samples/sass/min_blocks_rule.cu runs it on the CPU).
inline int stage_count(const long long ctas, const int sm_count, const long long smem_per_sm,
                       const long long fixed, const int cta_warps, const int chunk_bytes,
                       const int blocks_per_cta) {
  const long long sms = sm_count > 1 ? sm_count : 1;
  const long long per_sm = (ctas + sms - 1) / sms;
  const long long fit = 16 / cta_warps;
  const long long resident = per_sm < 1 ? 1 : (per_sm < fit ? per_sm : fit);
  const long long room =
      (smem_per_sm / resident - 1024 - 3072 - fixed) / (1LL * cta_warps * chunk_bytes);
  const long long blocks = blocks_per_cta > 1 ? blocks_per_cta : 1;
  const long long need = 2 * ((blocks + cta_warps - 1) / cta_warps);
  long long slots = room < need ? room : need;
  if (slots > KVPREFETCH_TWIN_STAGE) slots = KVPREFETCH_TWIN_STAGE;
  return slots >= 2 ? static_cast<int>(slots) : 0;
}

// The twins' programmatic dependent launch (csrc/gqa_grouped.cuh says what it does; default 2)
// and v2's reduction inside the twin (KVPREFETCH_TWIN_FUSE, below), set here for the host
// rules that read them (tests/samples/sass/min_blocks_rule.cu runs those on the CPU).
#ifndef KVPREFETCH_TWIN_PDL
  #define KVPREFETCH_TWIN_PDL 2
#endif
// The reduction inside the v2 twins (reduce_in_twin), where fuse_slot gives the launch counters:
// 1 (the default) at the grids after which kvprefetch's reduce kernel would not run
// (pdl_reduce_after: more than half and at most all of the SMs' count of CTAs), 2 at every grid
// of a fusable twin, 0 never (a reduce kernel after every v2 twin: the design before, SASS
// identical). Exploration run 49 (H200): the 2x2 twin's 128-CTA grids ran 1.54x -> 1.69x
// (b1 x 4k), 1.52x -> 1.64x (b4 x 1k) with 1; 2 also fused its 256-CTA grids, where
// kvprefetch's reduce kernel runs as a programmatic dependent and was faster (b8 x 1k 1.36x ->
// 1.34x, bf16 1.75x -> 1.71x).
#ifndef KVPREFETCH_TWIN_FUSE
  #define KVPREFETCH_TWIN_FUSE 1
#endif

// Which reduce kernel follows a v2 twin of `twin_ctas` CTAs under KVPREFETCH_TWIN_PDL=2:
// kvprefetch's (launched as a programmatic dependent) unless the twin's grid takes between half
// of the SMs and all of them, where vLLM's ran faster after it (exploration run 30, H200: with
// kvprefetch's reduce the 2x2 twin's 128-CTA grids at b1 x 4k, b2 x 2k, b4 x 1k ran
// 1.43-1.49x, with vLLM's 1.55-1.56x; at 16-64 CTAs and from 256 kvprefetch's won:
// b1 x 1k 1.75x -> 1.99x, b8 x 1k 1.28x -> 1.33x).
// -DKVPREFETCH_PDL_REDUCE_MID=1: kvprefetch's after those grids too (exploration run 45).
#ifndef KVPREFETCH_PDL_REDUCE_MID
  #define KVPREFETCH_PDL_REDUCE_MID 0
#endif
constexpr bool pdl_reduce_after(const long long twin_ctas, const int sm_count) {
  return KVPREFETCH_TWIN_PDL >= 2 &&
         (KVPREFETCH_PDL_REDUCE_MID || !(2 * twin_ctas > sm_count && twin_ctas <= sm_count));
}

// Whether a fusable twin's launch of `twin_ctas` CTAs reduces inside (KVPREFETCH_TWIN_FUSE),
// where the launch may (`allowed`: the v2 launcher found room for it) and its stream then gets
// counters (csrc/gqa_grouped.cuh, launch_twin_kernel).
constexpr bool twin_reduces(const bool fusable_twin, const bool allowed,
                            const long long twin_ctas, const int sm_count) {
  return KVPREFETCH_TWIN_FUSE != 0 && fusable_twin && allowed &&
         (KVPREFETCH_TWIN_FUSE >= 2 || !pdl_reduce_after(twin_ctas, sm_count));
}

// Which of N slots a stream holds (csrc/gqa_grouped.cuh's fuse_slot keeps one per device,
// under its lock): the slot it took at its first call, else the first free one, else -1 (the
// launch then takes no counters). `stream` is the handle as a pointer. Host code.
template <int N>
struct StreamSlots {
  const void* owner[N] = {};
  bool held[N] = {};
  int take(const void* stream) {
    for (int s = 0; s < N; ++s) {
      if (held[s] && owner[s] == stream) return s;
    }
    for (int s = 0; s < N; ++s) {
      if (!held[s]) {
        held[s] = true;
        owner[s] = stream;
        return s;
      }
    }
    return -1;
  }
};
#ifdef USE_ROCM
  #define KVPREFETCH_KERNEL_BOUNDS(PARTITIONED)
#else
  #define KVPREFETCH_MIN_BLOCKS_OF(PARTITIONED)                                     \
    kvprefetch::min_blocks<HEAD_SIZE, BLOCK_SIZE, int(sizeof(cache_t)), int(KV_DTYPE)>( \
        PARTITIONED)
  #define KVPREFETCH_KERNEL_BOUNDS(PARTITIONED)                                           \
    __launch_bounds__(                                                                    \
        kvprefetch::bounded_threads(NUM_THREADS, KVPREFETCH_MIN_BLOCKS_OF(PARTITIONED)), \
        KVPREFETCH_MIN_BLOCKS_OF(PARTITIONED))
#endif

// The mode lives in global memory, not in a __constant__: a user constant bank in the module
// made every kernel launched from it ~0.5-1% slower on short steps on the H200, the
// instruction-identical ones included, and the prologue kernels too (docs/tuning-log.md,
// docs/results/2026-11-29-h200-prefetch-explore/4-module-state). -DKVPREFETCH_MODE_IN_GLOBAL=0
// puts it back in a __constant__ to reproduce that.
#ifndef KVPREFETCH_MODE_IN_GLOBAL
  #define KVPREFETCH_MODE_IN_GLOBAL 1
#endif

#if !KVPREFETCH_LAUNCHER_ONLY
namespace {
// One copy per translation unit (non-relocatable device code), written at most once per
// device by that unit's launcher before its first eager launch.
#if KVPREFETCH_MODE_IN_GLOBAL
__device__ int kvprefetch_mode = KVPREFETCH_DEFAULT_MODE;
#else
__constant__ int kvprefetch_mode = KVPREFETCH_DEFAULT_MODE;
#endif
}  // namespace

// Whether this launch prefetches. Uniform over the CTA and computed from what every thread
// knows (grid shape, the SM count in %nsmid, `group_size` = query heads per kv head), so
// gating costs a few uniform instructions.
__device__ __forceinline__ bool prefetch_enabled(const int group_size) {
#if KVPREFETCH_HAS_BULK_PREFETCH
  const int mode = kvprefetch_mode;
  if (mode != 2) return mode == 1;
  unsigned int nsm;
  asm("mov.u32 %0, %%nsmid;" : "=r"(nsm));
  const unsigned int ctas = gridDim.x * gridDim.y * gridDim.z;
  const unsigned int issuing =
      KVPREFETCH_GQA_SHARE == 1 ? ctas / static_cast<unsigned int>(group_size) : ctas;
  return 100u * ctas <= KVPREFETCH_AUTO_MAX_CTAS_PCT * nsm &&
         100u * issuing <= KVPREFETCH_AUTO_MAX_ISSUING_PCT * nsm;
#else
  (void)group_size;
  return false;
#endif
}
#endif  // !KVPREFETCH_LAUNCHER_ONLY

// ---- The prefetch base: the cache address, without capturing the cache pointer -----------
// Any use of a k_cache/v_cache-derived address in an asm operand (or a ptrtoint) *captures* the
// kernel argument. NVVM then can no longer prove the cache read-only and drops the read-only
// path for every K/V load of the kernel: in the v1 kernel for head 128, block 16, fp16, 21
// `LDG.E.64.CONSTANT` loads become 5 `.CONSTANT` + 16 plain `LDG.E.64` (docs/tuning-log.md).
//
// So the prefetches take their base addresses from a small device table instead: each launcher
// registers the cache tensors it is called with (before_launch, host side, once per tensor),
// and each warp finds its cache in the table by *comparing pointers*, which is not a capture.
// The table's entry is numerically the same address, but to the compiler it is a value loaded
// from unrelated memory, so k_cache and v_cache stay read-only (verify-kernel checks the
// `.CONSTANT` loads against stock). A cache that is not in the table (table full, first launch
// inside a CUDA graph capture) gets no prefetch: the kernel is then exactly as fast as stock.
#ifndef KVPREFETCH_BASE_SLOTS
  #define KVPREFETCH_BASE_SLOTS 512
#endif
static_assert(KVPREFETCH_BASE_SLOTS % 32 == 0 && KVPREFETCH_BASE_SLOTS > 0,
              "KVPREFETCH_BASE_SLOTS must be a positive multiple of 32");

// The table's copies of k_cache and v_cache (see prefetch_bases).
template <typename T>
struct PrefetchBases {
  const T* k = nullptr;
  const T* v = nullptr;
};

#if !KVPREFETCH_LAUNCHER_ONLY
namespace {
// One table per translation unit, like kvprefetch_mode; written only by register_base.
__device__ const void* kvprefetch_bases[KVPREFETCH_BASE_SLOTS];
}  // namespace

// The table's copies of k_cache and v_cache, or nullptr for each when this launch does not
// prefetch (prefetch_enabled) or that cache is not registered. Must be called by all 32 lanes
// of the warp together: each lane compares KVPREFETCH_BASE_SLOTS/32 entries (their loads in
// flight together) against both pointers, then one ballot per cache.
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
  for (int i = 0; i < KVPREFETCH_BASE_SLOTS / 32; ++i) {
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
// V chunk of the warp's blocks l, l+32, ... (KVPREFETCH_PROLOGUE_ROUNDS rounds at most), of
// those the ones this CTA's place in its GQA group (`group_rank` of `group_size`) gives it
// (KVPREFETCH_GQA_SHARE); returns a token for consume_token.
//  - The bound is end_block_idx (this partition's end), an index: block_table is never read
//    past the sequence's row, and physical block 0 is prefetched like any other (the original
//    patch's "next block 0 = none" sentinel skipped a real block).
//  - Block numbers widen to int64 before the multiply, as vLLM does for its own loads.
template <int HEAD_SIZE, int BLOCK_SIZE, int STRIDE, typename cache_t>
__device__ __forceinline__ unsigned prefetch_warp_blocks(
    const PrefetchBases<cache_t> bases, const int* __restrict__ block_table,
    const int first_block_idx, const int end_block_idx, const int64_t kv_block_stride,
    const int64_t head_offset, const int lane, const int group_rank, const int group_size) {
  unsigned token = 0;
#if KVPREFETCH_HAS_BULK_PREFETCH
  static_assert(KVPREFETCH_PROLOGUE_ROUNDS >= 1, "KVPREFETCH_PROLOGUE_ROUNDS must be >= 1");
  constexpr uint32_t kBytes = KvChunk<HEAD_SIZE, BLOCK_SIZE, cache_t>::kBytes;
  if (bases.k == nullptr && bases.v == nullptr) return 0;
  #pragma unroll 1
  for (int round = 0; round < KVPREFETCH_PROLOGUE_ROUNDS; ++round) {
    const int k = round * 32 + lane;
    const int idx = first_block_idx + k * STRIDE;
    if (idx >= end_block_idx) break;
    if (KVPREFETCH_GQA_SHARE == 2 && k % group_size != group_rank) continue;
    const int64_t offset =
        static_cast<int64_t>(block_table[idx]) * kv_block_stride + head_offset;
    if (bases.k != nullptr) token |= l2_prefetch_bulk<kBytes>(bases.k + offset);
    if (bases.v != nullptr) token |= l2_prefetch_bulk<kBytes>(bases.v + offset);
  }
#else
  (void)bases; (void)block_table; (void)first_block_idx; (void)end_block_idx;
  (void)kv_block_stride; (void)head_offset; (void)lane; (void)group_rank; (void)group_size;
#endif
  return token;
}

// Which kernel instantiations carry the prologue at all (a compile-time rule; every other
// instantiation compiles exactly as stock, which verify-kernel checks). Adding the prologue
// changes how NVVM schedules the whole kernel, independently of whether it prefetches at run
// time. Measured on the H200 with the prologue compiled in but switched off
// (docs/tuning-log.md): v2 kernels for 16-bit caches and head size >= 128 ran 1.03-1.27x
// faster than stock; v1 kernels 1.7-2.8x slower; fp8-cache v2 kernels 2-4% slower; the head-64
// v2 kernel 2.6% slower on one shape; bf16 head 256 (Gemma-2B) 1.2-1.4% slower at batch 8-64
// (row 29), so bf16 caches get it only up to head 128, and fp32 caches (never measured) not at
// all. Keep kPrologueMinHeadSize and the rule in sync with kvprefetch.upstream.prefetches_in
// (verify-kernel's expectation).
#ifndef KVPREFETCH_PROLOGUE_MIN_HEAD_SIZE
  #define KVPREFETCH_PROLOGUE_MIN_HEAD_SIZE 128
#endif
constexpr int kPrologueMinHeadSize = KVPREFETCH_PROLOGUE_MIN_HEAD_SIZE;
constexpr bool prologue_rule(const int head_size, const bool partitioned, const bool fp16_cache,
                             const bool bf16_cache) {
  return partitioned && head_size >= kPrologueMinHeadSize &&
         (fp16_cache || (bf16_cache && head_size <= 128));
}
// auto_dtype: the cache holds the query's dtype (KV_DTYPE == kAuto); a 16-bit cache_t is then
// fp16 (vLLM's uint16_t) or bf16 (__nv_bfloat16).
template <typename cache_t>
constexpr bool fp16_cache(const bool auto_dtype) {
  return auto_dtype && std::is_same_v<cache_t, uint16_t>;
}
template <typename cache_t>
constexpr bool bf16_cache(const bool auto_dtype) {
  return auto_dtype && sizeof(cache_t) == 2 && !std::is_same_v<cache_t, uint16_t>;
}
// Whether this instantiation has the GQA-grouped twins beside it (twin_rule above).
template <int HEAD_SIZE, int BLOCK_SIZE, typename cache_t, int KV_DTYPE, bool BLOCK_SPARSE>
constexpr bool has_twins(const bool partitioned) {
  return twin_rule(partitioned, HEAD_SIZE, BLOCK_SIZE, fp16_cache<cache_t>(KV_DTYPE == 0),
                   bf16_cache<cache_t>(KV_DTYPE == 0), BLOCK_SPARSE);
}
template <int HEAD_SIZE, typename cache_t>
constexpr bool prologue_compiled(const bool partitioned, const bool auto_dtype) {
  return prologue_rule(HEAD_SIZE, partitioned, fp16_cache<cache_t>(auto_dtype),
                       bf16_cache<cache_t>(auto_dtype));
}

// What the patch calls: prefetch_bases + prefetch_warp_blocks. -DKVPREFETCH_PROLOGUE_NOINLINE=1
// makes it a real call (an experiment on how the prologue affects the loop's schedule).
#ifndef KVPREFETCH_PROLOGUE_NOINLINE
  #define KVPREFETCH_PROLOGUE_NOINLINE 0
#endif
#if KVPREFETCH_PROLOGUE_NOINLINE
  #define KVPREFETCH_PROLOGUE_ATTR __noinline__
#else
  #define KVPREFETCH_PROLOGUE_ATTR __forceinline__
#endif
template <int HEAD_SIZE, int BLOCK_SIZE, int STRIDE, typename cache_t>
__device__ KVPREFETCH_PROLOGUE_ATTR unsigned prefetch_prologue(
    const cache_t* k_cache, const cache_t* v_cache, const int* __restrict__ block_table,
    const int first_block_idx, const int end_block_idx, const int64_t kv_block_stride,
    const int64_t head_offset, const int lane, const int group_rank, const int group_size)
#if KVPREFETCH_LAUNCHER_ONLY
    ;  // declared for the kernel's discarded `if constexpr` branch; never instantiated here
#else
{
  if (KVPREFETCH_GQA_SHARE == 1 && group_rank != 0) return 0;
  return prefetch_warp_blocks<HEAD_SIZE, BLOCK_SIZE, STRIDE>(
      prefetch_bases(k_cache, v_cache, lane, group_size), block_table, first_block_idx,
      end_block_idx, kv_block_stride, head_offset, lane, group_rank, group_size);
}
#endif

// Host side, called by each launcher (paged_attention_v{1,2}.cu) before it launches: applies
// KVPREFETCH=off|on|auto from the environment, read once per process. Nothing is written when
// it asks for the compiled-in default, or while the stream is being captured into a CUDA graph
// (vLLM's warm-up runs eagerly first, so the setting is in place before capture).
#if !defined(USE_ROCM)
namespace {
// off|on|auto (or 0|1|2) from the environment variable `name`; `fallback` when it is unset,
// empty or unknown (the last with a note on stderr).
inline int env_mode(const char* name, const int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  const std::string s(v);
  if (s == "off" || s == "0") return 0;
  if (s == "on" || s == "1") return 1;
  if (s == "auto" || s == "2") return 2;
  std::fprintf(stderr, "kvprefetch: ignoring %s=%s (use off, on or auto)\n", name, v);
  return fallback;
}

inline int kvprefetch_host_mode() {
  static const int mode = env_mode("KVPREFETCH", KVPREFETCH_DEFAULT_MODE);
  return mode;
}

// Whether `stream` is being captured into a CUDA graph (or cannot tell): nothing may be
// copied on it then, since the copy would become a graph node replayed with every step.
inline bool capturing_or_unknown(cudaStream_t stream) {
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &capturing) != cudaSuccess ||
         capturing != cudaStreamCaptureStatusNone;
}

#if !KVPREFETCH_LAUNCHER_ONLY
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
#endif  // !KVPREFETCH_LAUNCHER_ONLY

struct DeviceFacts {
  int cc_major = 0;
  int l2_bytes = 0;
  int sm_count = 0;
  int max_smem_optin = 0;  // bytes of dynamic shared memory a CTA may opt into
  int smem_per_sm = 0;     // bytes of shared memory of one SM
  int device = -1;         // the device these are of
};
inline DeviceFacts device_facts(int dev) {
  static DeviceFacts cache[64];
  static std::atomic<unsigned long long> known{0};
  if (dev < 0 || dev >= 64) return DeviceFacts{};
  if (!(known.load() & (1ull << dev))) {
    DeviceFacts f;
    cudaDeviceGetAttribute(&f.cc_major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&f.l2_bytes, cudaDevAttrL2CacheSize, dev);
    cudaDeviceGetAttribute(&f.sm_count, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&f.max_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    cudaDeviceGetAttribute(&f.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
    f.device = dev;
    cache[dev] = f;
    known.fetch_or(1ull << dev);
  }
  return cache[dev];
}

#if !KVPREFETCH_LAUNCHER_ONLY
// The host half of prefetch_bases: which cache tensors this translation unit's table holds, per
// device. A new tensor takes the next slot round-robin (the oldest entry is overwritten: it is
// only ever used when it equals the kernel's own pointer, so a stale entry is harmless) and is
// written with one 8-byte copy on the launch stream, ordered before the kernel that needs it.
// vLLM calls each layer's cache with the same tensors every step, so after the first decode
// step (eager, before any CUDA graph capture) nothing more is copied.
struct BaseRegistry {
  std::mutex mu;
  std::unordered_map<const void*, int> slot_of;
  const void* slots[KVPREFETCH_BASE_SLOTS] = {};  // also the copies' host source
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
  r.next = (slot + 1) % KVPREFETCH_BASE_SLOTS;
}

// Called by the v2 launcher (paged_attention_v2.cu) right before its launch: applies
// KVPREFETCH once, then registers the two cache tensors for prefetch_bases. Nothing is
// registered when the prologue cannot run (KVPREFETCH=off, or `auto` with the default
// KVPREFETCH_AUTO_MAX_CTAS_PCT of 0), before Hopper, or while the stream is being captured.
inline void before_launch(cudaStream_t stream, const void* k_cache, const void* v_cache) {
  sync_runtime_mode(stream);
  const int mode = kvprefetch_host_mode();
  if (mode == 0 || (mode == 2 && KVPREFETCH_AUTO_MAX_CTAS_PCT == 0)) return;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || device_facts(dev).cc_major < 9) return;
  if (capturing_or_unknown(stream)) return;
  register_base(stream, dev, k_cache);
  register_base(stream, dev, v_cache);
}
#endif  // !KVPREFETCH_LAUNCHER_ONLY
}  // namespace
#endif

// ---- The `launch` variant: an L2 prefetch kernel issued by the launcher --------------------
// Any in-kernel prefetch of a k_cache/v_cache-derived address captures the pointer, and NVVM
// then stops proving the cache read-only: every K/V load of the attention kernel loses the
// read-only path (LDG.E.64.CONSTANT -> LDG.E.64), ~10-16% slower on bandwidth-heavy shapes
// whether or not the prefetch runs. The `launch` variant leaves the attention kernels
// byte-identical to stock and, beside them (see KVPREFETCH_LAUNCH_OVERLAP), launches this small
// kernel: one CTA per (kv head, sequence, run of `blocks_per_cta` blocks) whose threads fire one
// bulk L2 prefetch per K and V chunk of those blocks, then exit. The prefetches are
// fire-and-forget, so the bytes stream into L2 while the attention kernel runs.
//
// Why runs of blocks and not one CTA per (kv head, sequence): an SM's bulk-copy engine takes
// the requests of its CTAs one after another, so one CTA asking for a whole long sequence
// takes longer to issue than the attention step itself. With one kv head (Gemma-2B) and
// 16k tokens, one CTA issued 2048 requests of 8 KiB and the step ran 0.52x stock on the H200.
// Shorter runs cost too: every CTA of this kernel delays the attention kernel's, so runs of 16
// blocks ran b8 x 512 1.08x (runs of 64: 1.14x) and runs of 4 0.98x. 64 blocks (1024 tokens at
// block size 16) leaves every step up to 1k tokens as before and spreads longer sequences
// (docs/tuning-log.md, docs/results/2026-11-29-h200-prefetch-explore/7-l2-kernel-split).
#ifndef KVPREFETCH_L2_BLOCKS_PER_CTA
  #define KVPREFETCH_L2_BLOCKS_PER_CTA 64
#endif
static_assert(KVPREFETCH_L2_BLOCKS_PER_CTA >= 0,
              "KVPREFETCH_L2_BLOCKS_PER_CTA must be >= 0 (0: one CTA per kv head and sequence)");
template <typename cache_t>
__global__ void kv_l2_prefetch_kernel(const cache_t* __restrict__ k_cache,
                                      const cache_t* __restrict__ v_cache,
                                      const int* __restrict__ block_tables,
                                      const int* __restrict__ seq_lens,
                                      const int block_size, const int max_num_blocks_per_seq,
                                      const int64_t kv_block_stride,
                                      const int64_t kv_head_stride, const uint32_t chunk_bytes,
                                      const int blocks_per_cta) {
#if KVPREFETCH_HAS_BULK_PREFETCH
  const int head = blockIdx.x;
  const int seq = blockIdx.y;
  const int first = blockIdx.z * blocks_per_cta;
  const int num_blocks = min((seq_lens[seq] + block_size - 1) / block_size,
                             first + blocks_per_cta);
  const int* table = block_tables + static_cast<int64_t>(seq) * max_num_blocks_per_seq;
  for (int b = first + threadIdx.x; b < num_blocks; b += blockDim.x) {
    const int64_t offset = static_cast<int64_t>(table[b]) * kv_block_stride + head * kv_head_stride;
    l2_prefetch_bytes(k_cache + offset, chunk_bytes);
    l2_prefetch_bytes(v_cache + offset, chunk_bytes);
  }
#endif
}

#if !defined(USE_ROCM)
namespace {

// The launch-time decision. `auto` prefetches when the whole KV working set of this decode
// step (an upper bound: num_seqs x max_seq_len tokens, K and V) is at most 1/2 of L2
// (30 MB on the H200): then the step is latency-bound and the prefetched bytes land before
// the attention kernel's warps reach them. Measured on the H200 with the prefetch kernel
// overlapping the attention kernel (KVPREFETCH_LAUNCH_OVERLAP, docs/tuning-log.md), v1
// steps: 2, 4 and 8.4 MB ran 1.33x, 1.34x and 1.36x faster; 16.8 MB 1.12x; 33.6 MB 0.955x
// (the prefetch competes with the kernel's own loads); larger ones 0.84-0.90x. KVPREFETCH=on|off
// overrides; KVPREFETCH_AUTO_L2_DIVISOR changes the 1/2 at compile time.
#ifndef KVPREFETCH_AUTO_L2_DIVISOR
  #define KVPREFETCH_AUTO_L2_DIVISOR 2
#endif
inline bool l2_prefetch_wanted(int dev, int mode, long long kv_bytes) {
  if (mode == 0) return false;
  const DeviceFacts f = device_facts(dev);
  if (f.cc_major < 9) return false;  // no bulk prefetch before Hopper
  return mode == 1 ||
         kv_bytes <= static_cast<long long>(f.l2_bytes) / KVPREFETCH_AUTO_L2_DIVISOR;
}

// Where the launcher's prefetch kernel runs. 1 (default): on a side stream forked from the
// launch stream, so the attention kernel starts at once and the two overlap; the launcher's
// L2PrefetchJoin joins the side stream back after the attention launch, which CUDA-graph capture
// requires and which keeps every later use of the inputs ordered after the prefetch kernel.
// 0: on the launch stream, so the attention kernel waits for it. On the H200 (CUDA graphs) the
// serial launch cost 2-3 us per step: b1 x 512 ran 1.10x faster with it, 1.33x with the overlap
// (docs/results/2026-11-29-h200-prefetch-explore/6-launch-overlap).
#ifndef KVPREFETCH_LAUNCH_OVERLAP
  #define KVPREFETCH_LAUNCH_OVERLAP 1
#endif

// Joins the prefetch kernel's side stream back into the launch stream when it goes out of
// scope; the launchers keep it alive until after their attention launch. Empty (does nothing)
// when the prefetch ran on the launch stream or did not run.
class [[nodiscard]] L2PrefetchJoin {
 public:
  L2PrefetchJoin() = default;
  L2PrefetchJoin(cudaStream_t stream, cudaEvent_t done) : stream_(stream), done_(done) {}
  L2PrefetchJoin(const L2PrefetchJoin&) = delete;
  L2PrefetchJoin& operator=(const L2PrefetchJoin&) = delete;
  L2PrefetchJoin(L2PrefetchJoin&& other) noexcept : stream_(other.stream_), done_(other.done_) {
    other.done_ = nullptr;
  }
  L2PrefetchJoin& operator=(L2PrefetchJoin&&) = delete;
  ~L2PrefetchJoin() {
    if (done_ != nullptr && cudaStreamWaitEvent(stream_, done_, 0) != cudaSuccess) {
      (void)cudaGetLastError();  // ours: do not leave it for the next launch check
    }
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
};

// One side stream and its fork/join events per device and host thread, created on first use
// outside a CUDA-graph capture (vLLM's eager warm-up) and kept for the process's life. nullptr
// when they do not exist yet during a capture, or could not be created: the prefetch then runs
// on the launch stream.
struct SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr;
  cudaEvent_t done = nullptr;
  bool ready = false;
  bool failed = false;
};
inline SideStream* side_stream(int dev, cudaStream_t launch_stream) {
  thread_local SideStream sides[64];
  if (dev < 0 || dev >= 64) return nullptr;
  SideStream& s = sides[dev];
  if (s.ready) return &s;
  if (s.failed || capturing_or_unknown(launch_stream)) return nullptr;
  if (cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking) != cudaSuccess ||
      cudaEventCreateWithFlags(&s.fork, cudaEventDisableTiming) != cudaSuccess ||
      cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming) != cudaSuccess) {
    (void)cudaGetLastError();
    s.failed = true;
    return nullptr;
  }
  s.ready = true;
  return &s;
}

// How kv_l2_prefetch_kernel covers a sequence of up to `blocks` blocks: runs of
// KVPREFETCH_L2_BLOCKS_PER_CTA blocks (0: the whole sequence), longer where the grid's z would
// pass its limit (65535), one CTA each; a warp per run of up to 32 blocks, 4 warps beyond.
// Host-only arithmetic (tests/test_sass.py compiles tests/samples/sass/l2_prefetch_runs.cu
// with nvcc and runs it on the CPU).
struct L2PrefetchRuns {
  unsigned ctas = 0;       // gridDim.z
  int blocks_per_cta = 0;  // the kernel's blocks_per_cta
  int threads = 0;         // blockDim.x
};
inline L2PrefetchRuns l2_prefetch_runs(const long long blocks) {
  constexpr long long kMaxZ = 65535;
  if (blocks <= 0) return {};
  const long long per_cta =
      KVPREFETCH_L2_BLOCKS_PER_CTA == 0
          ? blocks
          : std::max<long long>(KVPREFETCH_L2_BLOCKS_PER_CTA, (blocks + kMaxZ - 1) / kMaxZ);
  L2PrefetchRuns r;
  r.ctas = static_cast<unsigned>((blocks + per_cta - 1) / per_cta);
  r.blocks_per_cta = static_cast<int>(per_cta);
  r.threads = per_cta <= 32 ? 32 : 128;
  return r;
}

// Fires kv_l2_prefetch_kernel for this step when l2_prefetch_wanted says so. The caller keeps
// the returned join alive until after its attention launch (see KVPREFETCH_LAUNCH_OVERLAP).
template <typename cache_t, int BLOCK_SIZE>
inline L2PrefetchJoin launch_l2_prefetch(cudaStream_t stream, const cache_t* k_cache,
                                         const cache_t* v_cache, const int* block_tables,
                                         const int* seq_lens, int num_seqs, int num_kv_heads,
                                         int head_size, int max_num_blocks_per_seq,
                                         int max_seq_len, int kv_block_stride,
                                         int kv_head_stride) {
  const uint32_t chunk = static_cast<uint32_t>(head_size) * BLOCK_SIZE * sizeof(cache_t);
  const long long blocks = (static_cast<long long>(max_seq_len) + BLOCK_SIZE - 1) / BLOCK_SIZE;
  const long long kv_bytes = 2ll * num_seqs * num_kv_heads * blocks * chunk;
  if (num_seqs <= 0 || num_kv_heads <= 0 || blocks <= 0) return {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return {};
  if (!l2_prefetch_wanted(dev, kvprefetch_host_mode(), kv_bytes)) return {};
  if (chunk % 16 != 0 || chunk > 1048560u) return {};
  const L2PrefetchRuns runs = l2_prefetch_runs(blocks);
  const dim3 grid(num_kv_heads, num_seqs, runs.ctas);
  cudaStream_t prefetch_stream = stream;
  SideStream* side = nullptr;
#if KVPREFETCH_LAUNCH_OVERLAP
  side = side_stream(dev, stream);
  if (side != nullptr) {
    if (cudaEventRecord(side->fork, stream) != cudaSuccess ||
        cudaStreamWaitEvent(side->stream, side->fork, 0) != cudaSuccess) {
      (void)cudaGetLastError();
      return {};
    }
    prefetch_stream = side->stream;
  }
#endif
  kv_l2_prefetch_kernel<cache_t><<<grid, runs.threads, 0, prefetch_stream>>>(
      k_cache, v_cache, block_tables, seq_lens, BLOCK_SIZE, max_num_blocks_per_seq,
      kv_block_stride, kv_head_stride, chunk, runs.blocks_per_cta);
  if (side == nullptr) return {};
  if (cudaEventRecord(side->done, side->stream) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  return L2PrefetchJoin(stream, side->done);
}

// The `prefetch` variant's v2 launcher fires the launcher's L2 prefetch kernel under the same
// `auto` rule as v1 (steps <= L2/2). KVPREFETCH_V2_L2_KERNEL: 2 (default) before every v2
// kernel; 1 only before those compiled without the prologue (fp8 caches, head sizes below
// kPrologueMinHeadSize), the others left to the prologue (the design of rows 22-23 in
// docs/tuning-log.md); 0 never (not even instantiated: the v2 module of row 21).
// Tried and not kept (exploration run 57, the code at e1d0b17): no launcher kernel before an
// fp16 cache's v2 grid of 4 or more stock CTAs per SM. TinyLlama fp16 (head 64, no twin) loses
// 0.7-0.9% only on grids of 1024 CTAs (b1 x 16k, b2 x 8k, b4 x 4k), one nearly full wave of
// vLLM's kernel (62 registers: 8 CTAs per SM, 1056 on the H200), and gains 1.06-1.13x on 768
// and 1536; the limit gave those gains away (geomean of 18 shapes 1.119 -> 1.099). A rule for
// nearly full single waves needs that kernel's occupancy, which the launcher can query only
// inside vLLM's head-size switch (narrowed per build), after this call.
#ifndef KVPREFETCH_V2_L2_KERNEL
  #define KVPREFETCH_V2_L2_KERNEL 2
#endif
static_assert(KVPREFETCH_V2_L2_KERNEL >= 0 && KVPREFETCH_V2_L2_KERNEL <= 2,
              "KVPREFETCH_V2_L2_KERNEL must be 0, 1 or 2");
template <typename cache_t, int BLOCK_SIZE>
inline L2PrefetchJoin launch_l2_prefetch_v2(
    const bool auto_dtype, cudaStream_t stream, const cache_t* k_cache,
    const cache_t* v_cache, const int* block_tables, const int* seq_lens, int num_seqs,
    int num_kv_heads, int head_size, int max_num_blocks_per_seq, int max_seq_len,
    int kv_block_stride, int kv_head_stride) {
  if constexpr (KVPREFETCH_V2_L2_KERNEL == 0) {  // not even instantiated: the module as before
    return {};
  } else {
    if (KVPREFETCH_V2_L2_KERNEL == 1 &&
        prologue_rule(head_size, true, fp16_cache<cache_t>(auto_dtype),
                      bf16_cache<cache_t>(auto_dtype))) {
      return {};
    }
    return launch_l2_prefetch<cache_t, BLOCK_SIZE>(stream, k_cache, v_cache, block_tables,
                                                   seq_lens, num_seqs, num_kv_heads, head_size,
                                                   max_num_blocks_per_seq, max_seq_len,
                                                   kv_block_stride, kv_head_stride);
  }
}
}  // namespace
#endif

// The original patch's mechanism, kept for faithful reproduction (`--variant seed`):
// a fixed 4096 B, the address masked to 16 B, and next block number 0 meaning "none".
// Only the architecture guard is ours, so the seed variant also builds for sm_80.
__device__ __forceinline__ void seed_prefetch_4096(const void* src) {
#if KVPREFETCH_HAS_BULK_PREFETCH
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], 4096;" ::"l"(
      reinterpret_cast<unsigned long>(src) & 0xFFFFFFFFFFFFFFF0UL));
#else
  (void)src;
#endif
}

}  // namespace kvprefetch
