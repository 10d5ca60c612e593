#!/usr/bin/env bash
# Exploration, ONE device call (about 6 minutes): the staged twins (KVPREFETCH_TWIN_STAGE,
# csrc/gqa_grouped.cuh): the S = 2 twins (2x2, 4x2) copy each warp's K and V chunks into a ring
# of shared-memory slots with Hopper's asynchronous bulk copy and compute from there; where
# two slots per warp do not fit beside the CTAs an SM holds, they load from global as before.
# Exploration run 39 (docs/results/2026-11-30-h200-prefetch-explore/39-twin-stage/) found two
# slots best and the S = 4 twin (2x4) slower staged; this run times the rule around it.
# Trees (head 128, block 16, fp16 + bf16), all but baseline the `prefetch` patch:
#   baseline; patched (KVPREFETCH_TWIN_STAGE=0, the shipped design); st (2 slots);
#   st3 (up to 3); stnol2 (st without the launcher's L2 prefetch kernel:
#   KVPREFETCH_DEFAULT_MODE=0); st42 (st with 4x2 from 3 stock CTAs per SM instead of 5).
# Timed, cold, every output bitwise vs stock: batch 1..16 x 512..16k, the issue's matrix,
# bf16 batch 1/8 x 512..16k.
#   device tool: run(command="bash scripts/device/twin-stage.sh", carry=[".carry"],
#                    timeout_s=600)
set -uo pipefail
BUDGET_S=${BUDGET_S:-585}
source "$(dirname "$0")/lib.sh"
begin_run twin-stage
EXTRA=(st st3 stnol2 st42)
D=(--tree-define patched:KVPREFETCH_TWIN_STAGE=0 --tree-define st:KVPREFETCH_TWIN_STAGE=2
   --tree-define st3:KVPREFETCH_TWIN_STAGE=3
   --tree-define stnol2:KVPREFETCH_TWIN_STAGE=2 --tree-define stnol2:KVPREFETCH_DEFAULT_MODE=0
   --tree-define st42:KVPREFETCH_TWIN_STAGE=2 --tree-define st42:KVPREFETCH_TWIN_4X2_PCT=300)
explore_build 300 "${EXTRA[@]}" -- "${D[@]}"
res_usage
twin_tables
summarize
