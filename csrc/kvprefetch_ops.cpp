// kvprefetch: registers one tree's compiled paged-attention launchers as torch ops under a
// namespace of its own, KVPREFETCH_NAMESPACE (kvprefetch_baseline, kvprefetch_patched, ...),
// with vLLM v0.10.2's exact schemas (csrc/torch_bindings.cpp). Distinct namespaces let the
// stock and patched kernels load into one process for A/B checks; vLLM's own `_C` namespace
// can only be defined once per process.
//
// The two functions are defined by the tree's real csrc/attention/paged_attention_v{1,2}.cu.
// SPDX-License-Identifier: Apache-2.0
#include <optional>
#include <string>

#include <torch/all.h>
#include <torch/library.h>

#ifndef KVPREFETCH_NAMESPACE
  #error "define KVPREFETCH_NAMESPACE (e.g. -DKVPREFETCH_NAMESPACE=kvprefetch_patched)"
#endif
#ifndef KVPREFETCH_BUILD_INFO
  #define KVPREFETCH_BUILD_INFO "{}"
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

// A JSON string baked in at compile time: tree, variant, patch hash, instantiation set.
static std::string build_info() { return KVPREFETCH_BUILD_INFO; }

// TORCH_LIBRARY stringizes its namespace argument without expanding it in torch < 2.10 (2.8:
// `#ns`), which would register the ops under the literal name "KVPREFETCH_NAMESPACE"; one more
// macro level expands it first (vLLM's TORCH_LIBRARY_EXPAND does the same).
#define KVPREFETCH_TORCH_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
KVPREFETCH_TORCH_LIBRARY(KVPREFETCH_NAMESPACE, ops) {
  ops.def(
      "paged_attention_v1("
      "    Tensor! out, Tensor query, Tensor key_cache,"
      "    Tensor value_cache, int num_kv_heads, float scale,"
      "    Tensor block_tables, Tensor seq_lens, int block_size,"
      "    int max_seq_len, Tensor? alibi_slopes,"
      "    str kv_cache_dtype, Tensor k_scale, Tensor v_scale,"
      "    int tp_rank, int blocksparse_local_blocks,"
      "    int blocksparse_vert_stride, int blocksparse_block_size,"
      "    int blocksparse_head_sliding_step) -> ()");
  ops.impl("paged_attention_v1", torch::kCUDA, &paged_attention_v1);

  ops.def(
      "paged_attention_v2("
      "    Tensor! out, Tensor! exp_sums, Tensor! max_logits,"
      "    Tensor! tmp_out, Tensor query, Tensor key_cache,"
      "    Tensor value_cache, int num_kv_heads, float scale,"
      "    Tensor block_tables, Tensor seq_lens, int block_size,"
      "    int max_seq_len, Tensor? alibi_slopes,"
      "    str kv_cache_dtype, Tensor k_scale, Tensor v_scale,"
      "    int tp_rank, int blocksparse_local_blocks,"
      "    int blocksparse_vert_stride, int blocksparse_block_size,"
      "    int blocksparse_head_sliding_step) -> ()");
  ops.impl("paged_attention_v2", torch::kCUDA, &paged_attention_v2);

  ops.def("build_info() -> str", &build_info);
}
