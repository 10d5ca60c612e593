#!/usr/bin/env bash
# The L2-resident bound over issue 6's whole matrix, in ONE device call (about 5 minutes): how
# much faster each shape runs when every KV load is an L2 hit, i.e. the most ANY L2 prefetch of
# this kernel could give, at every batch and context (not only where one layer fits the L2).
#   device tool: run(command="bash scripts/device/l2-bound.sh", carry=[".carry"], timeout_s=590)
# Steps: fetch the carried sdist into baseline, patched and control -> apply -> kernels-only
# build (head 128, block 16, fp16: the issue's shape) -> verify-kernel -> `bench kernel`:
#  1. the issue's matrix (batch 1,8,32,64,128 x context 512..16k), cold and aliased (block tables
#     into a pool of a quarter of the L2: the same instruction stream, every KV load an L2 hit);
#  2. the small shapes (batch 1..16 x context 512..4k), cold, hot and aliased: where one layer
#     fits the L2 both resident modes apply, so hot checks the aliased proxy.
# The report's "L2-resident bound" section has the per-shape bound and its geometric mean.
# Everything lands in $OUT/results.tgz.
set -uo pipefail
BUDGET_S=${BUDGET_S:-570}
source "$(dirname "$0")/lib.sh"
begin_run l2-bound
V=(--variant baseline --variant patched --variant control)

step 120 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz --extra-tree control || exit 3
step 30 "${K[@]}" apply --workdir "$W" --variant prefetch || exit 4
step 30 "${K[@]}" apply --workdir "$W" --variant control || exit 4
step 30 "${K[@]}" diff-upstream --workdir "$W" --check --stat || exit 4
step 240 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 \
  --head-sizes 128 --block-sizes 16 --kv-dtypes fp16 || exit 5
step 120 "${K[@]}" verify-kernel --workdir "$W"
cp "$W/verify/report.json" "$R/verify.json" 2>/dev/null
[ "$(left)" -gt 120 ] && bench 200 "${B[@]}" --mode cold --mode aliased \
  --batch 1,8,32,64,128 --context 512,1k,4k,16k "${V[@]}" --name matrix-aliased --formats json,md
[ "$(left)" -gt 60 ] && bench 120 "${B[@]}" --mode cold --mode hot --mode aliased \
  --batch 1,2,4,8,16 --context 512,1k,2k,4k "${V[@]}" --name small-hot-aliased --formats json,md
summarize
grep -A12 "^Geometric mean of the bound" "$R"/*.md | cut -c1-200
