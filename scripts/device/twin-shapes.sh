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
for i in "${!FORCED[@]}"; do D+=(--tree-define "${FORCED[$i]}:KVPREFETCH_GQA_DEFAULT_MODE=$((i + 3))"); done
V=(--variant baseline --variant patched); X=()
for t in "${EXTRA[@]}"; do V+=(--variant "$t"); X+=(--extra-tree "$t"); done
step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz "${X[@]}" || exit 3
for t in patched "${EXTRA[@]}"; do
  step 30 "${K[@]}" apply --workdir "$W" --variant prefetch --tree "$t" || exit 4
done
T=$(IFS=,; echo "baseline,patched,${EXTRA[*]}")
step 300 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes 128 \
  --block-sizes 16 --kv-dtypes fp16,bf16 --trees "$T" "${D[@]}" || exit 5
[ "$(left)" -gt 60 ] && bench 120 "${B[@]}" --mode cold --batch 1,2,4,8,16 \
  --context 512,1k,2k,4k,16k "${V[@]}" --name small --formats json,md
[ "$(left)" -gt 60 ] && bench 110 "${B[@]}" --mode cold --batch 1,8,32,64,128 \
  --context 512,1k,4k,16k "${V[@]}" --name matrix --formats json,md
[ "$(left)" -gt 40 ] && bench 70 "${B[@]}" --mode cold --batch 1,8 --context 512,1k,4k,16k \
  --dtype bfloat16 "${V[@]}" --name bf16 --formats json,md
summarize
