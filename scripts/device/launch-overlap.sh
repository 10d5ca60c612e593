#!/usr/bin/env bash
# Exploration, ONE device call (about 5 minutes): does the v1 launcher's L2 prefetch gain when
# it no longer delays the attention kernel? Serially (the launch stream) the prefetch kernel
# costs a launch gap before the attention kernel: in hot mode, where the prefetch has nothing
# to do, b1 x 512 runs 0.81x. KVPREFETCH_LAUNCH_OVERLAP=1 fires it on a side stream forked
# from the launch stream and joined back after the attention launch, so the two overlap.
# Trees (head 128, block 16, fp16):
#   baseline, patched (shipped: serial, steps <= L2/4), control (A/A),
#   ovl     (-DKVPREFETCH_LAUNCH_OVERLAP=1, steps <= L2/4),
#   ovl_l2  (overlap, -DKVPREFETCH_AUTO_L2_DIVISOR=1: steps <= L2),
#   ovl_on  (overlap, -DKVPREFETCH_DEFAULT_MODE=1: every step; this also forces the v2 prologue
#            on, so only its v1 rows say something about the launcher).
# Timed: the issue's matrix cold; batch 1..16 x context 512..4k cold and hot.
#   device tool: run(command="bash scripts/device/launch-overlap.sh", carry=[".carry"], timeout_s=420)
set -uo pipefail
BUDGET_S=${BUDGET_S:-380}
source "$(dirname "$0")/lib.sh"
begin_run launch-overlap
V=(--variant baseline --variant patched --variant control --variant ovl --variant ovl_l2
   --variant ovl_on)

step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz \
  --extra-tree control --extra-tree ovl --extra-tree ovl_l2 --extra-tree ovl_on || exit 3
for t in patched ovl ovl_l2 ovl_on; do
  step 30 "${K[@]}" apply --workdir "$W" --variant prefetch --tree "$t" || exit 4
done
step 30 "${K[@]}" apply --workdir "$W" --variant control || exit 4
step 200 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes 128 \
  --block-sizes 16 --kv-dtypes fp16 \
  --tree-define ovl:KVPREFETCH_LAUNCH_OVERLAP=1 \
  --tree-define ovl_l2:KVPREFETCH_LAUNCH_OVERLAP=1 --tree-define ovl_l2:KVPREFETCH_AUTO_L2_DIVISOR=1 \
  --tree-define ovl_on:KVPREFETCH_LAUNCH_OVERLAP=1 --tree-define ovl_on:KVPREFETCH_DEFAULT_MODE=1 \
  || exit 5
step 90 "${K[@]}" verify-kernel --workdir "$W"
cp "$W/verify/report.json" "$R/verify.json" 2>/dev/null
[ "$(left)" -gt 100 ] && { step 110 "${B[@]}" --mode cold --batch 1,8,32,64,128 \
  --context 512,1k,4k,16k "${V[@]}" --name matrix --formats json,md; pack; }
[ "$(left)" -gt 60 ] && { step 100 "${B[@]}" --mode cold --mode hot --batch 1,2,4,8,16 \
  --context 512,1k,2k,4k "${V[@]}" --name small --formats json,md; pack; }
summarize
