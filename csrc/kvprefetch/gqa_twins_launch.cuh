// kvprefetch: the GQA-grouped twins' host side (a part of gqa_twins.cuh, which says what the
// twins are and includes this inside its anonymous namespace): KVPREFETCH_GQA (twin_mode),
// which twin a launch runs (twin_for, over launch_policy.cuh's twin_pick), a twin's shared
// memory (twin_smem), the fused twins' per-stream counters (fuse_slot), the launch itself
// (launch_pdl, launch_twin_kernel, launch_twin) and the two entry points the patched launchers
// call from their launch macros, launch_grouped_v1 and launch_grouped_v2. The kernels it
// launches: gqa_twins_kernel.cuh.
//
// SPDX-License-Identifier: Apache-2.0
#ifndef KVPREFETCH_GQA_TWINS_PARTS
  #error "gqa_twins_launch.cuh is a part of gqa_twins.cuh (inside its namespace): include that"
#endif

// ---- Host side: whether a launch runs a twin, which one, and the launch -------------------
// The twins and `auto`'s rule: kTwins and auto_twin (launch_policy.cuh).
// KVPREFETCH_GQA=off|auto|on|<twin name>, read once per process (`on` is the first twin, 4x1);
// a named twin runs at every launch it can take. The default:
// -DKVPREFETCH_GQA_DEFAULT_MODE=0 off, 1 on, 2 auto (the default), 3 + i twin i. A launch can
// take a twin when its G is at most the query heads per kv head and its shared memory fits the
// device; otherwise vLLM's kernel runs.
#ifndef KVPREFETCH_GQA_DEFAULT_MODE
  #define KVPREFETCH_GQA_DEFAULT_MODE 2
#endif
static_assert(KVPREFETCH_GQA_DEFAULT_MODE >= 0 && KVPREFETCH_GQA_DEFAULT_MODE < 3 + kNumTwins,
              "KVPREFETCH_GQA_DEFAULT_MODE: 0 off, 1 on, 2 auto, 3 + i twin i");
constexpr int twin_mode_of(const int default_mode) {
  if (default_mode == 0) return kTwinOff;
  if (default_mode == 1) return 0;  // on: 4x1
  if (default_mode == 2) return kTwinAuto;
  return default_mode - 3;
}

#if !defined(USE_ROCM)
// kTwinOff, kTwinAuto or the index of the twin to run.
inline int twin_mode() {
  static const int mode = [] {
    const char* v = std::getenv("KVPREFETCH_GQA");
    bool unknown = false;
    const int m = twin_mode_from(v, twin_mode_of(KVPREFETCH_GQA_DEFAULT_MODE), &unknown);
    if (unknown) {
      std::fprintf(stderr,
                   "kvprefetch: ignoring KVPREFETCH_GQA=%s (use off, auto, on, 4x1, 4x2, 2x2 or "
                   "2x4)\n", v);
    }
    return m;
  }();
  return mode;
}

// Which twin (an index into kTwins) this launch runs, or -1 for vLLM's kernel (twin_pick, with
// the device's SM count and shared memory). `grid`: stock's; `cta_blocks`: the blocks of its
// longest CTA; `smem(i)`: the shared memory twin i needs, bytes; `stock_per_sm`: CTAs per SM
// of stock's code (0: unknown).
template <typename SmemOf>
inline int twin_for(const dim3 grid, const bool partitioned, const int cta_blocks,
                    const int num_kv_heads, const DeviceFacts& f, const SmemOf& smem,
                    const int stock_per_sm) {
  const int mode = twin_mode();
  const int num_heads = static_cast<int>(grid.x);
  if (mode == kTwinOff || num_kv_heads <= 0 || num_heads % num_kv_heads != 0) return -1;
  long long bytes[kNumTwins];
  for (int i = 0; i < kNumTwins; ++i) bytes[i] = smem(i);
  const TwinStep step{1LL * grid.x * grid.y * grid.z, 1LL * grid.x * (grid.y + grid.z - 1),
                      partitioned, cta_blocks, stock_per_sm, static_cast<long long>(grid.y)};
  return twin_pick(mode, step, f.sm_count, num_heads / num_kv_heads, bytes, f.max_smem_optin,
                   f.smem_per_sm);
}

