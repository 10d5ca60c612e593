#!/usr/bin/env bash
# `bench kernel`'s full default matrix (batch 1,8,32,64,128 x context 512,1k,4k,16k,32k: issue
# 6's matrix plus 32k; and batch 16,32,64,96,128,256 x context 6k,8k, the v1 steps of long
# context of issue 31) for stock, the shipped `prefetch`, the paper's variant (`paper`) and the A/A
# `control`, in ONE device call (about 6 minutes): fetch the carried sdist, apply, kernels-only
# build (head 128/256, block 16, fp16/bf16), verify-kernel, the GPU-marked tests, one cold table
# with its heatmap, then Gemma-2B (head 256) in bf16 and fp16, whose v2 kernels' prologue rule
# changed in row 29 of docs/tuning-log.md. NOPDL=1, NOSTAGE=1, NOFUSE=1 and NOSPLIT=1 add
# the designs before programmatic dependent launch, the shared-memory ring, v2's reduction in
# the twin and the ring's split first requests (lib.sh's alt_trees).
#   device tool: run(command="bash scripts/device/default-matrix.sh", carry=[".carry"], timeout_s=560)
# HEADLINE_ONLY=1: only what the README's headline table needs, in about 4 minutes: baseline,
# patched and control, head 128 / block 16 / fp16, the default matrix cold; no paper tree,
# verify-kernel, GPU tests or Gemma tables.
set -uo pipefail
BUDGET_S=${BUDGET_S:-530}
source "$(dirname "$0")/lib.sh"
begin_run default-matrix
V=(--tree baseline --tree patched --tree paper --tree control)
FETCH=(--with-paper --extra-tree control)
VARIANTS=(prefetch paper control)
INST=(--head-sizes 128,256 --block-sizes 16 --kv-dtypes fp16,bf16)
if [ "${HEADLINE_ONLY:-0}" = 1 ]; then
  V=(--tree baseline --tree patched --tree control)
  FETCH=(--extra-tree control)
  VARIANTS=(prefetch control)
  INST=(--head-sizes 128 --block-sizes 16 --kv-dtypes fp16)
fi
alt_trees

step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz "${FETCH[@]}" || exit 3
for v in "${VARIANTS[@]}"; do
  step 30 "${K[@]}" apply --workdir "$W" --variant "$v" || exit 4
done
for t in nopdl nostage nofuse nosplit; do
  [ -d "$W/trees/$t" ] && { step 30 "${K[@]}" apply --workdir "$W" --variant prefetch --tree "$t" || exit 4; }
done
step 200 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 "${INST[@]}" \
  "${ALT_DEF[@]}" || exit 5
if [ "${HEADLINE_ONLY:-0}" != 1 ]; then
  step 120 "${K[@]}" verify-kernel --workdir "$W"
  res_usage
  cp "$W/verify/report.json" "$R/verify.json" 2>/dev/null
  step 150 python3 -m pytest -m gpu -p no:cacheprovider -q -rs tests/gpu
fi
[ "$(left)" -gt 60 ] && bench $(( $(left) - 5 )) "${B[@]}" --mode cold --matrix default \
  "${V[@]}" --time-limit $(( $(left) - 40 )) --name default-matrix --formats json,md,png
[ "${HEADLINE_ONLY:-0}" = 1 ] && { summarize; exit; }
G=(--preset gemma-2b --batch 1,8,64 --context 512,4k,16k "${V[@]}" --formats json,md)
[ "$(left)" -gt 35 ] && bench 45 "${B[@]}" --mode cold --dtype bfloat16 "${G[@]}" \
  --name gemma-2b-bf16
[ "$(left)" -gt 35 ] && bench 45 "${B[@]}" --mode cold "${G[@]}" --name gemma-2b-fp16
summarize
