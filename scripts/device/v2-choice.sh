#!/usr/bin/env bash
# Exploration, ONE device call (about 6 minutes): for the v2 kernels that carry the prologue,
# which of three prefetches is best, shape by shape, and can the launcher tell beforehand?
# Exploration run 8 (v2-both.sh) found the launcher's L2 prefetch kernel beside the prologue
# faster at some 256-CTA grids (bf16 b1 x 4k 1.36 -> 1.53) and slower at 64-128 (Llama-3.1-8B
# b1 x 2k 1.52 -> 1.48), and `launch` better than both on Gemma-2B b1 x 16k.
# Trees (head 128/256, block 16, fp16 and bf16 caches), all but baseline/control/launch the
# shipped `prefetch` patch with different -D:
#   baseline; control (A/A: stock rebuilt); patched (shipped: the prologue, auto);
#   v2all (KVPREFETCH_V2_L2_KERNEL=2: the launcher's prefetch kernel too, both prefetching);
#   v2l2 (V2_L2_KERNEL=2 and AUTO_MAX_CTAS_PCT=0: the same code, the prologue never on, so only
#   the launcher prefetches); launch (stock kernels + the launcher's prefetch).
# Timed, cold: batch 1..16 x context 512..4k in fp16 and bf16 (Llama-3.1-8B), Gemma-2B
# (head 256, one kv head) batch 1..8 x 1k..16k, Llama-2-7B (MHA) batch 1..4 x 512..4k,
# then the issue's matrix.
#   device tool: run(command="bash scripts/device/v2-choice.sh", carry=[".carry"], timeout_s=480)
set -uo pipefail
BUDGET_S=${BUDGET_S:-450}
source "$(dirname "$0")/lib.sh"
begin_run v2-choice
V=(--variant baseline --variant patched --variant v2all --variant v2l2 --variant launch
   --variant control)

step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz --extra-tree control \
  --extra-tree v2all --extra-tree v2l2 --extra-tree launch || exit 3
for t in patched v2all v2l2; do
  step 30 "${K[@]}" apply --workdir "$W" --variant prefetch --tree "$t" || exit 4
done
step 30 "${K[@]}" apply --workdir "$W" --variant launch || exit 4
step 30 "${K[@]}" apply --workdir "$W" --variant control || exit 4
step 240 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes 128,256 \
  --block-sizes 16 --kv-dtypes fp16,bf16 --tree-define v2all:KVPREFETCH_V2_L2_KERNEL=2 \
  --tree-define v2l2:KVPREFETCH_V2_L2_KERNEL=2 --tree-define v2l2:KVPREFETCH_AUTO_MAX_CTAS_PCT=0 \
  || exit 5
step 90 "${K[@]}" verify-kernel --workdir "$W"
cp "$W/verify/report.json" "$R/verify.json" 2>/dev/null
SMALL=(--batch 1,2,4,8,16 --context 512,1k,2k,4k "${V[@]}")
[ "$(left)" -gt 50 ] && bench 60 "${B[@]}" --mode cold "${SMALL[@]}" --name small-fp16 \
  --formats json,md
[ "$(left)" -gt 50 ] && bench 60 "${B[@]}" --mode cold --dtype bfloat16 "${SMALL[@]}" \
  --name small-bf16 --formats json,md
[ "$(left)" -gt 50 ] && bench 90 "${B[@]}" --mode cold --preset gemma-2b --batch 1,2,4,8 \
  --context 1k,2k,4k,8k,16k "${V[@]}" --name gemma-2b --formats json,md
[ "$(left)" -gt 45 ] && bench 50 "${B[@]}" --mode cold --preset llama-2-7b --batch 1,2,4 \
  --context 512,1k,2k,4k "${V[@]}" --name llama-2-7b --formats json,md
[ "$(left)" -gt 45 ] && bench 60 "${B[@]}" --mode cold --batch 1,8,32,64,128 \
  --context 512,1k,4k,16k "${V[@]}" --name matrix --formats json,md
summarize
