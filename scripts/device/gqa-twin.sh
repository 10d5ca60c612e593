#!/usr/bin/env bash
# Exploration, ONE device call (about 7 minutes): the GQA-grouped twin kernel
# (csrc/gqa_grouped.cuh): one CTA per GQA group whose warps load each K/V block once and
# compute all of the group's query heads with it, each head's arithmetic exactly vLLM's.
# Nsight Compute (exploration run 17) found stock's large steps L2-throughput-bound (73-86% of
# peak, DRAM 38-45%): the 4 query heads of a kv head each read the same K/V. Trees (head 128,
# block 16, fp16 + bf16 caches), all but baseline/control the `prefetch` patch:
#   baseline; control (A/A); gqa_off (KVPREFETCH_GQA_DEFAULT_MODE=0: the twin compiled in,
#   never launched: the design before); gqa_on (=1: every launch the twin can take);
#   patched (auto; in runs 18-19 grids of at least 8 / 5 stock CTAs per SM, since bc68998 the
#   four-twin rule, so at HEAD gqa_on is the 4x1 twin forced and patched the shipped design).
# Timed, cold, every output bitwise vs stock: the issue's matrix (fp16), batch 1..16 x
# 512..16k and 16..48 x 512..4k (where the threshold falls), bf16 batch 1/8/64 x 512/4k/16k;
# then verify-kernel (its GPU identity check once more with the twin forced on).
# Run 18 ran this before the twin's host code had internal linkage: the three trees then
# shared one KVPREFETCH_GQA mode in the benchmark process (gqa_off/gqa_on measured as auto).
#   device tool: run(command="bash scripts/device/gqa-twin.sh", carry=[".carry"], timeout_s=570)
set -uo pipefail
BUDGET_S=${BUDGET_S:-550}
source "$(dirname "$0")/lib.sh"
begin_run gqa-twin
V=(--variant baseline --variant control --variant gqa_off --variant gqa_on --variant patched)
step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz --extra-tree control \
  --extra-tree gqa_off --extra-tree gqa_on || exit 3
for t in patched gqa_off gqa_on; do
  step 30 "${K[@]}" apply --workdir "$W" --variant prefetch --tree "$t" || exit 4
done
step 30 "${K[@]}" apply --workdir "$W" --variant control || exit 4
step 240 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes 128 \
  --block-sizes 16 --kv-dtypes fp16,bf16 --trees baseline,control,gqa_off,gqa_on,patched \
  --tree-define gqa_off:KVPREFETCH_GQA_DEFAULT_MODE=0 \
  --tree-define gqa_on:KVPREFETCH_GQA_DEFAULT_MODE=1 || exit 5
[ "$(left)" -gt 60 ] && bench 100 "${B[@]}" --mode cold --batch 1,8,32,64,128 \
  --context 512,1k,4k,16k "${V[@]}" --name matrix --formats json,md
[ "$(left)" -gt 60 ] && bench 90 "${B[@]}" --mode cold --batch 1,2,4,8,16 \
  --context 512,1k,2k,4k,16k "${V[@]}" --name small --formats json,md
[ "$(left)" -gt 60 ] && bench 80 "${B[@]}" --mode cold --batch 16,24,32,48 \
  --context 512,1k,2k,4k "${V[@]}" --name mid --formats json,md
[ "$(left)" -gt 50 ] && bench 80 "${B[@]}" --mode cold --batch 1,8,64 --context 512,4k,16k \
  --dtype bfloat16 "${V[@]}" --name bf16 --formats json,md
[ "$(left)" -gt 40 ] && { step 90 "${K[@]}" verify-kernel --workdir "$W" \
  --trees baseline,gqa_on,patched; cp "$W/verify/report.json" "$R/verify.json" 2>/dev/null; pack; }
summarize