// Everything the launchers pass, by the names they use.
template <typename T, typename CACHE_T>
struct GqaArgs {
  float* exp_sums;
  float* max_logits;
  T* out;  // v2: tmp_out
  const T* q;
  const CACHE_T* k_cache;
  const CACHE_T* v_cache;
  int num_kv_heads;
  float scale;
  const int* block_tables;
  const int* seq_lens;
  int max_num_blocks_per_seq;
  const float* alibi_slopes;
  int q_stride;
  int kv_block_stride;
  int kv_head_stride;
  // v2 where the reduction may run in the twin (KVPREFETCH_TWIN_FUSE; launch_grouped_v2 says
  // where): the final output; nullptr otherwise.
  T* fused_out = nullptr;
};

// Whether the build asks for programmatic dependent launches (KVPREFETCH_TWIN_PDL) and the
// device takes them (Hopper on).
inline bool pdl_on(const DeviceFacts& f) { return KVPREFETCH_TWIN_PDL != 0 && f.cc_major >= 9; }

// Launches kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream
// serialization when `pdl` (see pdl_start); if the launch with it is refused, without.
template <typename... KernelArgs, typename... Args>
void launch_pdl(void (*kernel)(KernelArgs...), const dim3 grid, const dim3 block, const int smem,
                const cudaStream_t stream, const bool pdl, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = pdl ? 1 : 0;
  if (cudaLaunchKernelEx(&config, kernel, static_cast<KernelArgs>(args)...) == cudaSuccess ||
      !pdl) {
    return;
  }
  cudaGetLastError();  // refused with the attribute: launch as vLLM would
  config.numAttrs = 0;
  cudaLaunchKernelEx(&config, kernel, static_cast<KernelArgs>(args)...);
}

// The (G, S) twin's shared memory in bytes, given stock's; a staged twin's with `stages` slots
// per warp (the kernel derives the count back from it).
template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS, int G,
          int S>
constexpr long long twin_smem(const int shared_mem_size, const int stages = 0) {
  const long long before =
      twin_smem_before<T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS, G, S>(shared_mem_size);
  if constexpr (staged<G, S>()) {
    constexpr int CTA_WARPS = NUM_THREADS * S / 32;
    if (stages > 0) {
      return stage_ring_at(before, CTA_WARPS) +
             1LL * stages * CTA_WARPS * HEAD_SIZE * BLOCK_SIZE *
                 static_cast<int>(sizeof(CACHE_T));
    }
  }
  return before;
}

// pdl_reduce_after and twin_reduces, which reduce kernel follows a v2 twin: launch_policy.cuh.

// Counters: kFuseSlots streams per device at once, each (sequence, head group) pairs up to
// kFuseCounters per launch; zero when the module loads, and every launch leaves them zero.
constexpr int kFuseSlots = 8;
constexpr int kFuseCounters = 8192;
template <int N>
__device__ unsigned int fuse_counters[N];
// This stream's counters on device `dev`, or nullptr (the launch then runs a reduce kernel):
// each stream holds a slot of its own from its first launch on, so launches that may run at
// the same time (other streams) never share counters, while one stream's launches run in turn
// (a kernel boundary, or griddepcontrol.wait, orders each after the last CTA's reset). A CUDA
// graph keeps the slot of the stream it was captured on: replaying the same graph on two
// streams at once would race here as it would on its tmp_out, and so would a stream destroyed
// while its launches still run if a new stream got its handle at once. Streams past
// kFuseSlots, and the per-thread default stream (one handle for many streams), get none.
// (A template, so that only the v2 launcher's unit, which calls it, holds the counters.)
template <int N = kFuseSlots * kFuseCounters>
unsigned int* fuse_slot(const int dev, const cudaStream_t stream) {
  if (dev < 0 || dev >= 64 || stream == cudaStreamPerThread) return nullptr;
  static std::mutex lock;
  static unsigned int* base[64] = {};
  static StreamSlots<kFuseSlots> slots[64];
  const std::lock_guard<std::mutex> guard(lock);
  if (base[dev] == nullptr) {
    void* p = nullptr;
    if (cudaGetSymbolAddress(&p, fuse_counters<N>) != cudaSuccess) {
      cudaGetLastError();  // leave no error behind for the caller's check
      return nullptr;
    }
    base[dev] = static_cast<unsigned int*>(p);
  }
  const int slot = slots[dev].take(static_cast<const void*>(stream));
  return slot < 0 ? nullptr : base[dev] + slot * kFuseCounters;
}

