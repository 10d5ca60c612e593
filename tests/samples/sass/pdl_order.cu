// Three tiny kernels, our own, to make a REAL sm_90 SASS listing for tests/test_sass.py's check
// of programmatic dependent launch (verify-kernel's "twins wait for the previous kernel before
// touching memory"): one waits (griddepcontrol.wait, SASS ACQBULK) before its first global
// load, as kvprefetch's twins do (csrc/kvprefetch/gqa_twins.cuh, pdl_start); one loads first and waits
// after; one never waits. Their names carry "gqa_reduce_kernel" so that the check looks at
// them.
__global__ void gqa_reduce_kernel_waits_first(float* out, const float* in) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  out[threadIdx.x] = in[threadIdx.x] * 2.f;
}

__global__ void gqa_reduce_kernel_loads_first(float* out, const float* in) {
  const float v = in[threadIdx.x];
  asm volatile("griddepcontrol.wait;" ::: "memory");
  out[threadIdx.x] = v * 2.f;
}

__global__ void gqa_reduce_kernel_never_waits(float* out, const float* in) {
  out[threadIdx.x] = in[threadIdx.x] * 2.f;
}
