// kvprefetch: which of vLLM's paged-attention instantiations kvprefetch changes, and what each
// launch runs. The compile-time rules (launch bounds, the v2 prologue, the GQA twins and their
// shared-memory ring and fused reduction), the host-side arithmetic the launchers decide with
// (twin_pick, stage_count, twin_reduces), the build switches that ablation trees set, the
// environment switches read at run time (KVPREFETCH, KVPREFETCH_GQA) and the device facts the
// decisions use. The numbers live in rules.inc, which the Python side reads too
// (src/kvprefetch/kernels/rules.py); docs/design.md ("Kernel rules and the measurements behind
// them") gives the measurement behind each rule.
// NOTE: past the ~500-line mark on purpose: one table of launch decisions, restated function by
// function in kernels/policy.py and checked against it by tests/samples/sass/policy_oracle.cu.
//
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

#ifndef USE_ROCM
  #include <cuda_runtime.h>
#endif

namespace kvprefetch {

#define KVP_RULE(NAME, VALUE) constexpr int NAME = VALUE;
#include "rules.inc"

// ---- Build switches (each -D'd only by an ablation tree; the defaults are what ships) ------
// 0 = off, 1 = on (every launch), 2 = auto: the default of KVPREFETCH=off|on|auto, which
// overrides it at run time without a rebuild.
#ifndef KVPREFETCH_DEFAULT_MODE
  #define KVPREFETCH_DEFAULT_MODE 2
#endif
// A translation unit whose kernels never carry the prologue (the `prefetch` variant's v1
// launcher, both of the `launch` variant's) defines KVPREFETCH_LAUNCHER_ONLY before this header
// is first included. It then gets none of the prologue's device state (the mode, the base
// table) and none of the functions that use it: its module holds stock's kernels plus
// kv_l2_prefetch_kernel, and nothing else. Module state alone, with instruction-identical
// kernels, measured slower than stock on small steps.
#ifndef KVPREFETCH_LAUNCHER_ONLY
  #define KVPREFETCH_LAUNCHER_ONLY 0
#endif
// The twins' programmatic dependent launch (gqa_twins_device.cuh, pdl_start): 2 (the default) the
// twins and, where pdl_reduce_after says so, kvprefetch's reduce kernel after a v2 twin are
// launched as programmatic dependents; 0 the twins are launched as vLLM launches its kernels.
#ifndef KVPREFETCH_TWIN_PDL
  #define KVPREFETCH_TWIN_PDL 2
#endif
static_assert(KVPREFETCH_TWIN_PDL == 0 || KVPREFETCH_TWIN_PDL == 2,
              "KVPREFETCH_TWIN_PDL must be 0 (off) or 2 (on)");
// v2's reduction inside the fused twin (gqa_twins_device.cuh, reduce_in_twin): 1 (the default)
// at the grids twin_reduces names; 0 never (a reduce kernel after every v2 twin).
#ifndef KVPREFETCH_TWIN_FUSE
  #define KVPREFETCH_TWIN_FUSE 1
#endif
static_assert(KVPREFETCH_TWIN_FUSE == 0 || KVPREFETCH_TWIN_FUSE == 1,
              "KVPREFETCH_TWIN_FUSE must be 0 or 1");
// Slots per warp of the staged twins' shared-memory ring (gqa_twins_device.cuh, "Staging");
// -DKVPREFETCH_TWIN_STAGE=0 compiles no staged twin.
#ifdef KVPREFETCH_TWIN_STAGE
constexpr int kTwinStage = KVPREFETCH_TWIN_STAGE;
#else
constexpr int kTwinStage = kStageSlots;
#endif
static_assert(kTwinStage >= 0, "KVPREFETCH_TWIN_STAGE must be >= 0");

// ---- Launch bounds ----------------------------------------------------------------------
// __launch_bounds__ for vLLM's paged_attention_v1_kernel / paged_attention_v2_kernel: the patch
// puts KVPREFETCH_KERNEL_BOUNDS(false) before the v1 declaration and (true) before the v2 one.
// __launch_bounds__(0, 0) is no bound at all (nvcc emits a byte-identical cubin), so every
// instantiation the rule leaves alone compiles exactly as stock; verify-kernel checks that.
//
// Why bounds: ptxas schedules stock's K loop with only some of a block's K loads issued before
// the first FMA that consumes one, so each block costs about two memory round trips. Given
// minBlocksPerMultiprocessor it issues all of them first. The v2 kernels that carry the
// prologue get that schedule from it, which measured faster than any bound, so v2 has none.
//
// The rule: v1, block size 16, 16-bit caches, N from rules.inc's KVP_V1_MIN_BLOCKS by head
// size; everything else 0 (stock). N is the best measured per head size; a wrong N costs a
// lot, so configurations nobody measured stay stock. fp8 caches are left out: a bounded fp8
// kernel changed the code of an unbounded fp8 kernel in the same translation unit (NVVM shares
// the fp8 conversion helpers between them), and every kernel the rule leaves alone must stay
// instruction-identical to stock.
struct HeadMinBlocks {
  int head_size, min_blocks;
};
constexpr HeadMinBlocks kV1MinBlocks[] = {
#define KVP_V1_MIN_BLOCKS(HEAD_SIZE, N) {HEAD_SIZE, N},
#include "rules.inc"
};
constexpr int min_blocks_rule(const bool partitioned, const int head_size, const int block_size,
                              const int cache_bytes, const int kv_dtype) {
  if (partitioned || block_size != kRuleBlockSize) return 0;
  if (kv_dtype != 0 || cache_bytes != 2) return 0;  // only fp16 / bf16 caches
  for (const HeadMinBlocks& r : kV1MinBlocks) {
    if (r.head_size == head_size) return r.min_blocks;
  }
  return 0;
}
template <int HEAD_SIZE, int BLOCK_SIZE, int CACHE_BYTES, int KV_DTYPE>
constexpr int min_blocks(const bool partitioned) {
  return min_blocks_rule(partitioned, HEAD_SIZE, BLOCK_SIZE, CACHE_BYTES, KV_DTYPE);
}
constexpr int bounded_threads(const int num_threads, const int min_blocks_per_sm) {
  return min_blocks_per_sm > 0 ? num_threads : 0;
}
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

// ---- Never more waves than stock's code, whatever the lengths ------------------------------
// The launcher sees the grid and the longest sequence, never the other lengths; under CUDA-graph
// replay not even those: vLLM 0.10.2 captures each batch bucket with max_seq_len =
// max_seq_len_to_capture (8192, or max_model_len if shorter) and pads the batch to the bucket
// with rows of length 1 (vllm/attention/backends/utils.py:307,339; worker/model_runner.py:886),
// so one graph serves every real length up to the capture length. A rule must therefore hold
// for any number L of the grid's sequences being as long as the longest and the rest one
// block: a batch of 20 replays the graph of 24 as 20 long rows and 4 of one token, and a
// ragged batch can hold L long sequences among short ones.
// With L long sequences of `per_seq` CTAs each, a code of `per_sm` CTAs per SM runs the long
// CTAs in ceil(L per_seq / (SMs per_sm)) waves, and the short CTAs fill in beside them. A code
// with fewer CTAs per SM than stock's (the launch-bounded v1 kernel: head 128 4 against 5; a
// twin: G heads in each of fewer CTAs) takes a wave more than stock's code for some L as soon
// as its long CTAs outgrow one of its waves, and a wave of long CTAs is most of the step:
// measured in vLLM's graph call (H200, head 128, capture length 8192), Llama-3.1-8B batch 20
// (640 long CTAs of the 768 in bucket 24: one wave of stock's 660 slots, two of the bound's
// 528) ran 0.906-0.958x a whole decode step and 0.70-0.82x at the kernel, twins off or on,
// while batch 24 (768 long CTAs, two waves either way) ran 1.05-1.26x; Qwen2.5-7B at batch 40
// (2x2 twin: three waves of 640 twin CTAs at 264 slots against two of stock's 1120 at 660)
// 0.98x. A variant's long CTA is faster than stock's alone, but a full SM shares DRAM's
// bandwidth either way, and a wave more was not won back where one wave met two or two met
// three; the launcher cannot tell those L from the rest. The rule: a variant runs only where
// no L from 1 to the grid's sequences gives its long CTAs more waves than stock's code at
// stock's CTAs per SM. It needs no threshold: the CTAs per SM come from the runtime at this
// launch's shared memory, and the rest is counting.
// `seqs`: the grid's sequences (padded batch); `*_per_seq`: CTAs per sequence (heads x
// partitions; a twin's from twin_heads); `*_per_sm`: CTAs per SM (0: unknown, no verdict).
// Host code (tests/samples/sass/policy_oracle.cu runs it on the CPU against its Python statement,
// src/kvprefetch/kernels/policy.py's more_waves_for_some).
constexpr long long ceil_div(const long long a, const long long b) { return (a + b - 1) / b; }
constexpr bool more_waves_for_some(const long long seqs, const long long stock_per_seq,
                                   const int stock_per_sm, const long long var_per_seq,
                                   const int var_per_sm, const int sm_count) {
  if (seqs <= 0 || stock_per_seq <= 0 || var_per_seq <= 0 || stock_per_sm <= 0 ||
      var_per_sm <= 0) {
    return false;
  }
  const long long sms = sm_count > 0 ? sm_count : 1;
  const long long stock_slots = sms * stock_per_sm, var_slots = sms * var_per_sm;
  // L long sequences fill L var_per_seq / var_slots of the variant's waves and
  // L stock_per_seq / stock_slots of stock's: never more where the variant's share grows no
  // faster, always for some L once L exceeds 1 / (its share's excess).
  const long long excess = var_per_seq * stock_slots - stock_per_seq * var_slots;
  if (excess <= 0) return false;
  if (seqs * excess >= var_slots * stock_slots) return true;
  // Below that, the variant's waves step up first at the least L that overfills m of them.
  for (long long m = 1;; ++m) {
    const long long L = m * var_slots / var_per_seq + 1;
    if (L > seqs) return false;
    if (ceil_div(L * stock_per_seq, stock_slots) <= m) return true;
  }
}

// ---- Where a bounded v1 kernel runs stock's code instead ----------------------------------
// The bound trades CTAs per SM for a shorter memory chain per CTA: stock's head-128 v1 kernel
// (96 registers) keeps 5 CTAs of 128 threads on an SM, the bounded one (up to 128) 4; head 64:
// 9 (56 registers) against 6 (up to 80); head 256: 3 and 3. The launch's shared memory can
// lower both (v1 holds the padded max_seq_len's logits: at vLLM's capture length of 8192, 32 KiB
// a CTA, 6 per SM, so head 64 keeps 6 either way). A CTA's time is its fixed phases plus its
// warps' chains of blocks, and the bound halves the round trips of each link (ptxas issues a
// whole block's K loads first): 1.05-1.3x per CTA on short chains, 1.1-2.4x on long ones. Where
// the bound holds fewer CTAs per SM than stock's code, some lengths give it a wave more
// (more_waves_for_some), and there the launcher runs stock's unbounded code (stock_v1.cuh):
// the bound keeps only grids whose long CTAs fit one of its waves (head 128: 528 CTAs, for any
// max_seq_len) and the instantiations whose residency it leaves alone. Before vLLM's graph call
// was measured, the rule let long chains keep the bound over any grid (bf16 head 128, 1856
// CTAs of 9 blocks, a wave more: 1.30x in the exact call), which lost where a graph's padded
// rows left one wave of long CTAs to stock and two to the bound. `heads`, `seqs`: the v1 grid;
// `bounded_per_sm`/`stock_per_sm`: each kernel's CTAs per SM at this launch's shared memory
// (cudaOccupancyMaxActiveBlocksPerMultiprocessor). Host code.
constexpr bool stock_v1_wins(const long long heads, const long long seqs, const int sm_count,
                             const int bounded_per_sm, const int stock_per_sm) {
  return bounded_per_sm > 0 && stock_per_sm > bounded_per_sm &&
         more_waves_for_some(seqs, heads, stock_per_sm, heads, bounded_per_sm, sm_count);
}

// ---- Which instantiations carry the v2 prologue and which have twins ---------------------
// Adding the prologue changes how NVVM schedules the whole kernel, whether or not it prefetches
// at run time: v2 kernels for 16-bit caches and large heads ran faster with it compiled in
// (ptxas then issues a block's K loads before their first use); v1 kernels, fp8-cache and
// head-64 v2 kernels, and bf16 above kPrologueMaxBf16HeadSize ran slower, and fp32 caches were
// never measured, so they stay stock.
// The side effect needs room: issuing all of a block's K loads first keeps them in registers at
// once, each thread's share of the block's K, HEAD_SIZE * BLOCK_SIZE * sizeof(cache_t) bytes
// over a warp's 32 lanes: k_registers() 4-byte registers. At 32 (head 128, block 16) the
// prologue's kernels ran 1.15x stock on the sampled benchmark, at 64 (head 128 / block 32, head
// 256 / block 16) 1.01-1.04x, and at 128 (head 256, block 32), more than the whole kernel holds
// (stock 96 registers, with the prologue 98: nvcc 13.0 -res-usage), ptxas cannot issue them
// ahead, only the prologue's cost is left, and the kernels ran 0.80-0.90x
// (docs/sampled-benchmark.md). So the prologue is compiled in only up to
// kPrologueMaxKRegisters. verify-kernel's expectation (kvprefetch.kernels.rules) reads the
// same rules.inc.
constexpr int k_registers(const int head_size, const int block_size, const int cache_bytes) {
  return head_size * block_size * cache_bytes / (32 * 4);
}
constexpr bool prologue_rule(const int head_size, const int block_size, const int cache_bytes,
                             const bool partitioned, const bool fp16_cache,
                             const bool bf16_cache) {
  return partitioned && head_size >= kPrologueMinHeadSize &&
         k_registers(head_size, block_size, cache_bytes) <= kPrologueMaxKRegisters &&
         (fp16_cache || (bf16_cache && head_size <= kPrologueMaxBf16HeadSize));
}
// The twins (gqa_twins.cuh): beside the instantiations of rules.inc's KVP_TWIN_AT (head and
// block size), not block-sparse, with fp16 caches, or bf16 caches in v2 and in the v1 kernels
// without a launch bound. Why those: a twin reads each K/V chunk once for its G heads, and
// the large steps of every head and block size wait on the L2-to-SM path that cuts. Where
// bf16 v1 carries the launch bound (block 16), the bounded kernel measured faster than the
// twins; fp16 v1 keeps them there (min_blocks_rule: the bound is for 16-bit caches alike, the
// twins won for fp16 only).
struct TwinAt {
  int head_size, block_size;
  bool v1;  // v1 too (v2 always)
};
constexpr TwinAt kTwinAt[] = {
#define KVP_TWIN_AT(HEAD_SIZE, BLOCK_SIZE, V1) {HEAD_SIZE, BLOCK_SIZE, V1 != 0},
#include "rules.inc"
};
constexpr bool twin_at(const bool partitioned, const int head_size, const int block_size) {
  for (const TwinAt& t : kTwinAt) {
    if (t.head_size == head_size && t.block_size == block_size) return partitioned || t.v1;
  }
  return false;
}
constexpr bool twin_rule(const bool partitioned, const int head_size, const int block_size,
                         const bool fp16_cache, const bool bf16_cache, const bool block_sparse) {
  const bool bf16_ok =
      bf16_cache && (partitioned || min_blocks_rule(false, head_size, block_size, 2, 0) == 0);
  return (fp16_cache || bf16_ok) && !block_sparse && twin_at(partitioned, head_size, block_size);
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
template <int HEAD_SIZE, int BLOCK_SIZE, typename cache_t, int KV_DTYPE, bool BLOCK_SPARSE>
constexpr bool has_twins(const bool partitioned) {
  return twin_rule(partitioned, HEAD_SIZE, BLOCK_SIZE, fp16_cache<cache_t>(KV_DTYPE == 0),
                   bf16_cache<cache_t>(KV_DTYPE == 0), BLOCK_SPARSE);
}
template <int HEAD_SIZE, int BLOCK_SIZE, typename cache_t>
constexpr bool prologue_compiled(const bool partitioned, const bool auto_dtype) {
  return prologue_rule(HEAD_SIZE, BLOCK_SIZE, int(sizeof(cache_t)), partitioned,
                       fp16_cache<cache_t>(auto_dtype), bf16_cache<cache_t>(auto_dtype));
}

// ---- Which twin a launch runs -------------------------------------------------------------
// The twins compiled beside each instantiation twin_rule names (rules.inc's KVP_TWIN): G query
// heads per CTA and S times stock's threads per CTA. Few CTAs want short chains (large S, and
// G = 2 to keep more CTAs); many want the L2 traffic cut by G = 4 and at most one CTA of
// stock's size per group. `auto` runs the first twin whose min_ctas_pct the grid reaches, in
// stock CTAs per 100 SMs (auto_twin); the thresholds are where the measured fastest twin
// changes.
struct TwinShape {
  int g, s;          // query heads per CTA; threads per CTA over stock's
  int min_ctas_pct;  // `auto`: grids of at least this many stock CTAs per 100 SMs
  const char* name;  // KVPREFETCH_GQA=<name> runs it at every launch it can take
};
constexpr TwinShape kTwins[] = {
#define KVP_TWIN(G, S, MIN_CTAS_PCT, NAME) {G, S, MIN_CTAS_PCT, NAME},
#include "rules.inc"
};
constexpr int kNumTwins = static_cast<int>(sizeof(kTwins) / sizeof(kTwins[0]));
// Stock's warps per CTA where the twins are compiled (vLLM's launchers: NUM_THREADS 128).
constexpr int kStockWarps = 4;
// Whether twin i never lengthens a CTA's chain over stock's. Stock's warp w walks the CTA's
// blocks w, w + 4, ... and computes one head per block; a twin's S x 4 warps share those blocks
// and each computes G heads per block, so its longest chain of dependent block work is G / S
// times stock's: 4x1 4x, 4x2 2x, 2x2 1x, 2x4 0.5x.
constexpr bool chain_safe(const int i) { return kTwins[i].g <= kTwins[i].s; }
// The first twin (of the chain-safe ones only, when `chain_safe_only`) whose min_ctas_pct a grid
// of `ctas_pct` CTAs per 100 SMs reaches; the last one it may take when it reaches none.
constexpr int auto_twin(const long long ctas_pct, const bool chain_safe_only = false) {
  int last = -1;
  for (int i = 0; i < kNumTwins; ++i) {
    if (chain_safe_only && !chain_safe(i)) continue;
    if (ctas_pct >= kTwins[i].min_ctas_pct) return i;
    last = i;
  }
  return last;
}
// A twin's CTAs across the heads (its grid's x) for stock's `stock_heads` (grid.x) of a model
// with `per_kv` query heads per kv head: each kv head's heads in groups of G, the last of a
// kv head's groups holding the rest (gqa_decode_kernel's `live`), so that a twin of G runs for
// any per_kv >= G: 7 heads per kv head as 4 + 3 (4x twins) or 2 + 2 + 2 + 1 (2x twins).
constexpr long long twin_heads(const long long stock_heads, const int per_kv, const int g) {
  return per_kv > 0 ? stock_heads / per_kv * ((per_kv + g - 1) / g) : 0;
}
// The twins' modes: off, auto, or the index of the twin every launch runs where it can.
constexpr int kTwinOff = -1, kTwinAuto = -2;
// KVPREFETCH_GQA's value `v` as a mode: off, auto, on (the first twin) or a twin's name;
// `fallback` when it is unset or empty, and when it is unknown (then *unknown is set).
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
// kTwinBoundThreads threads' worth of 128 registers (KVPREFETCH_TWIN_BOUNDS, gqa_twins_kernel.cuh),
// so four 128-thread CTAs (S = 1), two of 256 (S = 2), one of 512 (S = 4).
constexpr int twin_bound_ctas(const int i) { return kTwinBoundThreads / (128 * kTwins[i].s); }
// CTAs of `smem` bytes of dynamic shared memory that one SM of `smem_per_sm` bytes holds, with
// the system's and the static part's share of each CTA (the same allowance as stage_count's).
inline long long smem_ctas(const long long smem_per_sm, const long long smem) {
  return smem_per_sm / (smem + kSmemSystemBytes + kSmemStaticBytes);
}
// Whether twin i, given `smem` bytes of dynamic shared memory, keeps a second CTA beside each
// CTA on an SM where its grid of `twin_ctas` CTAs has one to give it (and its launch bound
// allows two). Why two: a twin's CTA is a pipeline of phases with CTA-wide barriers between
// them (the K pass, the softmax's max and sum over all its warps, the V pass, the cross-warp
// output reduction), and while one CTA waits at a barrier or drains a phase, its SM issues
// loads only for the CTAs beside it. A v1 twin keeps G heads' logits for the whole context
// in shared memory (4 G bytes per token: 128 KiB for 4 heads at 8192 tokens), so at long
// contexts shared memory leaves a lone CTA per SM, and the twin's G-fold cut of the L2-to-SM
// traffic no longer pays: measured, one CTA per SM ran slower than stock and two or more
// faster, whatever the warps per SM.
inline bool keeps_occupancy(const int i, const long long twin_ctas, const int sm_count,
                            const long long smem, const long long smem_per_sm) {
  const long long sms = sm_count > 0 ? sm_count : 1;
  const long long per_sm = (twin_ctas + sms - 1) / sms;
  const long long need = std::min<long long>({per_sm, twin_bound_ctas(i), 2});
  return smem_ctas(smem_per_sm, smem) >= need;
}
// Whether twin i's grid could take longer than stock's code on the same step: the guard for
// the lengths the launcher does not see. It knows the grid and the longest sequence; the other
// sequences may be one block long (a v1 CTA walks its sequence) and the partitions past them
// empty (a v2 CTA there loads its sequence's length and exits). A grid of mostly such CTAs
// takes as long as the waves of them its SMs run, and there a twin holds fewer head-CTAs per
// SM than stock's code (2x2: two CTAs of two heads where stock's code holds 5-9 of one) and
// its least CTA costs more (G heads' queries, twice the warps' barriers, the cross-warp output
// reduction), while its G-fold cut of the L2 traffic has one block to cut. In units of stock's
// least CTA, with kTwinLeastCtaPct, kChainLinkPct and kEmptyCtaPct (rules.inc) as k, r and e:
//   stock: max(W_s, 1 + r (links - 1))   twin: k W_t
// W: waves of (sure + e (ctas - sure)) CTAs at the code's CTAs per SM (`sure`: the CTAs that
// have work whatever the lengths, TwinStep); links: the longest CTA's blocks per stock warp,
// whose chain runs beside the short CTAs' waves either way (a twin's is no longer: chain-safe
// in v1, a partition in v2). So a twin may take more waves of short CTAs than stock only while
// the longest chain outlasts them. Measured, before this guard: 2x2 on v1 b98 of one or two
// blocks beside one 51-block sequence (head 64 / block 32, 10 waves of stock's, 12 of the
// twin's) 0.606x; v2 b97 ragged (head 64 / block 16, 7 against 17 waves, mostly short or empty
// partitions) 0.748x. `*_per_sm`: CTAs per SM, 0 when unknown (then no verdict: false).
constexpr long long least_waves(const long long ctas, const long long sure, const int sm_count,
                                const int per_sm) {
  const long long slots = 100LL * (sm_count > 0 ? sm_count : 1) * per_sm;
  return (100LL * sure + kEmptyCtaPct * (ctas - sure) + slots - 1) / slots;
}
constexpr bool outlasts_stock(const long long stock_ctas, const long long stock_sure,
                              const int stock_per_sm, const long long twin_ctas,
                              const long long twin_sure, const int twin_per_sm,
                              const int sm_count, const int cta_blocks) {
  if (stock_per_sm <= 0 || twin_per_sm <= 0) return false;
  const long long links = (cta_blocks + kStockWarps - 1) / kStockWarps;
  const long long stock = std::max(100 * least_waves(stock_ctas, stock_sure, sm_count,
                                                     stock_per_sm),
                                   100 + kChainLinkPct * (links > 1 ? links - 1 : 0));
  return kTwinLeastCtaPct * least_waves(twin_ctas, twin_sure, sm_count, twin_per_sm) > stock;
}
// The decode step as the launcher sees it. The host knows the grid (heads x sequences x
// partitions) and the longest sequence, not the others' lengths: in a ragged batch most of a v2
// grid's CTAs may have no partition to work on, and in v1 one long sequence's CTAs may be the
// whole step. (Under CUDA-graph replay the lengths are not even those of the captured call.)
struct TwinStep {
  long long stock_ctas;  // stock's grid: heads x sequences x partitions
  long long sure_ctas;   // CTAs that have work whatever the lengths: heads x (sequences +
                         // partitions - 1); every sequence has a first partition, the longest all
  bool partitioned;      // v2
  int cta_blocks;        // blocks of the longest CTA: the longest sequence's (v1), at most a
                         // partition's (v2)
  int stock_per_sm = 0;  // CTAs per SM of stock's code at this launch (v1: the unbounded copy
                         // where the rule bounds vLLM's kernel; 0: unknown)
  long long seqs = 0;    // the grid's sequences (grid.y; 0: unknown, no wave verdict)
};
// Which twin (an index into kTwins) a launch of `step` on `sm_count` SMs runs, or -1 for vLLM's
// kernel. A twin can run where its G is at most `per_kv` (query heads per kv head: a wider
// twin would compute heads twice and read nothing less than one of G = per_kv) and its shared
// memory `smem[i]` (bytes; 0: not compiled) fits `max_smem`. A forced mode runs its twin
// wherever it can. `auto` chooses for any lengths the step may have, so that no length
// distribution behind the same grid makes the twin slower than stock:
//  - no twin where the longest CTA has at most kStockWarps blocks: each of stock's warps then
//    loads at most one block, a twin has no chain to shorten and its G heads per warp only add
//    to that one round trip (v1 b3 x 33 tokens: 0.79x with the 2x4 twin);
//  - v1: only chain-safe twins (G <= S). A v1 CTA walks its whole sequence, so one long
//    sequence among short ones makes the step that sequence's chain, and a twin of G > S
//    lengthens it G/S-fold (a longtail b40 step: 0.78x with 4x2);
//  - v2: the table (auto_twin) reads the CTAs that surely have work, not the padded grid (a
//    longtail b50 step of 11 partitions: a padded 33 CTAs per SM took 4x1, 0.78x; 3.6 are
//    sure, where the table takes 2x2);
//  - where the pick does not keep two CTAs per SM (keeps_occupancy, on SMs of `smem_per_sm`
//    bytes), the next twin of kTwins that can run and does: the twins are in order of
//    shrinking logits per CTA (4 heads, then 2), so a long context moves to a twin of fewer
//    heads per CTA, and past the last to vLLM's kernel;
//  - no twin whose grid could take longer than stock's code (at `step.stock_per_sm`, when
//    known) if every CTA but the longest sequence's had the least work (outlasts_stock). It
//    covers short chains too: 2x2 at b123 x 114 tokens, 7872 CTAs of 8 blocks (30 waves,
//    stock's code 24), ran 0.771x; b106 x 126 tokens 0.916x.
//  - no twin whose long CTAs take more waves than stock's for some number of long sequences
//    (more_waves_for_some, at `step.stock_per_sm`): the 2x2 twin holds 4 heads per SM where
//    stock's head-128 code holds 5, so a graph of bucket 24 replayed for 17-20 long rows ran
//    it in two waves against stock's one (Qwen2.5-7B b17-23 0.91-0.96x a whole step).
// Host code (twin_for in gqa_twins_launch.cuh asks the device; tests/samples/sass/policy_oracle.cu
// runs this on the CPU against src/kvprefetch/kernels/policy.py's twin_pick).
inline int twin_pick(const int mode, const TwinStep& step, const int sm_count, const int per_kv,
                     const long long* smem, const long long max_smem,
                     const long long smem_per_sm) {
  if (mode == kTwinOff || per_kv <= 0 || mode >= kNumTwins) return -1;
  const long long sms = sm_count > 0 ? sm_count : 1;
  const auto fits = [&](const int j) {
    return kTwins[j].g <= per_kv && smem[j] > 0 && smem[j] <= max_smem;
  };
  if (mode != kTwinAuto) return mode >= 0 && fits(mode) ? mode : -1;
  if (step.cta_blocks <= kStockWarps) return -1;
  const bool chain_safe_only = !step.partitioned;
  const int first = auto_twin(100LL * step.sure_ctas / sms, chain_safe_only);
  if (first < 0 || kTwins[first].g > per_kv) return -1;
  for (int j = first; j < kNumTwins; ++j) {
    if (chain_safe_only && !chain_safe(j)) continue;
    const long long twin_ctas = twin_heads(step.stock_ctas, per_kv, kTwins[j].g);
    if (!fits(j) || !keeps_occupancy(j, twin_ctas, sm_count, smem[j], smem_per_sm)) continue;
    const int per_sm = static_cast<int>(
        std::min<long long>(twin_bound_ctas(j), smem_ctas(smem_per_sm, smem[j])));
    if (outlasts_stock(step.stock_ctas, step.sure_ctas, step.stock_per_sm, twin_ctas,
                       twin_heads(step.sure_ctas, per_kv, kTwins[j].g), per_sm, sm_count,
                       step.cta_blocks)) {
      continue;
    }
    if (step.seqs > 0) {
      const long long per_seq = step.stock_ctas / step.seqs;
      if (more_waves_for_some(step.seqs, per_seq, step.stock_per_sm,
                              twin_heads(per_seq, per_kv, kTwins[j].g), per_sm, sm_count)) {
        continue;
      }
    }
    return j;
  }
  return -1;
}
// Slots per warp a staged twin's launch gets: as many as the shared memory of one SM
// (`smem_per_sm` bytes) leaves each of the CTAs it holds at once (the grid's `ctas` per SM,
// up to what the twins' launch bound lets run: kStageMaxWarps warps), at most the warp's
// 2 x ceil(blocks / warps) chunks (K and V) and kTwinStage; 0 (the launcher then runs the
// unstaged twin) where fewer than two fit: with one slot a warp would wait for every chunk in
// turn. `fixed`: the CTA's dynamic shared memory besides the ring; per CTA the system's share
// and room for the static part (at most 2.3 KiB in the twins), the mbarriers and the ring's
// alignment. Host code (tests/samples/sass/policy_oracle.cu runs it on the CPU against
// src/kvprefetch/kernels/policy.py's stage_count).
inline int stage_count(const long long ctas, const int sm_count, const long long smem_per_sm,
                       const long long fixed, const int cta_warps, const int chunk_bytes,
                       const int blocks_per_cta) {
  const long long sms = sm_count > 1 ? sm_count : 1;
  const long long per_sm = (ctas + sms - 1) / sms;
  const long long fit = kStageMaxWarps / cta_warps;
  const long long resident = per_sm < 1 ? 1 : (per_sm < fit ? per_sm : fit);
  const long long room =
      (smem_per_sm / resident - kSmemSystemBytes - kSmemStaticBytes - fixed) /
      (1LL * cta_warps * chunk_bytes);
  const long long blocks = blocks_per_cta > 1 ? blocks_per_cta : 1;
  const long long need = 2 * ((blocks + cta_warps - 1) / cta_warps);
  long long slots = room < need ? room : need;
  if (slots > kTwinStage) slots = kTwinStage;
  return slots >= 2 ? static_cast<int>(slots) : 0;
}

// ---- Which reduction follows a v2 twin ----------------------------------------------------
// Under KVPREFETCH_TWIN_PDL=2: kvprefetch's reduce kernel (launched as a programmatic
// dependent) unless the twin's grid takes between half of the SMs and all of them, where
// vLLM's ran faster after it.
constexpr bool pdl_reduce_after(const long long twin_ctas, const int sm_count) {
  return KVPREFETCH_TWIN_PDL >= 2 && !(2 * twin_ctas > sm_count && twin_ctas <= sm_count);
}
// Whether a fusable twin's launch of `twin_ctas` CTAs reduces inside (KVPREFETCH_TWIN_FUSE),
// where the launch may (`allowed`: the v2 launcher found room for it) and its stream then gets
// counters (gqa_twins_launch.cuh, launch_twin_kernel): at the grids after which kvprefetch's reduce
// kernel would not run; elsewhere that kernel, as a programmatic dependent, was faster.
constexpr bool twin_reduces(const bool fusable_twin, const bool allowed,
                            const long long twin_ctas, const int sm_count) {
  return KVPREFETCH_TWIN_FUSE != 0 && fusable_twin && allowed &&
         !pdl_reduce_after(twin_ctas, sm_count);
}

// Which of N slots a stream holds (gqa_twins_launch.cuh's fuse_slot keeps one per device, under its
// lock): the slot it took at its first call, else the first free one, else -1 (the launch then
// takes no counters). `stream` is the handle as a pointer. Host code.
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

// ---- Host side: the environment switches and the device's facts ---------------------------
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

// KVPREFETCH=off|on|auto, read once per process.
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
}  // namespace
#endif  // !USE_ROCM

}  // namespace kvprefetch