// Launches twin kernel `kernel` (a staged one when STAGED) with `smem` bytes of dynamic shared
// memory, for a model of `per_kv` query heads per kv head.
// `counters`: a fused twin's (fuse_slot), else nullptr.
template <auto kernel, bool STAGED, typename T, typename CACHE_T>
void launch_twin_kernel_as(const GqaArgs<T, CACHE_T>& a, const dim3 grid, const int threads,
                           const int smem, const int shared_mem_size, const int per_kv,
                           const cudaStream_t stream, const DeviceFacts& f,
                           unsigned int* counters = nullptr) {
  // A kernel's attributes are set once per device, not per launch: each cudaFuncSetAttribute is
  // host time on every eager step (what it sets stays set). Statics of this template: one set
  // per kernel instantiation.
  static std::atomic<unsigned long long> carveout_set{0};
  static std::atomic<int> smem_set[64];
  const int dev = f.device;
  const bool known = dev >= 0 && dev < 64;
  if constexpr (STAGED) {
    // Shared memory before L1 (the kernels' L1 hit rate is about 1%), so that the CTAs the
    // rings were sized for fit on one SM.
    if (!known || !(carveout_set.load(std::memory_order_relaxed) & (1ull << dev))) {
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared) == cudaSuccess && known) {
        carveout_set.fetch_or(1ull << dev);
      }
    }
  }
  // A CTA's static and dynamic shared memory together may pass 48 KiB only with the opt-in;
  // the twins' static part is at most 3 KiB (a launch of 48 KiB dynamic, the 4x1 twin's at a
  // 3072-token v1 context, failed with "invalid argument" when only the dynamic part was
  // compared with 48 KiB). The opt-in is a maximum, so it is raised only when a launch needs
  // more than the largest set so far.
  if (smem + 3072 > 48 * 1024 &&
      (!known || smem > smem_set[dev].load(std::memory_order_relaxed))) {
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) ==
            cudaSuccess && known) {
      int seen = smem_set[dev].load(std::memory_order_relaxed);
      while (smem > seen && !smem_set[dev].compare_exchange_weak(seen, smem)) {
      }
    }
  }
  launch_pdl(kernel, grid, dim3(threads), smem, stream, pdl_on(f), a.exp_sums,
             a.max_logits, a.out, a.q, a.k_cache, a.v_cache, a.num_kv_heads, a.scale,
             a.block_tables, a.seq_lens, a.max_num_blocks_per_seq, a.alibi_slopes, a.q_stride,
             a.kv_block_stride, a.kv_head_stride,
             shared_mem_size / static_cast<int>(sizeof(float)), counters, a.fused_out, per_kv);
}

// Launches one instantiation of the (G, S) twin with `smem` bytes of dynamic shared memory: the
// fused one where the launch may fuse (a.fused_out), twin_reduces says so for its grid and the
// stream gets counters (fuse_slot). True when the twin does the reduction.
template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS,
          vllm::Fp8KVCacheDataType KV_DTYPE, int PARTITION_SIZE, int G, int S, bool STAGED>
bool launch_twin_kernel(const GqaArgs<T, CACHE_T>& a, const dim3 grid, const int smem,
                        const int shared_mem_size, const int per_kv, const cudaStream_t stream,
                        const DeviceFacts& f) {
  if constexpr (fusable<G, S, PARTITION_SIZE, HEAD_SIZE>()) {
    unsigned int* const counters =
        twin_reduces(true, a.fused_out != nullptr, 1LL * grid.x * grid.y * grid.z, f.sm_count)
            ? fuse_slot(f.device, stream)
            : nullptr;
    if (counters != nullptr) {
      launch_twin_kernel_as<gqa_decode_kernel<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS,
                                              KV_DTYPE, PARTITION_SIZE, G, S, STAGED, true>,
                            STAGED>(a, grid, NUM_THREADS * S, smem, shared_mem_size, per_kv,
                                    stream, f, counters);
      return true;
    }
  }
  launch_twin_kernel_as<gqa_decode_kernel<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS,
                                          KV_DTYPE, PARTITION_SIZE, G, S, STAGED>,
                        STAGED>(a, grid, NUM_THREADS * S, smem, shared_mem_size, per_kv, stream,
                                f);
  return false;
}

// The grid of a twin of G heads per CTA for stock's `stock_grid` (heads x sequences x
// partitions): each kv head's query heads in groups of G (twin_heads; twin_for checked that
// the kv heads divide the heads).
inline dim3 twin_grid(const dim3 stock_grid, const int num_kv_heads, const int g) {
  const int per_kv = static_cast<int>(stock_grid.x) / num_kv_heads;
  return dim3(static_cast<unsigned>(twin_heads(stock_grid.x, per_kv, g)), stock_grid.y,
              stock_grid.z);
}

