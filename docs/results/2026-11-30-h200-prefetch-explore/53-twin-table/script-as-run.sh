#!/usr/bin/env bash
# Exploration, ONE device call (about 3 minutes): the twins' first block numbers loaded beside
# seq_len (KVPREFETCH_TWIN_TABLE_FIRST=1: each lane's first entry, bounded by the table's row,
# issued right after griddepcontrol.wait) instead of after it, so a warp's first bulk copies
# wait on one L2 round trip after the wait instead of two. Exploration run 56 (twin-early.sh)
# showed the start of each CTA on the critical path of the small steps: work added before the
# wait (two dependent loads, then L2 prefetches) cost b8 x 1k 4%.
# Trees (head 128, block 16, fp16 + bf16): baseline; patched (the shipped `prefetch`); tbl.
# Timed, cold, every output bitwise vs stock: batch 1..16 x 512..16k, the issue's matrix, bf16
# batch 1/8.
#   device tool: run(command="bash scripts/device/twin-table.sh", carry=[".carry"],
#                    timeout_s=300)
set -uo pipefail
BUDGET_S=${BUDGET_S:-280}
source "$(dirname "$0")/lib.sh"
begin_run twin-table
explore_build 150 tbl -- --tree-define tbl:KVPREFETCH_TWIN_TABLE_FIRST=1
res_usage
pack
twin_tables
summarize
