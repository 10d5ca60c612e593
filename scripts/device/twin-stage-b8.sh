#!/usr/bin/env bash
# Exploration, ONE device call (about 4 minutes): b8 x 1k, the one shape of issue 6's matrix
# still short of 1.4x with the staged twins (repeat run 41: 1.36x; v2, two partitions, the
# 2x2 twin's 256 CTAs, two per SM, then kvprefetch's reduce kernel as a programmatic dependent).
# Trees (head 128, block 16, fp16 + bf16), all but baseline the `prefetch` patch as shipped
# (staged twins) but for one define each:
#   baseline; patched; g42 (4x2 from 3 stock CTAs per SM instead of 5: b8 x 1k runs 4x2,
#   128 CTAs, one per SM, half the L2 reads); pdl1 (vLLM's reduce kernel after every twin:
#   KVPREFETCH_TWIN_PDL=1); l2all (the launcher's L2 prefetch kernel up to all of L2 instead of
#   half, so it fires at b8 x 1k's 33.6 MB: KVPREFETCH_AUTO_L2_DIVISOR=1).
# Timed, cold, every output bitwise vs stock: batch 1..16 x 512..16k and the issue's matrix.
#   device tool: run(command="bash scripts/device/twin-stage-b8.sh", carry=[".carry"],
#                    timeout_s=450)
set -uo pipefail
BUDGET_S=${BUDGET_S:-430}
source "$(dirname "$0")/lib.sh"
begin_run twin-stage-b8
EXTRA=(g42 pdl1 l2all)
D=(--tree-define g42:KVPREFETCH_TWIN_4X2_PCT=300 --tree-define pdl1:KVPREFETCH_TWIN_PDL=1
   --tree-define l2all:KVPREFETCH_AUTO_L2_DIVISOR=1)
explore_build 200 "${EXTRA[@]}" -- "${D[@]}"
[ "$(left)" -gt 60 ] && bench 120 "${B[@]}" --mode cold --batch 1,2,4,8,16 \
  --context 512,1k,2k,4k,16k "${V[@]}" --name small --formats json,md
[ "$(left)" -gt 50 ] && bench 110 "${B[@]}" --mode cold --batch 1,8,32,64,128 \
  --context 512,1k,4k,16k "${V[@]}" --name matrix --formats json,md
summarize
