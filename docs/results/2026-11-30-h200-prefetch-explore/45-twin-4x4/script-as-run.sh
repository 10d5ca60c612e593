#!/usr/bin/env bash
# Exploration, ONE device call (about 5 minutes): a fifth twin, 4x4 (G = 4 query heads, 16
# warps per CTA), for b8 x 1k, the one shape of issue 6's matrix still short of 1.4x (repeat
# run 41: 1.36x with the staged 2x2 twin's 256 CTAs, two per SM, each warp 4 blocks per pass).
# 4x4 there: 128 CTAs, one per SM, the same 16 warps per SM, each warp 2 blocks per pass, and
# each K/V chunk read once instead of twice. Run 43's 4x2 there (one CTA of 8 warps per SM)
# ran 1.22x. Trees (head 128, block 16, fp16 + bf16), all but baseline the `prefetch` patch as
# shipped but for the defines named:
#   baseline; patched;
#   x44  (KVPREFETCH_TWIN_4X4_PCT=300: 4x4 from 3 to 5 stock CTAs per SM, staged, 2 slots);
#   x44u (the same, unstaged: KVPREFETCH_TWIN_STAGE_4X4=0);
#   x44r (x44 with kvprefetch's reduce kernel as a programmatic dependent after the 4x4's
#         128-CTA grid too: KVPREFETCH_PDL_REDUCE_MID=1; the shipped rule runs vLLM's there);
#   x44w (KVPREFETCH_TWIN_4X4_PCT=150: 4x4 instead of 2x2 everywhere 2x2 runs).
# Timed, cold, every output bitwise vs stock: batch 1..16 x 512..16k, the issue's matrix, bf16.
#   device tool: run(command="bash scripts/device/twin-4x4.sh", carry=[".carry"],
#                    timeout_s=480)
set -uo pipefail
BUDGET_S=${BUDGET_S:-460}
source "$(dirname "$0")/lib.sh"
begin_run twin-4x4
EXTRA=(x44 x44u x44r x44w)
D=(--tree-define x44:KVPREFETCH_TWIN_4X4_PCT=300
   --tree-define x44u:KVPREFETCH_TWIN_4X4_PCT=300 --tree-define x44u:KVPREFETCH_TWIN_STAGE_4X4=0
   --tree-define x44r:KVPREFETCH_TWIN_4X4_PCT=300 --tree-define x44r:KVPREFETCH_PDL_REDUCE_MID=1
   --tree-define x44w:KVPREFETCH_TWIN_4X4_PCT=150)
explore_build 240 "${EXTRA[@]}" -- "${D[@]}"
res_usage
twin_tables
summarize
