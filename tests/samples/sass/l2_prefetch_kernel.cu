// Instantiates kvprefetch's own launcher-side L2 prefetch kernel (launcher_prefetch.cuh, the
// `launch` variant) so tests/test_sass.py can disassemble it for Hopper and Blackwell. It
// includes what the `prefetch` variant's launchers include, so that compiled without
// KVPREFETCH_LAUNCHER_ONLY its module also holds the prologue's state (the module check's case).
#include <cstdint>
#include "kvprefetch/prefetch.cuh"

template __global__ void kvprefetch::kv_l2_prefetch_kernel<uint16_t>(
    const uint16_t*, const uint16_t*, const int*, const int*, int, int, int64_t, int64_t,
    uint32_t, int);
