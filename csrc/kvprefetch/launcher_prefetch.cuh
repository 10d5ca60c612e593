// kvprefetch: the L2 prefetch kernel the launchers fire beside vLLM's attention kernel (the
// `launch` variant's whole mechanism, and the `prefetch` variant's before v1 and v2 kernels).
//
// Why a separate kernel: any in-kernel prefetch of a k_cache/v_cache-derived address captures
// the pointer, and NVVM then stops proving the cache read-only: every K/V load of the attention
// kernel loses the read-only path (LDG.E.64.CONSTANT -> LDG.E.64), slower on bandwidth-heavy
// shapes whether or not the prefetch runs. This kernel leaves the attention kernels
// byte-identical to stock: one CTA per (kv head, sequence, run of `blocks_per_cta` blocks)
// whose threads fire one bulk L2 prefetch per K and V chunk of those blocks, then exit. The
// prefetches are fire-and-forget, so the bytes stream into L2 while the attention kernel runs
// beside it on a side stream.
//
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cstdint>

#include "l2_prefetch.cuh"
#include "launch_policy.cuh"

namespace kvprefetch {

// Why runs of blocks and not one CTA per (kv head, sequence): an SM's bulk-copy engine takes
// the requests of its CTAs one after another, so one CTA asking for a whole long sequence
// takes longer to issue than the attention step itself. Shorter runs cost too: every CTA of
// this kernel delays the attention kernel's. rules.inc's kL2BlocksPerCta (1024 tokens at block
// size 16) leaves every step up to 1k tokens as one run and spreads longer sequences.
static_assert(kL2BlocksPerCta > 0, "kL2BlocksPerCta must be > 0");
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
// step (an upper bound: num_seqs x max_seq_len tokens, K and V) is at most L2 / kAutoL2Divisor:
// then the step is latency-bound and the prefetched bytes land before the attention kernel's
// warps reach them; larger steps are bandwidth-bound, and the prefetch competes with the
// kernel's own loads. KVPREFETCH=on|off overrides.
inline bool l2_prefetch_wanted(int dev, int mode, long long kv_bytes) {
  if (mode == 0) return false;
  const DeviceFacts f = device_facts(dev);
  if (f.cc_major < 9) return false;  // no bulk prefetch before Hopper
  return mode == 1 || kv_bytes <= static_cast<long long>(f.l2_bytes) / kAutoL2Divisor;
}

// Joins the prefetch kernel's side stream back into the launch stream when it goes out of
// scope; the launchers keep it alive until after their attention launch, which CUDA-graph
// capture requires and which keeps every later use of the inputs ordered after the prefetch
// kernel. Empty (does nothing) when the prefetch ran on the launch stream or did not run.
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
// on the launch stream (the attention kernel then waits for it).
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
// kL2BlocksPerCta blocks, longer where the grid's z would pass its limit (65535), one CTA
// each; a warp per run of up to 32 blocks, 4 warps beyond. Host-only arithmetic
// (tests/test_sass.py compiles tests/samples/sass/l2_prefetch_runs.cu with nvcc and runs it on
// the CPU).
struct L2PrefetchRuns {
  unsigned ctas = 0;       // gridDim.z
  int blocks_per_cta = 0;  // the kernel's blocks_per_cta
  int threads = 0;         // blockDim.x
};
inline L2PrefetchRuns l2_prefetch_runs(const long long blocks) {
  constexpr long long kMaxZ = 65535;
  if (blocks <= 0) return {};
  const long long per_cta = std::max<long long>(kL2BlocksPerCta, (blocks + kMaxZ - 1) / kMaxZ);
  L2PrefetchRuns r;
  r.ctas = static_cast<unsigned>((blocks + per_cta - 1) / per_cta);
  r.blocks_per_cta = static_cast<int>(per_cta);
  r.threads = per_cta <= 32 ? 32 : 128;
  return r;
}

// Fires kv_l2_prefetch_kernel for this step when l2_prefetch_wanted says so (in `auto`, only
// while a CUDA graph is being captured), on a side stream forked from the launch stream, so the
// attention kernel starts at once and the two overlap.
// The caller keeps the returned join alive until after its attention launch.
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
  const int mode = kvprefetch_host_mode();
  if (!l2_prefetch_wanted(dev, mode, kv_bytes)) return {};
  if (chunk % 16 != 0 || chunk > 1048560u) return {};
  // Each K or V chunk is one bulk request, and an SM's bulk-copy engine takes its CTAs' requests
  // one after another, so the prefetch streams bytes at a rate of chunk bytes per request. At
  // 1 KiB (head 64, block 16, fp8) it fell behind the attention kernel's own loads and the step
  // waited for it: the sampled benchmark measured 26 such steps at 1.02-1.08x geomean with
  // 0.60x and 0.92x among them; at 2 KiB and more 1.17-1.45x, none below 0.965x.
  if (chunk < static_cast<uint32_t>(kL2MinChunkBytes)) return {};
  // Created on the first call outside a capture (vLLM's eager warm-up), so that a capture
  // finds it ready, whatever the eager calls below decide.
  SideStream* side = side_stream(dev, stream);
  // `auto` fires the kernel only into a CUDA graph being captured. What it buys is GPU time:
  // the bytes of a step that fits L2 stream in while the attention kernel starts. What it costs
  // is host time: a fork, a launch and a join, four runtime calls and a launch beside the
  // attention kernel's one. Replaying a graph costs no host time per node, so there it is pure
  // gain; launched eagerly, a step this small (at most L2 / kAutoL2Divisor of K and V) takes
  // less GPU time than its launches take host time, so back-to-back eager steps are paced by
  // the host and every added call is loss (the H200's sampled benchmark: small eager steps at
  // 0.71-0.74x stock with it). KVPREFETCH=on fires it eagerly too.
  if (mode == 2 && !capturing_or_unknown(stream)) return {};
  const L2PrefetchRuns runs = l2_prefetch_runs(blocks);
  const dim3 grid(num_kv_heads, num_seqs, runs.ctas);
  cudaStream_t prefetch_stream = stream;
  if (side != nullptr) {
    if (cudaEventRecord(side->fork, stream) != cudaSuccess ||
        cudaStreamWaitEvent(side->stream, side->fork, 0) != cudaSuccess) {
      (void)cudaGetLastError();
      return {};
    }
    prefetch_stream = side->stream;
  }
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

// The `prefetch` variant's v2 launcher fires the same kernel under the same `auto` rule, before
// every v2 kernel, the ones carrying the prologue included (the prologue does not run in
// `auto`). `auto_dtype` is kept for the launcher's call.
template <typename cache_t, int BLOCK_SIZE>
inline L2PrefetchJoin launch_l2_prefetch_v2(
    const bool auto_dtype, cudaStream_t stream, const cache_t* k_cache,
    const cache_t* v_cache, const int* block_tables, const int* seq_lens, int num_seqs,
    int num_kv_heads, int head_size, int max_num_blocks_per_seq, int max_seq_len,
    int kv_block_stride, int kv_head_stride) {
  (void)auto_dtype;
  return launch_l2_prefetch<cache_t, BLOCK_SIZE>(stream, k_cache, v_cache, block_tables,
                                                 seq_lens, num_seqs, num_kv_heads, head_size,
                                                 max_num_blocks_per_seq, max_seq_len,
                                                 kv_block_stride, kv_head_stride);
}
}  // namespace
#endif  // !USE_ROCM

}  // namespace kvprefetch
