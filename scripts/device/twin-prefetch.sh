#!/usr/bin/env bash
# Exploration, ONE device call (about 4 minutes): on the small grids (b8 x 512: 1.35x, b8 x 1k:
# 1.31x in exploration run 22, the issue asks 1.4x) the twins' warps each walk 2-4 blocks and
# the step's K and V come from DRAM. Tried here: the twins of S > 1 ask L2 for their warps'
# chunks before the K pass (KVPREFETCH_TWIN_PREFETCH: 1 = V, 2 = K and V), the small-grid twins
# with G = 1 (twice the CTAs, no shared loads), and the launcher's L2 prefetch kernel off.
# Trees (head 128, block 16, fp16 + bf16), all but baseline the `prefetch` patch:
#   baseline; patched (as run 22); tp1; tp2; g1 (KVPREFETCH_TWIN_SMALL_G=1); g1tp2;
#   tp2nol2 (tp2 with KVPREFETCH_DEFAULT_MODE=0: no launcher prefetch, no prologue).
# Timed, cold, every output bitwise vs stock: batch 1..16 x 512..16k, the issue's matrix,
# bf16 batch 1/8 x 512..16k.
#   device tool: run(command="bash scripts/device/twin-prefetch.sh", carry=[".carry"],
#                    timeout_s=590)
set -uo pipefail
BUDGET_S=${BUDGET_S:-570}
source "$(dirname "$0")/lib.sh"
begin_run twin-prefetch
EXTRA=(tp1 tp2 g1 g1tp2 tp2nol2)
D=(--tree-define tp1:KVPREFETCH_TWIN_PREFETCH=1 --tree-define tp2:KVPREFETCH_TWIN_PREFETCH=2
   --tree-define g1:KVPREFETCH_TWIN_SMALL_G=1 --tree-define g1tp2:KVPREFETCH_TWIN_SMALL_G=1
   --tree-define g1tp2:KVPREFETCH_TWIN_PREFETCH=2 --tree-define tp2nol2:KVPREFETCH_TWIN_PREFETCH=2
   --tree-define tp2nol2:KVPREFETCH_DEFAULT_MODE=0)
explore_build 300 "${EXTRA[@]}" -- "${D[@]}"
twin_tables
summarize
