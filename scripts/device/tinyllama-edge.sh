#!/usr/bin/env bash
# Exploration, ONE device call (about 3 minutes): is the launcher's prefetch kernel slower than
# stock beside TinyLlama's head-64 v2 kernel (left stock) on steps just under its L2/2 limit?
# Repeat run 14 measured b1 x 16k (16.8 MB) at 0.995 [0.991-0.999], repeat run 10 at 1.003
# [0.998-1.008] for the same code. Three runs, each its own process, of TinyLlama fp16 batch 1/2
# x context 8k..32k (8.4-67 MB steps), stock, `prefetch`, `launch` and the A/A `control`.
#   device tool: run(command="bash scripts/device/tinyllama-edge.sh", carry=[".carry"], timeout_s=300)
set -uo pipefail
BUDGET_S=${BUDGET_S:-280}
source "$(dirname "$0")/lib.sh"
begin_run tinyllama-edge
V=(--variant baseline --variant patched --variant launch --variant control)
step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz --extra-tree launch \
  --extra-tree control || exit 3
for v in prefetch launch control; do
  step 30 "${K[@]}" apply --workdir "$W" --variant "$v" || exit 4
done
step 150 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes 64 \
  --block-sizes 16 --kv-dtypes fp16 --trees baseline,patched,launch,control || exit 5
for i in 1 2 3; do
  [ "$(left)" -gt 35 ] && bench 40 "${B[@]}" --mode cold --preset tinyllama-1.1b --batch 1,2 \
    --context 8k,16k,24k,32k "${V[@]}" --name "edge-$i" --formats json,md
done
summarize
