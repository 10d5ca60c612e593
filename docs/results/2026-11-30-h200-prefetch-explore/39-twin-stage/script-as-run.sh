#!/usr/bin/env bash
# Exploration, ONE device call (about 9 minutes): the small-grid twins (S > 1) copy each warp's
# K and V chunks into a ring of shared-memory slots with Hopper's asynchronous bulk copy and
# compute from there (KVPREFETCH_TWIN_STAGE = the most slots per warp; csrc/gqa_grouped.cuh).
# Aimed at b8 x 512 (1.35x) and b8 x 1k (1.30x), where each warp's chain of dependent block
# loads, not bandwidth, sets the time (docs/prefetch-tuning.md, the last section).
# Trees (head 128, block 16, fp16 + bf16), all but baseline the `prefetch` patch:
#   baseline; patched (KVPREFETCH_TWIN_STAGE=0); s2, s4, s8 (at most 2, 4, 8 slots per warp);
#   s8nol2 (s8 without the launcher's L2 prefetch kernel: KVPREFETCH_DEFAULT_MODE=0).
# Timed, cold, every output bitwise vs stock: batch 1..16 x 512..16k, the issue's matrix,
# bf16 batch 1/8 x 512..16k.
#   device tool: run(command="bash scripts/device/twin-stage.sh", carry=[".carry"],
#                    timeout_s=600)
set -uo pipefail
BUDGET_S=${BUDGET_S:-585}
source "$(dirname "$0")/lib.sh"
begin_run twin-stage
EXTRA=(s2 s4 s8 s8nol2)
D=(--tree-define patched:KVPREFETCH_TWIN_STAGE=0 --tree-define s2:KVPREFETCH_TWIN_STAGE=2
   --tree-define s4:KVPREFETCH_TWIN_STAGE=4 --tree-define s8:KVPREFETCH_TWIN_STAGE=8
   --tree-define s8nol2:KVPREFETCH_TWIN_STAGE=8 --tree-define s8nol2:KVPREFETCH_DEFAULT_MODE=0)
explore_build 300 "${EXTRA[@]}" -- "${D[@]}"
res_usage
twin_tables
summarize
