#!/usr/bin/env bash
# Exploration, ONE device call (about 8 minutes): the launcher's L2 prefetch kernel spread over
# runs of blocks (KVPREFETCH_L2_BLOCKS_PER_CTA), and the `prefetch` variant's v2 launcher
# firing it for the v2 kernels without the prologue (fp8 caches, head 64:
# KVPREFETCH_V2_L2_KERNEL). Before, one CTA per (kv head, sequence) issued every request of its
# sequence: with one kv head and 16k tokens (Gemma-2B b1 x 16k) `launch` ran 0.51x stock.
# Trees (head 64/128/256, block 16, fp16 and fp8 caches):
#   baseline, control (A/A), patched (new defaults: runs of 16 blocks, v2 launcher on),
#   pf_old    (-DKVPREFETCH_L2_BLOCKS_PER_CTA=0 -DKVPREFETCH_V2_L2_KERNEL=0: the tree before),
#   pf_b4, pf_b64 (runs of 4 and 64 blocks),
#   launch (runs of 16), launch_old (-DKVPREFETCH_L2_BLOCKS_PER_CTA=0: the tree before).
# Timed, cold: the issue's matrix; batch 1..16 x context 512..4k; Gemma-2B, TinyLlama and the
# fp8 cache at batch 1/8/64 x 512/4k/16k.
#   device tool: run(command="bash scripts/device/l2-kernel-split.sh", carry=[".carry"], timeout_s=590)
set -uo pipefail
BUDGET_S=${BUDGET_S:-560}
source "$(dirname "$0")/lib.sh"
begin_run l2-kernel-split
V=(--variant baseline --variant patched --variant control --variant pf_old --variant pf_b4
   --variant pf_b64 --variant launch --variant launch_old)

step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz --extra-tree control \
  --extra-tree pf_old --extra-tree pf_b4 --extra-tree pf_b64 --extra-tree launch \
  --extra-tree launch_old || exit 3
for t in patched pf_old pf_b4 pf_b64; do
  step 30 "${K[@]}" apply --workdir "$W" --variant prefetch --tree "$t" || exit 4
done
for t in launch launch_old; do
  step 30 "${K[@]}" apply --workdir "$W" --variant launch --tree "$t" || exit 4
done
step 30 "${K[@]}" apply --workdir "$W" --variant control || exit 4
step 240 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes 64,128,256 \
  --block-sizes 16 --kv-dtypes fp16,fp8 \
  --tree-define pf_old:KVPREFETCH_L2_BLOCKS_PER_CTA=0 --tree-define pf_old:KVPREFETCH_V2_L2_KERNEL=0 \
  --tree-define pf_b4:KVPREFETCH_L2_BLOCKS_PER_CTA=4 \
  --tree-define pf_b64:KVPREFETCH_L2_BLOCKS_PER_CTA=64 \
  --tree-define launch_old:KVPREFETCH_L2_BLOCKS_PER_CTA=0 || exit 5
step 90 "${K[@]}" verify-kernel --workdir "$W"
cp "$W/verify/report.json" "$R/verify.json" 2>/dev/null
[ "$(left)" -gt 90 ] && bench 100 "${B[@]}" --mode cold --batch 1,8,32,64,128 \
  --context 512,1k,4k,16k "${V[@]}" --name matrix --formats json,md
S=(--batch 1,8,64 --context 512,4k,16k "${V[@]}")
for p in gemma-2b tinyllama-1.1b; do
  [ "$(left)" -gt 60 ] && bench 60 "${B[@]}" --mode cold --preset "$p" "${S[@]}" \
    --name "preset-$p" --formats json,md
done
[ "$(left)" -gt 60 ] && bench 60 "${B[@]}" --mode cold --kv-cache-dtype fp8 "${S[@]}" \
  --name kv-fp8 --formats json,md
[ "$(left)" -gt 60 ] && bench 90 "${B[@]}" --mode cold --batch 1,2,4,8,16 \
  --context 512,1k,2k,4k "${V[@]}" --name small --formats json,md
summarize