// The (G, S) twin for a stock grid: staged where it is compiled and two slots per warp fit
// (stage_count), else loading from global. True when the twin does v2's reduction.
template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS,
          vllm::Fp8KVCacheDataType KV_DTYPE, int PARTITION_SIZE, int G, int S>
bool launch_twin(const GqaArgs<T, CACHE_T>& a, const dim3 stock_grid, const int shared_mem_size,
                 const cudaStream_t stream, const DeviceFacts& f) {
  const int per_kv = static_cast<int>(stock_grid.x) / a.num_kv_heads;
  const dim3 grid = twin_grid(stock_grid, a.num_kv_heads, G);
  const long long fixed =
      twin_smem<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS, G, S>(shared_mem_size);
  if constexpr (staged<G, S>()) {
    // The bulk copy and its mbarriers are Hopper's (sm_90 on): before it, never staged.
    const int stages =
        f.cc_major < 9 ? 0
                       : stage_count(1LL * grid.x * grid.y * grid.z, f.sm_count, f.smem_per_sm,
                                     fixed, NUM_THREADS * S / 32,
                                     HEAD_SIZE * BLOCK_SIZE * static_cast<int>(sizeof(CACHE_T)),
                                     PARTITION_SIZE > 0 ? PARTITION_SIZE / BLOCK_SIZE
                                                        : a.max_num_blocks_per_seq);
    if (stages > 0) {
      return launch_twin_kernel<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS, KV_DTYPE,
                                PARTITION_SIZE, G, S, true>(
          a, grid,
          static_cast<int>(twin_smem<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS, G, S>(
              shared_mem_size, stages)),
          shared_mem_size, per_kv, stream, f);
    }
  }
  return launch_twin_kernel<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS, KV_DTYPE,
                            PARTITION_SIZE, G, S, false>(a, grid, static_cast<int>(fixed),
                                                         shared_mem_size, per_kv, stream, f);
}

// Calls f(std::integral_constant<int, i>{}) for twin i of kTwins, so that f can name the
// twin's G and S as template arguments (kTwins[decltype(t)::value]); returns what f returns.
template <int I = 0, typename F>
auto with_twin(const int i, F&& f) {
  if constexpr (I + 1 < kNumTwins) {
    if (i != I) return with_twin<I + 1>(i, f);
  }
  return f(std::integral_constant<int, I>{});
}


// Runs the twin twin_for picks, if any: its index in kTwins, or -1. PARTITION_SIZE 0 is v1.
// `f`: the current device's facts, read here once per launch where a twin may run (the v2
// launcher's reduction uses them too); `reduced`: whether the twin did v2's reduction.
template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE,
          vllm::Fp8KVCacheDataType KV_DTYPE, bool IS_BLOCK_SPARSE, int NUM_THREADS,
          int PARTITION_SIZE>
int launch_some_twin(const dim3 grid, const int shared_mem_size, const cudaStream_t stream,
                     const GqaArgs<T, CACHE_T>& a, DeviceFacts& f, bool& reduced) {
  if constexpr (!has_twins<HEAD_SIZE, BLOCK_SIZE, CACHE_T, int(KV_DTYPE), IS_BLOCK_SPARSE>(
                    PARTITION_SIZE > 0)) {
    return -1;
  } else {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return -1;
    f = device_facts(dev);
    constexpr int kPartitionBlocks = PARTITION_SIZE > 0 ? PARTITION_SIZE / BLOCK_SIZE : 0;
    const int cta_blocks = kPartitionBlocks > 0 ? cmin(a.max_num_blocks_per_seq, kPartitionBlocks)
                                                : a.max_num_blocks_per_seq;
    // stock's CTAs per SM, for outlasts_stock (asked of the runtime once per kernel)
    int stock_per_sm = 0;
    if constexpr (PARTITION_SIZE == 0) {
      stock_per_sm = stock_v1_ctas_per_sm<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS,
                                          KV_DTYPE, IS_BLOCK_SPARSE>(dev, f.smem_per_sm,
                                                                     shared_mem_size);
    } else {
      stock_per_sm =
          resident_ctas_at<vllm::paged_attention_v2_kernel<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE,
                                                           NUM_THREADS, KV_DTYPE,
                                                           IS_BLOCK_SPARSE, PARTITION_SIZE>>(
              dev, NUM_THREADS, f.smem_per_sm, shared_mem_size);
    }
    const int i = twin_for(grid, PARTITION_SIZE > 0, cta_blocks, a.num_kv_heads, f,
                           [&](const int j) {
      return with_twin(j, [&](auto t) {
        constexpr TwinShape twin = kTwins[decltype(t)::value];
        return twin_smem<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS, twin.g, twin.s>(
            shared_mem_size);
      });
    }, stock_per_sm);
    if (i < 0) return -1;
    reduced = with_twin(i, [&](auto t) {
      constexpr TwinShape twin = kTwins[decltype(t)::value];
      return launch_twin<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS, KV_DTYPE,
                         PARTITION_SIZE, twin.g, twin.s>(a, grid, shared_mem_size, stream, f);
    });
    return i;
  }
}

