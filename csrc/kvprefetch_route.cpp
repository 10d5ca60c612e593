// kvprefetch overlay: routes vLLM's OWN ops, _C::paged_attention_v1 and _C::paged_attention_v2,
// to this library's kernels (one tree's real paged_attention_v1/v2.cu), by registering this
// library's launchers as the ops' CUDA kernels in the PyTorch dispatcher.
//
// Why the dispatcher and not a Python attribute: every caller of the op -- vllm._custom_ops,
// a direct torch.ops._C.paged_attention_v1, anything captured into a CUDA graph while the
// capture runs through the dispatcher -- ends in the CUDA slot of the op's dispatch table, so
// replacing that slot routes all of them at once; a later `from vllm._custom_ops import
// paged_attention_v1` cannot hold on to the old function. The kernel registered is a C++
// function pointer (as vLLM's own registration is): no Python on the decode path.
//
// Compiled only into overlay builds (kvprefetch build --mode overlay), next to
// kvprefetch_ops.cpp, which defines the namespace KVPREFETCH_NAMESPACE.
// SPDX-License-Identifier: Apache-2.0
#include <dlfcn.h>
#include <stdlib.h>

#include <atomic>
#include <climits>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/all.h>
#include <torch/library.h>

#ifndef KVPREFETCH_NAMESPACE
  #error "define KVPREFETCH_NAMESPACE (e.g. -DKVPREFETCH_NAMESPACE=kvprefetch_patched)"
#endif

void paged_attention_v1(
    torch::Tensor& out, torch::Tensor& query, torch::Tensor& key_cache,
    torch::Tensor& value_cache, int64_t num_kv_heads, double scale,
    torch::Tensor& block_tables, torch::Tensor& seq_lens, int64_t block_size,
    int64_t max_seq_len, const std::optional<torch::Tensor>& alibi_slopes,
    const std::string& kv_cache_dtype, torch::Tensor& k_scale,
    torch::Tensor& v_scale, const int64_t tp_rank,
    const int64_t blocksparse_local_blocks,
    const int64_t blocksparse_vert_stride, const int64_t blocksparse_block_size,
    const int64_t blocksparse_head_sliding_step);

void paged_attention_v2(
    torch::Tensor& out, torch::Tensor& exp_sums, torch::Tensor& max_logits,
    torch::Tensor& tmp_out, torch::Tensor& query, torch::Tensor& key_cache,
    torch::Tensor& value_cache, int64_t num_kv_heads, double scale,
    torch::Tensor& block_tables, torch::Tensor& seq_lens, int64_t block_size,
    int64_t max_seq_len, const std::optional<torch::Tensor>& alibi_slopes,
    const std::string& kv_cache_dtype, torch::Tensor& k_scale,
    torch::Tensor& v_scale, const int64_t tp_rank,
    const int64_t blocksparse_local_blocks,
    const int64_t blocksparse_vert_stride, const int64_t blocksparse_block_size,
    const int64_t blocksparse_head_sliding_step);

