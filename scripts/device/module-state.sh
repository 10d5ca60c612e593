#!/usr/bin/env bash
# Exploration, ONE device call (about 4 minutes): why do kernels that are instruction-identical
# to stock run ~1% slower when their module also holds the prologue's device state (the
# __constant__ mode and the base table)? Builds baseline, patched (the mode in global memory,
# the default since this experiment), control and mode_const (-DKVPREFETCH_MODE_IN_GLOBAL=0:
# the mode in a __constant__, as before) for head 64/128, block 16, fp16 and fp8 caches, then
# times
# the shapes where the effect showed: TinyLlama (d=64, v2 kernels identical to stock), an fp8
# cache (v2 identical), and Llama-3.1-8B fp16 (the v2 prologue kernels, to see whether moving
# the mode changes their code generation).
#   device tool: run(command="bash scripts/device/module-state.sh", carry=[".carry"], timeout_s=400)
set -uo pipefail
BUDGET_S=${BUDGET_S:-330}
source "$(dirname "$0")/lib.sh"
begin_run module-state
B+=(--mode cold)
V=(--variant baseline --variant patched --variant mode_const --variant control)

step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz \
  --extra-tree mode_const --extra-tree control || exit 3
for t in patched mode_const; do
  step 30 "${K[@]}" apply --workdir "$W" --variant prefetch --tree "$t" || exit 4
done
step 30 "${K[@]}" apply --workdir "$W" --variant control || exit 4
step 200 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes 64,128 \
  --block-sizes 16 --kv-dtypes fp16,fp8 --tree-define mode_const:KVPREFETCH_MODE_IN_GLOBAL=0 \
  || exit 5
S=(--batch 1,8 --context 1k,4k,16k "${V[@]}")
[ "$(left)" -gt 60 ] && step 50 "${B[@]}" --preset tinyllama-1.1b "${S[@]}" --name tinyllama \
  --formats json,md
[ "$(left)" -gt 50 ] && step 50 "${B[@]}" --kv-cache-dtype fp8 "${S[@]}" --name kv-fp8 \
  --formats json,md
[ "$(left)" -gt 40 ] && step 50 "${B[@]}" "${S[@]}" --name llama-fp16 --formats json,md
summarize
