#!/usr/bin/env bash
# Exploration, ONE device call (about 7 minutes): which __launch_bounds__ minBlocks for the v1
# kernels, per head size and cache dtype? Exploration run 11 (launch-bounds.sh, head 128 fp16
# only) measured N=4 on every v1 kernel at 1.10-1.11x over stock on the issue's b32/b64 v1
# shapes, 1.24x b8 x 512, 1.54x b1 x 512 (with the launcher's prefetch), but 1.01-1.02x at
# b128 where N=5 gave 1.045x; and the v2 kernels better without bounds (the prologue's schedule).
# Local SASS (nvcc 13.0): head 64 -> all 8 K loads before the first FMA from N=3 to 5 (88
# registers, stock 55, 2 of 8); head 256 -> 16 of 32 at N=3 (160 registers), 5 at N=4 and 5
# (N=5 spills); fp8 caches already issue all 8 (N=4: 94 registers instead of 121).
# Trees (head 64/128/256, block 16, fp16/bf16/fp8 caches): baseline; control (A/A);
# cur (the `prefetch` patch, no bounds: the variant as shipped before); n3, n4, n5, n6
# (KVPREFETCH_V1_MIN_BLOCKS=N on every v1 kernel; v2 as shipped).
# Timed, cold, batch 1..128 x context 512..4k (v1 where vLLM picks it): Llama-3.1-8B fp16, bf16,
# fp8 cache, Llama-2-7B (MHA), TinyLlama (head 64), Gemma-2B (head 256).
#   device tool: run(command="bash scripts/device/v1-bounds.sh", carry=[".carry"], timeout_s=560)
set -uo pipefail
BUDGET_S=${BUDGET_S:-530}
source "$(dirname "$0")/lib.sh"
begin_run v1-bounds
V=(--variant baseline --variant cur --variant n3 --variant n4 --variant n5 --variant n6
   --variant control)
step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz --extra-tree control \
  --extra-tree cur --extra-tree n3 --extra-tree n4 --extra-tree n5 --extra-tree n6 || exit 3
for t in cur n3 n4 n5 n6; do
  step 30 "${K[@]}" apply --workdir "$W" --variant prefetch --tree "$t" || exit 4
done
step 30 "${K[@]}" apply --workdir "$W" --variant control || exit 4
step 260 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes 64,128,256 \
  --block-sizes 16 --kv-dtypes fp16,bf16,fp8 --trees baseline,control,cur,n3,n4,n5,n6 \
  --tree-define cur:KVPREFETCH_V1_MIN_BLOCKS=0 --tree-define n3:KVPREFETCH_V1_MIN_BLOCKS=3 \
  --tree-define n4:KVPREFETCH_V1_MIN_BLOCKS=4 --tree-define n5:KVPREFETCH_V1_MIN_BLOCKS=5 \
  --tree-define n6:KVPREFETCH_V1_MIN_BLOCKS=6 || exit 5
S=(--batch 1,8,32,64,128 --context 512,1k,4k "${V[@]}" --formats json,md)
[ "$(left)" -gt 50 ] && bench 60 "${B[@]}" --mode cold --batch 1,8,16,32,64,128 \
  --context 512,1k,2k,4k "${V[@]}" --name fp16 --formats json,md
for p in tinyllama-1.1b gemma-2b llama-2-7b; do
  [ "$(left)" -gt 45 ] && bench 50 "${B[@]}" --mode cold --preset "$p" "${S[@]}" --name "$p"
done
[ "$(left)" -gt 45 ] && bench 50 "${B[@]}" --mode cold --dtype bfloat16 "${S[@]}" --name bf16
[ "$(left)" -gt 45 ] && bench 50 "${B[@]}" --mode cold --kv-cache-dtype fp8 "${S[@]}" --name fp8
summarize
