#!/usr/bin/env bash
# Exploration, ONE device call (about 5 minutes): do the v2 kernels that carry the prologue gain
# when the launcher's L2 prefetch kernel also runs beside them on steps <= L2/2? `launch`
# (stock kernels + that kernel) beat the prologue on Gemma-2B b1 x 4k/16k (1.32/1.24 vs
# 1.25/1.18, repeat run 7), while the prologue wins on Llama-3.1-8B b1 x 1k (1.51 vs 1.38).
# Trees (head 128/256, block 16, fp16 and bf16 caches):
#   baseline, control (A/A), patched (shipped), v2all (-DKVPREFETCH_V2_L2_KERNEL=2: the v2
#   launcher fires the prefetch kernel before every v2 kernel, the prologue ones too), launch.
# Timed, cold: the issue's matrix; batch 1..16 x context 512..4k; Gemma-2B and bf16 at
# batch 1/8/64 x 512/4k/16k.
#   device tool: run(command="bash scripts/device/v2-both.sh", carry=[".carry"], timeout_s=420)
set -uo pipefail
BUDGET_S=${BUDGET_S:-390}
source "$(dirname "$0")/lib.sh"
begin_run v2-both
V=(--variant baseline --variant patched --variant v2all --variant launch --variant control)

step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz --extra-tree control \
  --extra-tree v2all --extra-tree launch || exit 3
for t in patched v2all; do
  step 30 "${K[@]}" apply --workdir "$W" --variant prefetch --tree "$t" || exit 4
done
step 30 "${K[@]}" apply --workdir "$W" --variant launch || exit 4
step 30 "${K[@]}" apply --workdir "$W" --variant control || exit 4
step 200 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes 128,256 \
  --block-sizes 16 --kv-dtypes fp16,bf16 --tree-define v2all:KVPREFETCH_V2_L2_KERNEL=2 || exit 5
step 90 "${K[@]}" verify-kernel --workdir "$W"
cp "$W/verify/report.json" "$R/verify.json" 2>/dev/null
[ "$(left)" -gt 70 ] && bench 80 "${B[@]}" --mode cold --batch 1,8,32,64,128 \
  --context 512,1k,4k,16k "${V[@]}" --name matrix --formats json,md
[ "$(left)" -gt 60 ] && bench 60 "${B[@]}" --mode cold --batch 1,2,4,8,16 \
  --context 512,1k,2k,4k "${V[@]}" --name small --formats json,md
S=(--batch 1,8,64 --context 512,4k,16k "${V[@]}")
[ "$(left)" -gt 45 ] && bench 45 "${B[@]}" --mode cold --preset gemma-2b "${S[@]}" \
  --name preset-gemma-2b --formats json,md
[ "$(left)" -gt 45 ] && bench 45 "${B[@]}" --mode cold --dtype bfloat16 "${S[@]}" \
  --name dtype-bf16 --formats json,md
summarize
