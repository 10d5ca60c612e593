#!/usr/bin/env bash
# Exploration, ONE device call (about 5 minutes): does declaring the attention kernels
# __launch_bounds__(NUM_THREADS, N) make them faster? Local SASS (nvcc 13.0, sm_90, head 128,
# block 16, fp16) shows why it might: stock's K loop issues 7 (v1) or 2 (v2) of its 16 K loads
# before the first FMA that consumes one, so each block costs about two memory round trips;
# the shipped v2 prologue kernels issue all 16 first (the "code generation" gain of
# docs/tuning-log.md finding 1); with N=3 or 4 ptxas issues all 16 in v1 and v2 alike
# (136/124 registers: 3/4 CTAs per SM instead of 5), with N=5 10 of 16 (96 registers).
# Trees (head 128, block 16, fp16 cache), all but baseline/control the shipped `prefetch`
# patch with different -D:
#   baseline; control (A/A: stock rebuilt); patched (shipped then: no bounds);
#   lb4 (N=4 on every v1 and v2 kernel, the prologue still compiled into v2);
#   lb3np, lb4np, lb5np (MIN_BLOCKS=3/4/5, no prologue anywhere: PROLOGUE_MIN_HEAD_SIZE=1024).
# Every variant keeps the launcher's L2 prefetch kernel (auto).
# Timed: the issue's matrix cold, batch 1..16 x context 512..4k cold and hot.
#   device tool: run(command="bash scripts/device/launch-bounds.sh", carry=[".carry"], timeout_s=480)
set -uo pipefail
BUDGET_S=${BUDGET_S:-450}
source "$(dirname "$0")/lib.sh"
begin_run launch-bounds
V=(--variant baseline --variant patched --variant lb4 --variant lb3np --variant lb4np
   --variant lb5np --variant control)
NP=KVPREFETCH_PROLOGUE_MIN_HEAD_SIZE=1024
step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz --extra-tree control \
  --extra-tree lb4 --extra-tree lb3np --extra-tree lb4np --extra-tree lb5np || exit 3
for t in patched lb4 lb3np lb4np lb5np; do
  step 30 "${K[@]}" apply --workdir "$W" --variant prefetch --tree "$t" || exit 4
done
step 30 "${K[@]}" apply --workdir "$W" --variant control || exit 4
# N on every v1 and v2 kernel. (Run 11 itself was measured with the first spelling of this hook,
# -DKVPREFETCH_MIN_BLOCKS=N for both; `patched` then had no bounds: today's is
# KVPREFETCH_V1_MIN_BLOCKS=0.)
lb() { echo --tree-define "$1:KVPREFETCH_V1_MIN_BLOCKS=$2" --tree-define "$1:KVPREFETCH_V2_MIN_BLOCKS=$2"; }
step 240 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes 128 \
  --block-sizes 16 --kv-dtypes fp16 \
  --trees baseline,control,patched,lb4,lb3np,lb4np,lb5np \
  --tree-define patched:KVPREFETCH_V1_MIN_BLOCKS=0 $(lb lb4 4) \
  $(lb lb3np 3) --tree-define lb3np:$NP $(lb lb4np 4) --tree-define lb4np:$NP \
  $(lb lb5np 5) --tree-define lb5np:$NP || exit 5
[ "$(left)" -gt 50 ] && bench 90 "${B[@]}" --mode cold --batch 1,8,32,64,128 \
  --context 512,1k,4k,16k "${V[@]}" --name matrix --formats json,md
[ "$(left)" -gt 50 ] && bench 90 "${B[@]}" --mode cold --mode hot --batch 1,2,4,8,16 \
  --context 512,1k,2k,4k "${V[@]}" --name small --formats json,md
summarize
