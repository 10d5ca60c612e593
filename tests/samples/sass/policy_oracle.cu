// The launch policy's decisions as csrc/kvprefetch/launch_policy.cuh compiles them, for any
// inputs: a host program that reads queries from the file named by its argument, one a line,
// "NAME ARG...", all integers (booleans 0/1), and prints one integer answer a line, in order.
// tests/integration/test_sass.py generates the queries (a seeded sample and the boundaries)
// and compares every answer with kvprefetch.kernels.policy, the Python statement of the same
// policy. Host code only: it runs on a machine without a GPU.
//
// Each NAME is the header's function of that name with its arguments in its order, except
// where the launchers compute the arguments (the header has no host function for that step;
// gqa_twins_launch.cuh, which does, needs vLLM's attention_kernels.cuh first), restated here:
//   twin_smem G S CONTEXT V2 HEAD BLOCK: a 16-bit twin's dynamic shared memory, unstaged, as
//       the launchers size it: G times stock's (vLLM's launchers: the logits of the padded
//       context in v1, of a partition in v2, or the output scratch if larger) plus the V
//       products of the warps beyond stock's (gqa_twins_device.cuh twin_smem_before).
//   twin_pick MODE HEADS KV_HEADS BATCH CONTEXT V2 HEAD BLOCK SMS SMEM_PER_SM MAX_SMEM
//       STOCK_PER_SM: which twin a decode step of that launch gets (gqa_twins_launch.cuh twin_for:
//       stock's grid heads x batch x partitions, its longest CTA's blocks, each twin's
//       twin_smem), -1 for vLLM's kernel.
//   twin_reduces V2 G S TWIN_CTAS SMS: whether twin (G, S) reduces inside, where its launcher
//       allows it (gqa_twins_device.cuh fusable: v2 and rules.inc's kFusedGroup x kFusedSplit).
#define KVPREFETCH_LAUNCHER_ONLY 1
#include <cstdio>
#include <cstring>

#include "kvprefetch/launch_policy.cuh"

