#!/usr/bin/env bash
# Exploration, ONE device call (about 5 minutes): can the v2 prologue prefetch on large grids if
# the query heads of a GQA group stop repeating each other's requests? With the prologue forced
# on, large v2 grids ran 0.85-0.93x of the prologue compiled in but off (tuning-log row 8),
# while the L2-resident bound (scripts/device/l2-bound.sh) leaves 5-15% on those shapes. Each
# of the num_heads / num_kv_heads CTAs of a group asks for the same K/V chunks: 4x the bulk
# requests for Llama-3.1-8B. Trees (head 128, block 16, fp16):
#   baseline, patched (shipped: auto), control (A/A),
#   on      (-DKVPREFETCH_DEFAULT_MODE=1: every v2 launch prefetches; every CTA requests all),
#   lead_on (on + -DKVPREFETCH_GQA_SHARE=1: only the group's first CTA requests),
#   split_on(on + -DKVPREFETCH_GQA_SHARE=2: the group's CTAs split the requests).
# Timed: the issue's matrix, and batch 1..16 x context 1k..4k (the v2 shapes where a rule would
# switch), cold, all six in one process.
#   device tool: run(command="bash scripts/device/gqa-share.sh", carry=[".carry"], timeout_s=420)
set -uo pipefail
BUDGET_S=${BUDGET_S:-380}
source "$(dirname "$0")/lib.sh"
begin_run gqa-share
B+=(--mode cold)
V=(--variant baseline --variant patched --variant control --variant on --variant lead_on
   --variant split_on)

step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz \
  --extra-tree control --extra-tree on --extra-tree lead_on --extra-tree split_on || exit 3
for t in patched on lead_on split_on; do
  step 30 "${K[@]}" apply --workdir "$W" --variant prefetch --tree "$t" || exit 4
done
step 30 "${K[@]}" apply --workdir "$W" --variant control || exit 4
step 200 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes 128 \
  --block-sizes 16 --kv-dtypes fp16 \
  --tree-define on:KVPREFETCH_DEFAULT_MODE=1 \
  --tree-define lead_on:KVPREFETCH_DEFAULT_MODE=1 --tree-define lead_on:KVPREFETCH_GQA_SHARE=1 \
  --tree-define split_on:KVPREFETCH_DEFAULT_MODE=1 --tree-define split_on:KVPREFETCH_GQA_SHARE=2 \
  || exit 5
step 90 "${K[@]}" verify-kernel --workdir "$W"
cp "$W/verify/report.json" "$R/verify.json" 2>/dev/null
[ "$(left)" -gt 100 ] && { step 110 "${B[@]}" --batch 1,8,32,64,128 --context 512,1k,4k,16k \
  "${V[@]}" --name matrix --formats json,md; pack; }
[ "$(left)" -gt 60 ] && { step 80 "${B[@]}" --batch 1,2,4,8,16 --context 1k,2k,4k "${V[@]}" \
  --name small --formats json,md; pack; }
summarize
