#!/usr/bin/env bash
# `bench kernel`'s full default matrix (batch 1,8,32,64,128 x context 512,1k,4k,16k,32k: issue
# 6's matrix plus 32k) for stock, the shipped `prefetch`, the paper's `seed` and the A/A
# `control`, in ONE device call (about 3 minutes): fetch the carried sdist, apply, kernels-only
# build (head 128, block 16, fp16), verify-kernel, one cold table with its heatmap.
#   device tool: run(command="bash scripts/device/default-matrix.sh", carry=[".carry"], timeout_s=240)
set -uo pipefail
BUDGET_S=${BUDGET_S:-225}
source "$(dirname "$0")/lib.sh"
begin_run default-matrix

step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz --with-seed \
  --extra-tree control || exit 3
for v in prefetch seed control; do
  step 30 "${K[@]}" apply --workdir "$W" --variant "$v" || exit 4
done
step 120 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes 128 \
  --block-sizes 16 --kv-dtypes fp16 || exit 5
step 40 "${K[@]}" verify-kernel --workdir "$W"
cp "$W/verify/report.json" "$R/verify.json" 2>/dev/null
[ "$(left)" -gt 30 ] && bench "$(left)" "${B[@]}" --mode cold --matrix default \
  --variant baseline --variant patched --variant seed --variant control \
  --name default-matrix --formats json,md,png
summarize
