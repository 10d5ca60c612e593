#!/usr/bin/env bash
# Issue 6's evidence beyond one run, in ONE device call (about 9 minutes): is `prefetch` slower
# than stock anywhere over REPEATED runs (against an A/A control), does it hold in the other
# presets and cache dtypes, what is the most an L2 prefetch could give at the shapes whose KV
# fits the L2, and do the GPU-marked tests pass on the real builds.
#   device tool: run(command="bash scripts/device/prefetch-repeat.sh", carry=[".carry"], timeout_s=590)
# NOPDL=1, NOSTAGE=1, NOFUSE=1 and NOSPLIT=1 add the designs before programmatic dependent
# launch, before the twins' shared-memory ring, before v2's reduction in the twin and before
# the ring's split first requests, each as one more tree (lib.sh's alt_trees).
# QUICK=1 (about 4 minutes): stock, prefetch, launch and the control only, one run of each
# table (REPEATS=N: N runs of the matrix), no L2-resident bound.
# Steps: fetch the carried sdist into baseline, patched, gqa_off (the same patch with the
# GQA-grouped twin never launched: KVPREFETCH_GQA_DEFAULT_MODE=0), launch, seed and control -> apply -> diff-upstream --check -> kernels-only build (head 64/128/256,
# block 16, fp16/bf16/fp8 caches) -> verify-kernel -> pytest -m gpu -> `bench kernel` on the
# issue's matrix REPEATS times, each run its own process -> the other presets (MHA, d=64,
# d=256), bf16 and fp8 caches, bf16 for d=64/d=256, once each -> cold and hot in one process on the small shapes (hot: one layer replayed, so its KV stays in the L2 where it fits; the report's
# "L2-resident bound"). The `control` tree is stock rebuilt (an A/A reference in every run).
# Combine locally: kvprefetch report --repeats repeats <the repeat JSONs>.
# Everything lands in $OUT/results.tgz.
set -uo pipefail
BUDGET_S=${BUDGET_S:-570}
QUICK=${QUICK:-0}
if [ "$QUICK" = 1 ]; then REPEATS=${REPEATS:-1}; else REPEATS=${REPEATS:-3}; fi
source "$(dirname "$0")/lib.sh"
begin_run prefetch-repeat
V=(--variant baseline --variant patched --variant gqa_off --variant launch --variant seed
   --variant control)
FETCH=(--with-seed --extra-tree gqa_off --extra-tree launch --extra-tree control)
APPLY=(launch seed control)
if [ "$QUICK" = 1 ]; then
  V=(--variant baseline --variant patched --variant launch --variant control)
  FETCH=(--extra-tree launch --extra-tree control); APPLY=(launch control)
fi
alt_trees  # NOPDL=1, NOSTAGE=1, NOFUSE=1 (lib.sh)

step 120 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz "${FETCH[@]}" || exit 3
for t in patched gqa_off nopdl nostage nofuse nosplit; do
  [ -d "$W/trees/$t" ] && { step 30 "${K[@]}" apply --workdir "$W" --variant prefetch --tree "$t" || exit 4; }
done
for v in "${APPLY[@]}"; do
  step 30 "${K[@]}" apply --workdir "$W" --variant "$v" || exit 4
done
step 30 "${K[@]}" diff-upstream --workdir "$W" --check --stat || exit 4
step 300 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 \
  --head-sizes 64,128,256 --block-sizes 16 --kv-dtypes fp16,bf16,fp8 \
  $([ -d "$W/trees/gqa_off" ] && echo --tree-define gqa_off:KVPREFETCH_GQA_DEFAULT_MODE=0) \
  "${ALT_DEF[@]}" || exit 5
step 200 "${K[@]}" verify-kernel --workdir "$W"
res_usage
cp "$W/verify/report.json" "$R/verify.json" 2>/dev/null
step 150 python3 -m pytest -m gpu -p no:cacheprovider -q -rs tests/gpu
for i in $(seq 1 "$REPEATS"); do
  [ "$(left)" -gt 60 ] && bench 90 "${B[@]}" --mode cold --batch 1,8,32,64,128 \
    --context 512,1k,4k,16k "${V[@]}" \
    --name "repeat-$i" --formats "json,md$([ "$i" = 1 ] && echo ,png)"
done
S=(--batch 1,8,64 --context 512,4k,16k "${V[@]}")
for p in llama-2-7b tinyllama-1.1b gemma-2b; do
  [ "$(left)" -gt 80 ] && bench 60 "${B[@]}" --mode cold --preset "$p" "${S[@]}" \
    --name "preset-$p" --formats json,md
done
[ "$(left)" -gt 70 ] && bench 50 "${B[@]}" --mode cold --dtype bfloat16 "${S[@]}" \
  --name dtype-bf16 --formats json,md
[ "$(left)" -gt 70 ] && bench 50 "${B[@]}" --mode cold --kv-cache-dtype fp8 "${S[@]}" \
  --name kv-fp8 --formats json,md
# bf16 for the presets whose v1 kernels carry a launch bound measured in fp16 only (head 64, 256)
for p in tinyllama-1.1b gemma-2b; do
  [ "$(left)" -gt 110 ] && bench 50 "${B[@]}" --mode cold --preset "$p" --dtype bfloat16 "${S[@]}" \
    --name "preset-$p-bf16" --formats json,md
done
[ "$QUICK" = 1 ] || { [ "$(left)" -gt 60 ] && bench 100 "${B[@]}" --mode cold --mode hot --batch 1,2,4,8,16 \
  --context 512,1k,2k,4k "${V[@]}" --name l2-bound --formats json,md; }
summarize
