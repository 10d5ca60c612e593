#!/usr/bin/env bash
# Issue 40: whole decode steps in vLLM's own call, ONE device call (about 9 minutes). `bench
# decode` replays each batch bucket's CUDA graph as vLLM 0.10.2 V0 captures it (max_seq_len =
# max_seq_len_to_capture = 8192, the batch padded to its bucket with length-1 rows) and runs the
# steps vLLM runs eagerly (a sequence past 8192) eagerly, for Llama-3.1-8B, Qwen2.5-7B and
# Llama-3-70B at tensor-parallel 8 (8 of its layers): every bucket up to 64 and one batch
# between each pair of them, then 72, 80, 96, 128, 192 and 256, at contexts 1000, 3300, 8000
# and 32000 (points whose K/V does not fit are recorded as skipped). Trees, kernels-only (head
# 128, block 16, fp16): baseline (stock vLLM 0.10.2), patched (the `prefetch` patch as shipped),
# control (stock rebuilt through the same pipeline: the A/A band). Every step's logits are
# checked bitwise against baseline's.
#   device tool: run(command="bash scripts/device/vllm-call.sh", carry=[".carry"], timeout_s=595)
# Environment: STEPS (12), REPEATS (3), and RUNS: the bench decode invocations, one per word,
# each MODEL:CONTEXTS:BATCHES (contexts and batches comma-separated; default: the grid above,
# one invocation per model and pair of contexts, so that a cut leaves the others' results).
# Results: decode-<model>-<contexts>.json/.md/.png, run.log, env.txt; commit them under
# docs/results/<date>-h200-vllm-call/.
set -uo pipefail
BUDGET_S=${BUDGET_S:-570}
source "$(dirname "$0")/lib.sh"
begin_run vllm-call
V=(--tree baseline --tree patched --tree control)
GRID=1,2,3,4,6,8,12,16,20,24,28,32,36,40,44,48,52,56,60,64,72,80,96,128,192,256
DEFAULT_RUNS=""
for ctx in 1000,3300 8000,32000; do
  for p in llama-3.1-8b qwen2.5-7b llama-3-70b-tp8; do DEFAULT_RUNS+=" $p:$ctx:$GRID"; done
done
step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz --extra-tree control \
  || exit 3
step 30 "${K[@]}" apply --workdir "$W" --variant prefetch || exit 4
step 30 "${K[@]}" apply --workdir "$W" --variant control || exit 4
step 200 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes 128 \
  --block-sizes 16 --kv-dtypes fp16 --trees baseline,patched,control || exit 5
res_usage
D=(python3 -m kvprefetch bench decode --workdir "$W" --out "$R" "${V[@]}"
   --steps "${STEPS:-12}" --repeats "${REPEATS:-3}" --formats json,md)
for run in ${RUNS:-$DEFAULT_RUNS}; do
  IFS=: read -r p ctx batches <<< "$run"
  [ "$(left)" -gt 40 ] || { log "out of time before $p $ctx"; continue; }
  bench $(( $(left) - 15 )) "${D[@]}" --preset "$p" --context "$ctx" --batch "$batches" \
    --name "decode-$p-${ctx//,/-}"
done
grep -h -A8 "^## Summary" "$R"/decode-*.md 2>/dev/null | tee -a "$LOG"
