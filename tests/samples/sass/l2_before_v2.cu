// Prints, for each "mode fp16 stock_ctas sm_count" given as four arguments at a time, whether
// the `prefetch` variant's v2 launcher fires kv_l2_prefetch_kernel by
// kvprefetch::l2_before_v2_rule (csrc/prefetch_ptx.cuh): one line per case, 1 or 0. Host code
// only: it runs on a machine without a GPU. tests/test_sass.py compiles it with nvcc, with and
// without -DKVPREFETCH_V2_L2_FP16_MAX_CTAS_PER_SM.
#define KVPREFETCH_LAUNCHER_ONLY 1
#include <cstdio>
#include <cstdlib>
#include "prefetch_ptx.cuh"

int main(int argc, char** argv) {
  for (int i = 1; i + 3 < argc; i += 4) {
    const bool fires = kvprefetch::l2_before_v2_rule(std::atoi(argv[i]), std::atoi(argv[i + 1]),
                                                     std::atoll(argv[i + 2]),
                                                     std::atoi(argv[i + 3]));
    std::printf("%d\n", fires ? 1 : 0);
  }
  return 0;
}