// The first line of the v1 launcher's launch macro (one head size): true when it launched a
// twin (the macro then leaves the launcher's switch).
template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE,
          vllm::Fp8KVCacheDataType KV_DTYPE, bool IS_BLOCK_SPARSE, int NUM_THREADS>
bool launch_grouped_v1(const dim3 grid, const int shared_mem_size, const cudaStream_t stream,
                       const GqaArgs<T, CACHE_T>& a) {
  DeviceFacts f;
  bool reduced = false;  // v1 has no reduction
  return launch_some_twin<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, KV_DTYPE, IS_BLOCK_SPARSE,
                          NUM_THREADS, 0>(grid, shared_mem_size, stream, a, f, reduced) >= 0;
}


// The first line of the v2 launcher's launch macro (one head size): a twin that reduces the
// partitions itself (KVPREFETCH_TWIN_FUSE, where the launch fits: counters for its (sequence,
// head group) pairs, and room for 2 floats per partition in each head's logits;
// launch_twin_kernel decides the rest), else a twin, then the reduction: vLLM's reduce kernel
// as the launcher's macro would have launched it, or with KVPREFETCH_TWIN_PDL=2 kvprefetch's
// where pdl_reduce_after says so.
template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE,
          vllm::Fp8KVCacheDataType KV_DTYPE, bool IS_BLOCK_SPARSE, int NUM_THREADS,
          int PARTITION_SIZE>
bool launch_grouped_v2(const dim3 grid, const int shared_mem_size, const cudaStream_t stream,
                       const GqaArgs<T, CACHE_T>& args, T* out, const dim3 reduce_grid,
                       const int reduce_shared_mem_size, const int max_num_partitions) {
  if constexpr (!has_twins<HEAD_SIZE, BLOCK_SIZE, CACHE_T, int(KV_DTYPE), IS_BLOCK_SPARSE>(
                    true)) {
    return false;
  } else {
    DeviceFacts f;
    GqaArgs<T, CACHE_T> a = args;
    if (KVPREFETCH_TWIN_FUSE && 2LL * max_num_partitions * sizeof(float) <= shared_mem_size &&
        1LL * grid.x * grid.y <= kFuseCounters) {
      // grid.x: stock's heads, so this bounds the (sequence, head group) pairs of every twin.
      a.fused_out = out;
    }
    bool reduced = false;
    const int i = launch_some_twin<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, KV_DTYPE, IS_BLOCK_SPARSE,
                                   NUM_THREADS, PARTITION_SIZE>(grid, shared_mem_size, stream, a,
                                                                f, reduced);
    if (i < 0) return false;
    if (reduced) return true;
    const dim3 twin = twin_grid(grid, a.num_kv_heads, kTwins[i].g);
    const long long twin_ctas = 1LL * twin.x * twin.y * twin.z;
    if constexpr (KVPREFETCH_TWIN_PDL >= 2) {
      if (pdl_on(f) && pdl_reduce_after(twin_ctas, f.sm_count)) {
        launch_pdl(gqa_reduce_kernel<T, HEAD_SIZE, NUM_THREADS, PARTITION_SIZE>, reduce_grid,
                   dim3(NUM_THREADS), reduce_shared_mem_size, stream, true, out, a.exp_sums,
                   a.max_logits, a.out, a.seq_lens, max_num_partitions);
        return true;
      }
    }
    vllm::paged_attention_v2_reduce_kernel<T, HEAD_SIZE, NUM_THREADS, PARTITION_SIZE>
        <<<reduce_grid, dim3(NUM_THREADS), reduce_shared_mem_size, stream>>>(
            out, a.exp_sums, a.max_logits, a.out, a.seq_lens, max_num_partitions);
    return true;
  }
}
#endif  // !USE_ROCM
