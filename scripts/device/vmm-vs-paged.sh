#!/usr/bin/env bash
# Issue 7's joint decode comparison on the H200, in ONE device call (at most 8 minutes):
# vLLM's paged kernel (stock and patched, built here, kernels-only) against torch SDPA over the
# virtually contiguous (VMM) cache and over cudaMalloc, on the same shapes, in one process.
#
#   device tool, from the repository root, carrying the sdist (.carry/ is git-ignored):
#     run(command="bash scripts/device/vmm-vs-paged.sh", carry=[".carry"], timeout_s=500)
#   .carry/vllm-0.10.2.tar.gz must exist here first (the pinned sdist, sha256 57608f44...).
#
# Steps: fetch (the carried sdist) -> apply (kvprefetch's prefetch patch on the patched tree) ->
# build --kernels-only for head size 128, block 16, fp16 only (the vmm bench's shape) ->
# kvprefetch vmm bench --skip-steps --paged-workdir (default shapes: batch 1..128 x ctx 512..16k).
# Writes under $OUT: env.txt, vmm-vs-paged.log (everything printed), vmm-vs-paged.json (the
# report, checkpointed after every shape, so a timeout keeps what was measured).
# Code runs from the tree (PYTHONPATH=src); nothing is installed.
set -uo pipefail
OUT=${OUT:-/tmp/vmm-vs-paged-out}
W=${KVPREFETCH_WORKDIR:-/tmp/kvf-vmm}
BUDGET_S=${BUDGET_S:-470}            # the whole script; the bench gets what the build left
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 NO_COLOR=1 \
  KVPREFETCH_WORKDIR="$W"
LOG=$OUT/vmm-vs-paged.log
K=(python3 -m kvprefetch)
log() { echo "== $(date -u +%H:%M:%S) +${SECONDS}s $*" | tee -a "$LOG"; }
step() { local limit=$1; shift; log "+ $*"; timeout "$limit" "$@" 2>&1 | tee -a "$LOG";
         local rc=${PIPESTATUS[0]}; log "exit $rc"; return "$rc"; }
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem \
    --format=csv
  python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
  python3 -c 'import cuda.bindings as cb; print("cuda-bindings", cb.__version__)'
  git rev-parse HEAD 2>/dev/null || true
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt" | tee -a "$LOG"
[ -f .carry/vllm-0.10.2.tar.gz ] || { log "missing .carry/vllm-0.10.2.tar.gz (carry it)"; exit 2; }

step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz || exit 3
step 30 "${K[@]}" apply --workdir "$W" --variant prefetch || exit 4
step 240 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 \
  --head-sizes 128 --block-sizes 16 --kv-dtypes fp16 || exit 5
LEFT=$((BUDGET_S - SECONDS - 5))
[ "$LEFT" -gt 60 ] || { log "only ${LEFT}s left for the bench: not starting it"; exit 6; }
step "$LEFT" "${K[@]}" vmm bench --skip-steps --paged-workdir "$W" \
  --out "$OUT/vmm-vs-paged.json"
rc=$?
ls -la "$OUT" | tee -a "$LOG"
# The end of the output is what the device tool returns: the summary tables.
python3 -c 'import json, sys; from kvprefetch.vmm.bench import render_summary; print(render_summary(json.load(open(sys.argv[1]))))' \
  "$OUT/vmm-vs-paged.json" 2>&1 | tail -40
exit "$rc"
