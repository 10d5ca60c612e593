// Instantiates kvprefetch's own launcher-side L2 prefetch kernel (csrc/prefetch_ptx.cuh, the
// `launch` variant) so tests/test_sass.py can disassemble it for Hopper and Blackwell.
#include <cstdint>
#include "prefetch_ptx.cuh"

template __global__ void kvprefetch::kv_l2_prefetch_kernel<uint16_t>(
    const uint16_t*, const uint16_t*, const int*, const int*, int, int, int64_t, int64_t,
    uint32_t, int);
