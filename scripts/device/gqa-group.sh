#!/usr/bin/env bash
# Exploration, ONE device call (about 8 minutes): does running the query heads of a GQA group
# in one CTA (paged_attention_grouped_kernel, prefetch_ptx.cuh "GQA groups") make decode
# faster? vLLM's kernels run one CTA per query head, so each of Llama-3.1-8B's 4 query heads
# per kv head reads the same K/V from L2: with every KV load an L2 hit stock runs only
# 1.09-1.2x faster on large steps (docs/results/2026-11-29-h200-l2-bound), so the L2-to-SM path,
# not DRAM, is the limit there. A grouped CTA's four 128-thread slices compute their heads
# exactly as stock does, and their loads of the same addresses meet in the SM's L1.
# Trees (head 128, block 16, fp16 + bf16 caches), all but baseline/control the `prefetch` patch:
#   baseline; control (A/A); grp_off (KVPREFETCH_GQA_DEFAULT_MODE=0: the design before);
#   grp_on (=1: every launch with a twin grouped); patched (auto, the compiled-in threshold).
# Timed: the issue's matrix cold (fp16), batch 1..16 x context 512..16k cold (where a
# threshold would fall), bf16 batch 1/8/64 x 512/4k/16k cold. Every output bitwise vs stock.
#   device tool: run(command="bash scripts/device/gqa-group.sh", carry=[".carry"], timeout_s=560)
# Run 16 measured it at 21697a3; the grouped twin was removed after it (slower on every fp16
# shape, docs/tuning-log.md row 30), so rerun it from a checkout of 21697a3.
set -uo pipefail
BUDGET_S=${BUDGET_S:-540}
source "$(dirname "$0")/lib.sh"
begin_run gqa-group
grep -q grouped_rule csrc/prefetch_ptx.cuh || {
  log "this checkout has no grouped twin (removed after run 16): run it from 'git checkout 21697a3'"
  exit 2; }
V=(--variant baseline --variant control --variant grp_off --variant grp_on --variant patched)
step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz --extra-tree control \
  --extra-tree grp_off --extra-tree grp_on || exit 3
for t in patched grp_off grp_on; do
  step 30 "${K[@]}" apply --workdir "$W" --variant prefetch --tree "$t" || exit 4
done
step 30 "${K[@]}" apply --workdir "$W" --variant control || exit 4
step 240 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes 128 \
  --block-sizes 16 --kv-dtypes fp16,bf16 --trees baseline,control,grp_off,grp_on,patched \
  --tree-define grp_off:KVPREFETCH_GQA_DEFAULT_MODE=0 \
  --tree-define grp_on:KVPREFETCH_GQA_DEFAULT_MODE=1 || exit 5
[ "$(left)" -gt 60 ] && bench 100 "${B[@]}" --mode cold --batch 1,8,32,64,128 \
  --context 512,1k,4k,16k "${V[@]}" --name matrix --formats json,md
[ "$(left)" -gt 60 ] && bench 90 "${B[@]}" --mode cold --batch 1,2,4,8,16 \
  --context 512,1k,2k,4k,16k "${V[@]}" --name small --formats json,md
[ "$(left)" -gt 50 ] && bench 80 "${B[@]}" --mode cold --batch 1,8,64 --context 512,4k,16k \
  --dtype bfloat16 "${V[@]}" --name bf16 --formats json,md
summarize
