#!/usr/bin/env bash
# The launcher's prefetch kernel beside TinyLlama's head-64 v2 kernel (no twin: vLLM's kernel
# runs), in ONE device call (about 6 minutes). Repeat runs 14-55 measured fp16 b1 x 16k (1024
# stock CTAs, 7.8 per SM) at 0.991-0.997 in seven of eight runs, bf16 there at 1.16x. The
# shipped `prefetch` (`patched`) no longer fires it before fp16 v2 grids of 4 or more stock
# CTAs per SM (KVPREFETCH_V2_L2_FP16_MAX_CTAS_PER_SM=4); `nolimit` is the same build with no
# such limit (=0, the design before). Three runs, each its own process, of TinyLlama fp16 batch
# 1/2/4 x context 2k..16k (2-67 MB steps, 128-2048 stock CTAs), one of the same in bf16, with
# stock, `launch` and the A/A `control`; then the GPU test of the rule.
#   device tool: run(command="bash scripts/device/tinyllama-edge.sh", carry=[".carry"], timeout_s=480)
# (exploration run 13 ran this script's earlier form: `git show 5cd1685:scripts/device/tinyllama-edge.sh`)
set -uo pipefail
BUDGET_S=${BUDGET_S:-450}
NOLIMIT=${NOLIMIT:-1}
source "$(dirname "$0")/lib.sh"
begin_run tinyllama-edge
V=(--variant baseline --variant patched --variant launch --variant control)
FETCH=(--extra-tree launch --extra-tree control)
alt_trees
step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz "${FETCH[@]}" || exit 3
for v in prefetch launch control; do
  step 30 "${K[@]}" apply --workdir "$W" --variant "$v" || exit 4
done
[ -d "$W/trees/nolimit" ] && { step 30 "${K[@]}" apply --workdir "$W" --variant prefetch \
  --tree nolimit || exit 4; }
step 200 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes 64 \
  --block-sizes 16 --kv-dtypes fp16,bf16 "${ALT_DEF[@]}" || exit 5
S=(--preset tinyllama-1.1b --batch 1,2,4 --context 2k,4k,6k,8k,12k,16k "${V[@]}")
for i in 1 2 3; do
  [ "$(left)" -gt 60 ] && bench 70 "${B[@]}" --mode cold "${S[@]}" --name "edge-$i" \
    --formats json,md
done
[ "$(left)" -gt 60 ] && bench 70 "${B[@]}" --mode cold --dtype bfloat16 "${S[@]}" \
  --name edge-bf16 --formats json,md
[ "$(left)" -gt 40 ] && step 40 python3 -m pytest -m gpu -p no:cacheprovider -q -rs \
  tests/gpu/test_launcher_prefetch.py -k busy_fp16
[ -f "$R/edge-1.json" ] && step 20 "${K[@]}" report --repeats repeats --out "$R" "$R"/edge-[123].json
summarize
