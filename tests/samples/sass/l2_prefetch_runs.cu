// Prints how kv_l2_prefetch_kernel would cover sequences of the block counts given as
// arguments (kvprefetch::l2_prefetch_runs, launcher_prefetch.cuh): one line per count,
// "blocks ctas blocks_per_cta threads". Host code only: it runs on a machine without a GPU.
// tests/test_sass.py compiles it with nvcc and runs it.
#define KVPREFETCH_LAUNCHER_ONLY 1
#include <cstdio>
#include <cstdlib>
#include "kvprefetch/launcher_prefetch.cuh"

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const long long blocks = std::atoll(argv[i]);
    const kvprefetch::L2PrefetchRuns r = kvprefetch::l2_prefetch_runs(blocks);
    std::printf("%lld %u %d %d\n", blocks, r.ctas, r.blocks_per_cta, r.threads);
  }
  return 0;
}
