// kvprefetch: what the `prefetch` and `launch` variants' patched sources include (vLLM's
// attention_kernels.cuh and its two launchers): the L2 prefetch instruction, the launch
// policy, the v2 prologue and the launchers' L2 prefetch kernel. The GQA twins (gqa_twins.cuh)
// are included by the `prefetch` variant's launchers after this.
//
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include "l2_prefetch.cuh"
#include "launch_policy.cuh"
#include "prologue.cuh"
#include "launcher_prefetch.cuh"
