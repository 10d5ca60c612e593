#!/usr/bin/env bash
# Exploration, ONE device call (about 5 minutes): the four twins of csrc/gqa_grouped.cuh
# ((G, S) = 4x1, 4x2, 2x2, 2x4: G query heads and S times stock's threads per CTA) and the
# `auto` rule that picks one by stock CTAs per SM; the block-table hoist (WarpBlockNumbers);
# the launcher's L2 prefetch up to all of L2 instead of half. Trees (head 128, block 16,
# fp16 + bf16), all but baseline the `prefetch` patch:
#   baseline; patched (auto); nohoist (KVPREFETCH_TWIN_HOIST=0); l2all
#   (KVPREFETCH_AUTO_L2_DIVISOR=1); f41 f42 f22 f24 (KVPREFETCH_GQA_DEFAULT_MODE=3..6: that twin
#   at every launch it can take). Run 22 ran at d3cbb77, whose encoding of that macro was 0..3.
# Timed, cold, every output bitwise vs stock: batch 1..16 x 512..16k, the issue's matrix,
# bf16 batch 1/8 x 512..16k.
#   device tool: run(command="bash scripts/device/twin-shapes.sh", carry=[".carry"], timeout_s=590)
set -uo pipefail
BUDGET_S=${BUDGET_S:-570}
source "$(dirname "$0")/lib.sh"
begin_run twin-shapes
FORCED=(f41 f42 f22 f24)
EXTRA=(nohoist l2all "${FORCED[@]}")
D=(--tree-define nohoist:KVPREFETCH_TWIN_HOIST=0 --tree-define l2all:KVPREFETCH_AUTO_L2_DIVISOR=1)
for i in "${!FORCED[@]}"; do
  D+=(--tree-define "${FORCED[$i]}:KVPREFETCH_GQA_DEFAULT_MODE=$((i + 3))")
done
explore_build 300 "${EXTRA[@]}" -- "${D[@]}"
twin_tables
summarize
