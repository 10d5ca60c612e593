#!/usr/bin/env bash
# Exploration, ONE device call (about 4 minutes): the twins ask L2 for their first chunks
# BEFORE griddepcontrol.wait (KVPREFETCH_TWIN_EARLY = chunks per warp, K then V in the order
# the passes read them). A twin is a programmatic dependent: its CTAs are placed while the
# stream's previous kernel (the last layer's reduce kernel or twin) still runs, and until now
# they touched no memory before the wait. DRAM is nearly idle while a reduce kernel runs
# (b8 x 1k: 2-4 us of each 20 us step, exploration run 46), which is where the prefetches go.
# Trees (head 128, block 16, fp16 + bf16): baseline; patched (the shipped `prefetch`);
# early2 / early4 / early64 (the first 2, 4 or up to 64 chunks of each warp).
# Timed, cold, every output bitwise vs stock: batch 1..16 x 512..16k, the issue's matrix, bf16
# batch 1/8.
#   device tool: run(command="bash scripts/device/twin-early.sh", carry=[".carry"],
#                    timeout_s=400)
set -uo pipefail
BUDGET_S=${BUDGET_S:-380}
source "$(dirname "$0")/lib.sh"
begin_run twin-early
explore_build 200 early2 early4 early64 -- --tree-define early2:KVPREFETCH_TWIN_EARLY=2 \
  --tree-define early4:KVPREFETCH_TWIN_EARLY=4 --tree-define early64:KVPREFETCH_TWIN_EARLY=64
res_usage
pack
twin_tables
summarize