namespace {

constexpr int kPartitionSize = 512;  // vLLM's v2 PARTITION_SIZE
constexpr int kStockThreads = 128;   // vLLM's launchers' NUM_THREADS

long long cdiv(const long long a, const long long b) { return (a + b - 1) / b; }

// gqa_twins_device.cuh v_rows_per_thread for a 16-bit scalar_t (vectors of min(8, block) elements).
long long v_rows_per_thread(const int head, const int block) {
  const int vec = block < 8 ? block : 8;
  return cdiv(head, 32 / (block / vec));
}

long long twin_smem(const int g, const int s, const long long context, const bool v2,
                    const int head, const int block) {
  const long long logits = (v2 ? kPartitionSize : cdiv(context, block) * block) * 4;
  const long long outputs = (kStockThreads / 32 / 2) * head * 4LL;
  const long long stock = logits > outputs ? logits : outputs;
  const long long products =
      1LL * (s - 1) * (kStockThreads / 32) * g * v_rows_per_thread(head, block) * 32;
  return g * stock + 4 * products;
}

long long twin_pick(const long long* a) {
  const int mode = static_cast<int>(a[0]), heads = static_cast<int>(a[1]);
  const int kv = static_cast<int>(a[2]);
  const long long batch = a[3], context = a[4];
  const bool v2 = a[5] != 0;
  const int head = static_cast<int>(a[6]), block = static_cast<int>(a[7]);
  const int sms = static_cast<int>(a[8]);
  const long long smem_per_sm = a[9], max_smem = a[10];
  const int stock_per_sm = static_cast<int>(a[11]);
  if (mode == kvprefetch::kTwinOff || kv <= 0 || heads % kv != 0) return -1;  // twin_for
  long long smem[kvprefetch::kNumTwins];
  for (int i = 0; i < kvprefetch::kNumTwins; ++i) {
    smem[i] = twin_smem(kvprefetch::kTwins[i].g, kvprefetch::kTwins[i].s, context, v2, head,
                        block);
  }
  const long long parts = v2 ? cdiv(context, kPartitionSize) : 1;
  const long long blocks = cdiv(context, block);
  const long long per_part = kPartitionSize / block;
  const int cta_blocks = static_cast<int>(v2 && blocks > per_part ? per_part : blocks);
  const kvprefetch::TwinStep step{1LL * heads * batch * parts, 1LL * heads * (batch + parts - 1),
                                  v2, cta_blocks, stock_per_sm, batch};
  return kvprefetch::twin_pick(mode, step, sms, heads / kv, smem, max_smem, smem_per_sm);
}

// The answer to query `name` with arguments `a` (`n` of them); false where the name or the
// count is unknown.
bool answer(const char* name, const long long* a, const int n, long long* out) {
  using namespace kvprefetch;
  const auto is = [&](const char* want, const int args) {
    return std::strcmp(name, want) == 0 && n == args;
  };
  const auto i = [&](const int k) { return static_cast<int>(a[k]); };
  if (is("k_registers", 3)) {
    *out = k_registers(i(0), i(1), i(2));
  } else if (is("min_blocks_rule", 5)) {
    *out = min_blocks_rule(a[0] != 0, i(1), i(2), i(3), i(4));
  } else if (is("prologue_rule", 6)) {
    *out = prologue_rule(i(0), i(1), i(2), a[3] != 0, a[4] != 0, a[5] != 0);
  } else if (is("twin_rule", 6)) {
    *out = twin_rule(a[0] != 0, i(1), i(2), a[3] != 0, a[4] != 0, a[5] != 0);
  } else if (is("auto_twin", 2)) {
    *out = auto_twin(a[0], a[1] != 0);
  } else if (is("chain_safe", 1)) {
    *out = chain_safe(i(0));
  } else if (is("twin_heads", 3)) {
    *out = twin_heads(a[0], i(1), i(2));
  } else if (is("twin_bound_ctas", 1)) {
    *out = twin_bound_ctas(i(0));
  } else if (is("smem_ctas", 2)) {
    *out = smem_ctas(a[0], a[1]);
  } else if (is("keeps_occupancy", 5)) {
    *out = keeps_occupancy(i(0), a[1], i(2), a[3], a[4]);
  } else if (is("least_waves", 4)) {
    *out = least_waves(a[0], a[1], i(2), i(3));
  } else if (is("outlasts_stock", 8)) {
    *out = outlasts_stock(a[0], a[1], i(2), a[3], a[4], i(5), i(6), i(7));
  } else if (is("more_waves_for_some", 6)) {
    *out = more_waves_for_some(a[0], a[1], i(2), a[3], i(4), i(5));
  } else if (is("stock_v1_wins", 5)) {
    *out = stock_v1_wins(a[0], a[1], i(2), i(3), i(4));
  } else if (is("stage_count", 7)) {
    *out = stage_count(a[0], i(1), a[2], a[3], i(4), i(5), i(6));
  } else if (is("pdl_reduce_after", 2)) {
    *out = pdl_reduce_after(a[0], i(1));
  } else if (is("twin_reduces", 5)) {
    *out = twin_reduces(a[0] != 0 && a[1] == kFusedGroup && a[2] == kFusedSplit, true, a[3],
                        i(4));
  } else if (is("twin_smem", 6)) {
    *out = twin_smem(i(0), i(1), a[2], a[3] != 0, i(4), i(5));
  } else if (is("twin_pick", 12)) {
    *out = twin_pick(a);
  } else {
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s QUERIES\n", argv[0]);
    return 2;
  }
  FILE* in = std::fopen(argv[1], "r");
  if (in == nullptr) {
    std::perror(argv[1]);
    return 2;
  }
  char line[1024];
  for (long lineno = 1; std::fgets(line, sizeof(line), in) != nullptr; ++lineno) {
    char name[64];
    int used = 0;
    if (std::sscanf(line, "%63s%n", name, &used) != 1) continue;  // a blank line
    long long a[16];
    int n = 0, more = 0;
    while (n < 16 && std::sscanf(line + used, "%lld%n", &a[n], &more) == 1) {
      used += more;
      ++n;
    }
    long long out = 0;
    if (!answer(name, a, n, &out)) {
      std::fprintf(stderr, "line %ld: unknown query %s with %d arguments\n", lineno, name, n);
      return 1;
    }
    std::printf("%lld\n", out);
  }
  std::fclose(in);
  return 0;
}
