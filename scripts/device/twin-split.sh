#!/usr/bin/env bash
# Exploration, ONE device call (about 3 minutes). Exploration run 53 (twin-table.sh at
# `8a9d375`): loading the first block numbers beside seq_len, which starts each warp's first
# bulk copies one L2 round trip sooner, was 5-6% SLOWER exactly on the 2x2 twin's 256-CTA grids
# (b8 x 1k, b4 x 2k, b16 x 512) and the same elsewhere. If the cause is the burst of every warp's ring
# requested at once (2 slots x 8 warps x 256 CTAs = 16 MB), spreading the requests should help:
# `split` (KVPREFETCH_TWIN_STAGE_SPLIT=1) requests each warp's first chunk before the query
# load and its barrier and the second after them. Run 54 (at `11b457c`) also timed `tblsplit`,
# with run 53's change, whose switch was removed since.
# Trees (head 128, block 16, fp16 + bf16): baseline; patched (the shipped `prefetch`, which
# since `7ff2faa` splits them: KVPREFETCH_TWIN_STAGE_SPLIT=1); split; nosplit (=0). Timed,
# cold, every output bitwise vs stock: batch 1..16 x 512..16k, the issue's matrix, bf16
# batch 1/8.
#   device tool: run(command="bash scripts/device/twin-split.sh", carry=[".carry"],
#                    timeout_s=300)
set -uo pipefail
BUDGET_S=${BUDGET_S:-280}
source "$(dirname "$0")/lib.sh"
begin_run twin-split
explore_build 160 split nosplit -- --tree-define split:KVPREFETCH_TWIN_STAGE_SPLIT=1 \
  --tree-define nosplit:KVPREFETCH_TWIN_STAGE_SPLIT=0
res_usage
pack
twin_tables
summarize