namespace {

// Dispatch probe (verify-kernel on a machine without a GPU): while on, the routed kernels
// count the call and return before touching the device. Off by default; one relaxed load per
// eager call otherwise (a CUDA-graph replay runs no host code at all).
std::atomic<bool> g_probe{false};
std::atomic<int64_t> g_hits_v1{0};
std::atomic<int64_t> g_hits_v2{0};

void routed_paged_attention_v1(
    torch::Tensor& out, torch::Tensor& query, torch::Tensor& key_cache,
    torch::Tensor& value_cache, int64_t num_kv_heads, double scale,
    torch::Tensor& block_tables, torch::Tensor& seq_lens, int64_t block_size,
    int64_t max_seq_len, const std::optional<torch::Tensor>& alibi_slopes,
    const std::string& kv_cache_dtype, torch::Tensor& k_scale,
    torch::Tensor& v_scale, const int64_t tp_rank,
    const int64_t blocksparse_local_blocks,
    const int64_t blocksparse_vert_stride, const int64_t blocksparse_block_size,
    const int64_t blocksparse_head_sliding_step) {
  if (g_probe.load(std::memory_order_relaxed)) {
    g_hits_v1.fetch_add(1);
    return;
  }
  paged_attention_v1(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables,
                     seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype, k_scale,
                     v_scale, tp_rank, blocksparse_local_blocks, blocksparse_vert_stride,
                     blocksparse_block_size, blocksparse_head_sliding_step);
}

void routed_paged_attention_v2(
    torch::Tensor& out, torch::Tensor& exp_sums, torch::Tensor& max_logits,
    torch::Tensor& tmp_out, torch::Tensor& query, torch::Tensor& key_cache,
    torch::Tensor& value_cache, int64_t num_kv_heads, double scale,
    torch::Tensor& block_tables, torch::Tensor& seq_lens, int64_t block_size,
    int64_t max_seq_len, const std::optional<torch::Tensor>& alibi_slopes,
    const std::string& kv_cache_dtype, torch::Tensor& k_scale,
    torch::Tensor& v_scale, const int64_t tp_rank,
    const int64_t blocksparse_local_blocks,
    const int64_t blocksparse_vert_stride, const int64_t blocksparse_block_size,
    const int64_t blocksparse_head_sliding_step) {
  if (g_probe.load(std::memory_order_relaxed)) {
    g_hits_v2.fetch_add(1);
    return;
  }
  paged_attention_v2(out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache,
                     num_kv_heads, scale, block_tables, seq_lens, block_size, max_seq_len,
                     alibi_slopes, kv_cache_dtype, k_scale, v_scale, tp_rank,
                     blocksparse_local_blocks, blocksparse_vert_stride, blocksparse_block_size,
                     blocksparse_head_sliding_step);
}

// The file the loader mapped the code at `fn` from (dladdr), resolved: which library really
// holds the function a pointer names.
std::string library_of(const void* fn) {
  Dl_info info;
  if (dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return "";
  char buf[PATH_MAX];
  if (realpath(info.dli_fname, buf) == nullptr) return info.dli_fname;
  return buf;
}

std::string json_str(const std::string& s) {
  std::ostringstream o;
  o << '"';
  for (char c : s) {
    if (c == '"' || c == '\\') o << '\\' << c;
    else if (static_cast<unsigned char>(c) < 0x20) o << ' ';
    else o << c;
  }
  o << '"';
  return o.str();
}

std::mutex g_mu;
torch::Library* g_lib = nullptr;  // kept for the process's lifetime: dropping it unregisters
std::string g_site;               // the registration's "file", shown by the dispatcher

std::string state_json() {
  std::ostringstream o;
  o << "{\"routed\": " << (g_lib ? "true" : "false")
    << ", \"namespace\": " << json_str(C10_STRINGIZE(KVPREFETCH_NAMESPACE))
    << ", \"registration\": " << json_str(g_site)
    << ", \"routed_v1_library\": " << json_str(library_of(
           reinterpret_cast<const void*>(&routed_paged_attention_v1)))
    << ", \"routed_v2_library\": " << json_str(library_of(
           reinterpret_cast<const void*>(&routed_paged_attention_v2)))
    << ", \"kernel_v1_library\": " << json_str(library_of(
           reinterpret_cast<const void*>(&paged_attention_v1)))
    << ", \"kernel_v2_library\": " << json_str(library_of(
           reinterpret_cast<const void*>(&paged_attention_v2)))
    << "}";
  return o.str();
}

// Make this library's launchers the CUDA kernels of _C::paged_attention_v1/v2. vLLM's _C must
// be loaded first (the last registration for a dispatch key wins, so a _C loaded after this
// would take the slot back); idempotent, as vLLM may run a plugin several times per process.
std::string route_into_vllm() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_lib == nullptr) {
    for (const char* op : {"_C::paged_attention_v1", "_C::paged_attention_v2"}) {
      auto handle = c10::Dispatcher::singleton().findSchema({op, ""});
      TORCH_CHECK(handle.has_value(), "kvprefetch overlay: vLLM's ", op,
                  " is not registered in this process (vllm._C is not loaded); import "
                  "vllm._C before routing");
    }
    g_site = "kvprefetch-overlay:" +
             library_of(reinterpret_cast<const void*>(&routed_paged_attention_v1));
    g_lib = new torch::Library(torch::Library::IMPL, "_C", c10::DispatchKey::CUDA,
                               g_site.c_str(), 0);
    g_lib->impl("paged_attention_v1", TORCH_FN(routed_paged_attention_v1));
    g_lib->impl("paged_attention_v2", TORCH_FN(routed_paged_attention_v2));
  }
  return state_json();
}

std::string route_state() {
  std::lock_guard<std::mutex> lock(g_mu);
  return state_json();
}

void route_probe(bool on) {
  if (on) {
    g_hits_v1.store(0);
    g_hits_v2.store(0);
  }
  g_probe.store(on);
}

std::vector<int64_t> route_hits() { return {g_hits_v1.load(), g_hits_v2.load()}; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(KVPREFETCH_NAMESPACE, ops) {
  ops.def("route_into_vllm() -> str", &route_into_vllm);
  ops.def("route_state() -> str", &route_state);
  ops.def("route_probe(bool on) -> ()", &route_probe);
  ops.def("route_hits() -> int[]", &route_hits);
}
