#!/usr/bin/env bash
# The launcher's prefetch kernel beside TinyLlama's head-64 v2 kernel (no twin: vLLM's kernel
# runs), in ONE device call (about 5 minutes). Repeat runs 14-55 measured fp16 b1 x 16k (1024
# stock CTAs, 7.8 per SM) at 0.991-0.997 in seven of eight runs, bf16 there at 1.16x. Three
# runs, each its own process, of TinyLlama fp16 batch 1/2/4 x context 2k..16k (2-67 MB steps,
# 128-2048 stock CTAs), one of the same in bf16, with stock, `prefetch`, `launch` and the A/A
# `control`, combined by `report --repeats`. Exploration run 57 ran it with a `nolimit` tree
# beside a rule tried and not kept (its script-as-run.sh; the code at e1d0b17); run 13 ran an
# earlier form (`git show 5cd1685:scripts/device/tinyllama-edge.sh`).
#   device tool: run(command="bash scripts/device/tinyllama-edge.sh", carry=[".carry"], timeout_s=420)
set -uo pipefail
BUDGET_S=${BUDGET_S:-400}
source "$(dirname "$0")/lib.sh"
begin_run tinyllama-edge
V=(--variant baseline --variant patched --variant launch --variant control)
step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz --extra-tree launch \
  --extra-tree control || exit 3
for v in prefetch launch control; do
  step 30 "${K[@]}" apply --workdir "$W" --variant "$v" || exit 4
done
step 200 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes 64 \
  --block-sizes 16 --kv-dtypes fp16,bf16 --trees baseline,patched,launch,control || exit 5
S=(--preset tinyllama-1.1b --batch 1,2,4 --context 2k,4k,6k,8k,12k,16k "${V[@]}")
for i in 1 2 3; do
  [ "$(left)" -gt 60 ] && bench 70 "${B[@]}" --mode cold "${S[@]}" --name "edge-$i" \
    --formats json,md
done
[ "$(left)" -gt 60 ] && bench 70 "${B[@]}" --mode cold --dtype bfloat16 "${S[@]}" \
  --name edge-bf16 --formats json,md
[ -f "$R/edge-1.json" ] && step 20 "${K[@]}" report --repeats repeats --out "$R" "$R"/edge-[123].json
summarize
