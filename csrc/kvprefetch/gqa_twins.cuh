// kvprefetch: GQA-grouped twins of vLLM v0.10.2's paged attention decode kernel, with outputs
// bitwise equal to vLLM's own kernels.
//
// Why. vLLM's kernels run one CTA per (query head, sequence[, partition]), so the
// num_heads / num_kv_heads query heads of a GQA group each read the same K and V: for
// Llama-3.1-8B (4 query heads per kv head) every KV byte crosses the L2-to-SM path 4 times.
// On Hopper that path, not DRAM, is what large steps wait on (Nsight Compute: L2 throughput
// near its peak, DRAM well below; with every KV load an L2 hit stock runs only a little
// faster). Sharing the loads through L1 instead (several stock CTAs in one) measured slower.
//
// What. One CTA of S x NUM_THREADS threads per (GQA group of G query heads, sequence[,
// partition]): each warp loads a block's K (then V) once and computes all G heads with it. For
// every head the arithmetic is vLLM's, operation for operation: the same thread group and lane
// compute the same token's dot product with the same vllm::Qk_dot; the softmax and its max/sum
// reductions (vllm::block_sum) run over stock's 128-thread layout; stock's warp w adds the V
// products of its blocks w, w + 4, ... in that order (with S > 1 the CTA's other warps compute
// some of those products and hand them over in shared memory), and the cross-warp output
// reduction is stock's. So each head's output is bitwise the stock kernel's (bench kernel and
// verify-kernel check it). G > 1 reads each K/V chunk once instead of G times (large steps
// wait on the L2-to-SM path); S > 1 cuts each warp's chain of blocks S times (small grids wait
// on it: at b8 x 512 each of stock's warps walks 8 blocks one after the other).
//
// Where. The twins of rules.inc (kTwins, launch_policy.cuh), compiled beside the
// instantiations twin_rule names (rules.inc's KVP_TWIN_AT head and block sizes, fp16 caches,
// bf16 in v2 and in unbounded v1, no block sparsity) and launched by the launchers
// (launch_grouped_v1/_v2, from the first line the patch adds to each launcher's launch macro,
// so that a build narrowed to some head sizes compiles the twins of those only) when the
// model has at least G query heads per kv head (any number: a kv head's last CTA holds what
// is left of its heads); `auto` picks the twin by the grid's stock CTAs per SM (auto_twin).
// KVPREFETCH_GQA=off|auto|on|<twin name> at run time. The S = 2 twins also come staged: each
// warp's next K/V block is copied into a shared-memory ring with Hopper's bulk copy
// ("Staging", gqa_twins_device.cuh). vLLM's kernels are untouched; this header is included by
// the two launchers after attention_kernels.cuh.
//
// The twins are written in three parts, which this header includes in order inside its
// namespace (below):
//   gqa_twins_device.cuh  the device helpers: the loads, the shared-memory layout both sides
//                         size, the staging ring, v2's reduction inside the twin, a CTA's heads;
//   gqa_twins_kernel.cuh  the kernels, gqa_decode_kernel and gqa_reduce_kernel;
//   gqa_twins_launch.cuh  the host side: KVPREFETCH_GQA, which twin a launch runs, the launch,
//                         launch_grouped_v1/_v2 (what the patched launchers call).
// They are parts, not headers of their own: they need the includes and the anonymous namespace
// here, and refuse to be included anywhere else (KVPREFETCH_GQA_TWINS_PARTS). So the compiler
// reads, token for token, what it read when the twins were one file (issue 45: the
// preprocessed launchers compared before and after the split, every kernel's SASS by
// scripts/device/sass-identity.sh), and the patched launchers include this header alone.
// `apply` installs all four in each tree (upstream.KIT_HEADERS), and all four are part of
// each variant's patch hash.
//
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cfloat>
#include <cstdint>
#include <cstring>
#include <atomic>
#include <mutex>
#include <type_traits>

// vLLM's attention_kernels.cuh (no include guard) must come first: the launchers include this
// header right after it.
#include "launch_policy.cuh"
#include "stock_v1.cuh"

namespace kvprefetch {
// Everything here has internal linkage: each tree's library is loaded into one benchmark
// process, and a function-local static of an inline function with external linkage (the
// KVPREFETCH_GQA mode) is unified across libraries by the dynamic loader (STB_GNU_UNIQUE),
// so one tree's compiled-in default would silently apply to all.
namespace {
#define KVPREFETCH_GQA_TWINS_PARTS 1
#include "gqa_twins_device.cuh"
#include "gqa_twins_kernel.cuh"
#include "gqa_twins_launch.cuh"
#undef KVPREFETCH_GQA_TWINS_PARTS

}  // namespace
}  // namespace kvprefetch
