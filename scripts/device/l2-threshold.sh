#!/usr/bin/env bash
# Exploration, ONE device call (about 4 minutes): now that the launcher's L2 prefetch kernel is
# the prefetch of the v2 kernels too (row 25 of docs/tuning-log.md), is L2/2 still the
# right step size to stop at? Row 20 set it on v1 steps (16.8 MB 1.12x, 33.6 MB 0.955x).
# Trees (head 128/256, block 16, fp16 and bf16 caches): baseline, control (A/A), patched
# (shipped: steps <= L2/2, 31 MB on the H200), thr1 (-DKVPREFETCH_AUTO_L2_DIVISOR=1: steps <= L2).
# Timed, cold: Llama-3.1-8B batch 1..16 x context 512..8k in fp16, batch 1..8 x 1k..8k in bf16,
# Gemma-2B batch 1..8 x 2k..16k: the steps of 33.6 MB (and 67 MB, beyond both) in v1 and v2.
#   device tool: run(command="bash scripts/device/l2-threshold.sh", carry=[".carry"], timeout_s=360)
set -uo pipefail
BUDGET_S=${BUDGET_S:-330}
source "$(dirname "$0")/lib.sh"
begin_run l2-threshold
V=(--variant baseline --variant patched --variant thr1 --variant control)

step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz --extra-tree control \
  --extra-tree thr1 || exit 3
for t in patched thr1; do
  step 30 "${K[@]}" apply --workdir "$W" --variant prefetch --tree "$t" || exit 4
done
step 30 "${K[@]}" apply --workdir "$W" --variant control || exit 4
step 150 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes 128,256 \
  --block-sizes 16 --kv-dtypes fp16,bf16 --tree-define thr1:KVPREFETCH_AUTO_L2_DIVISOR=1 || exit 5
[ "$(left)" -gt 40 ] && bench 70 "${B[@]}" --mode cold --batch 1,2,4,8,16 \
  --context 512,1k,2k,4k,8k "${V[@]}" --name small-fp16 --formats json,md
[ "$(left)" -gt 40 ] && bench 50 "${B[@]}" --mode cold --dtype bfloat16 --batch 1,2,4,8 \
  --context 1k,2k,4k,8k "${V[@]}" --name small-bf16 --formats json,md
[ "$(left)" -gt 40 ] && bench 60 "${B[@]}" --mode cold --preset gemma-2b --batch 1,2,4,8 \
  --context 2k,4k,8k,16k "${V[@]}" --name gemma-2b --formats json,md
summarize
