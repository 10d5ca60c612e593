#!/usr/bin/env bash
# Exploration, ONE device call (about 8 minutes): the `wide` twin (csrc/gqa_grouped.cuh, S > 1):
# the GQA-grouped twin with S times stock's warps per CTA. On small grids (b8 x 512: 7.8 warps
# per SM; b8 x 1k: 15.5) each of stock's warps walks 8 blocks one after the other; the wide
# twin's warps share a CTA's blocks (S times shorter chains), and the V products of the extra
# warps are added by stock's warp in stock's order, so outputs stay bitwise stock's. Which G
# and S suit which grid is what this run measures. Trees (head 128, block 16, fp16 + bf16), all
# but baseline the `prefetch` patch:
#   baseline; patched (auto: grouped G=4 from 5 stock CTAs per SM, wide G=4 S=4 below);
#   wGS (KVPREFETCH_GQA_DEFAULT_MODE=3: the wide twin with G, S at every launch it can take).
# Timed, cold, every output bitwise vs stock: batch 1..16 x 512..16k, the issue's matrix,
# bf16 batch 1/8 x 512..16k.
#   device tool: run(command="bash scripts/device/gqa-wide.sh", carry=[".carry"], timeout_s=590)
set -uo pipefail
BUDGET_S=${BUDGET_S:-570}
source "$(dirname "$0")/lib.sh"
begin_run gqa-wide
WIDE=(w44 w42 w24 w22)
V=(--variant baseline --variant patched)
D=()
for t in "${WIDE[@]}"; do
  V+=(--variant "$t")
  D+=(--tree-define "$t:KVPREFETCH_GQA_DEFAULT_MODE=3" --tree-define "$t:KVPREFETCH_WIDE_GROUP=${t:1:1}"
      --tree-define "$t:KVPREFETCH_WIDE_SPLIT=${t:2:1}")
done
X=(); for t in "${WIDE[@]}"; do X+=(--extra-tree "$t"); done
step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz "${X[@]}" || exit 3
for t in patched "${WIDE[@]}"; do
  step 30 "${K[@]}" apply --workdir "$W" --variant prefetch --tree "$t" || exit 4
done
T=$(IFS=,; echo "baseline,patched,${WIDE[*]}")
step 280 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes 128 \
  --block-sizes 16 --kv-dtypes fp16,bf16 --trees "$T" "${D[@]}" || exit 5
[ "$(left)" -gt 60 ] && bench 110 "${B[@]}" --mode cold --batch 1,2,4,8,16 \
  --context 512,1k,2k,4k,16k "${V[@]}" --name small --formats json,md
[ "$(left)" -gt 60 ] && bench 100 "${B[@]}" --mode cold --batch 1,8,32,64,128 \
  --context 512,1k,4k,16k "${V[@]}" --name matrix --formats json,md
[ "$(left)" -gt 40 ] && bench 60 "${B[@]}" --mode cold --batch 1,8 --context 512,1k,4k,16k \
  --dtype bfloat16 "${V[@]}" --name bf16 --formats json,md
summarize
