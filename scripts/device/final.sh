#!/usr/bin/env bash
# Historical: made docs/results/2026-11-29-h200-final with the in-loop design (commit 1386bd7).
# The current design is measured by scripts/device/prefetch-ab.sh.
# The committed H200 run for issues 5 and 6: stock, the paper's variant (`paper`), kvprefetch's
# in-kernel prefetch and its launcher-side `launch` prefetch (auto and forced on), all built on
# the H200 from the pinned sdist (kernels-only), verified (provenance, SASS, bitwise identity),
# then timed in ONE process by `bench kernel` (cold and hot), plus `bench ncu` on one shape.
#   usage: OUT=... bash scripts/device/final.sh
set -uo pipefail
: "${OUT:?set OUT}"
W=${KVPREFETCH_WORKDIR:-/tmp/kvf}
R=$OUT/results; mkdir -p "$R"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 KVPREFETCH_WORKDIR="$W" NO_COLOR=1
K=(python3 -m kvprefetch)
B=(python3 -m kvprefetch.cli.bench)
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$R/final.log"; }
step() { local limit=$1; shift; log "+ $*"; timeout "$limit" "$@" 2>&1 | tee -a "$R/final.log";
         log "exit ${PIPESTATUS[0]}"; }
log "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader)"
step 120 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz --with-paper \
  --extra-tree launch --extra-tree launch_on --extra-tree inkernel_on
step 30 "${K[@]}" apply --workdir "$W" --variant prefetch
step 30 "${K[@]}" apply --workdir "$W" --variant prefetch --tree inkernel_on
step 30 "${K[@]}" apply --workdir "$W" --variant launch
step 30 "${K[@]}" apply --workdir "$W" --variant launch --tree launch_on
step 30 "${K[@]}" apply --workdir "$W" --variant paper
step 30 "${K[@]}" diff-upstream --workdir "$W" --tree launch --check --stat
step 420 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 \
  --head-sizes 64,128,256 --block-sizes 16,32 --kv-dtypes fp16,bf16,fp8 \
  --tree-define inkernel_on:KVPREFETCH_DEFAULT_MODE=1 --tree-define launch_on:KVPREFETCH_DEFAULT_MODE=1
step 240 "${K[@]}" verify-kernel --workdir "$W"
cp "$W/verify/report.json" "$R/verify.json"
step 120 "${B[@]}" kernel --workdir "$W" --mode cold --matrix default --out "$R" --name kernel-cold --formats json,md,png
step 60 "${B[@]}" kernel --workdir "$W" --mode hot --batch 1,8,32 --context 1k,16k --out "$R" --name kernel-hot --formats json,md
step 40 env KVPREFETCH=off "${B[@]}" kernel --workdir "$W" --mode cold --batch 1,8 --context 512,4k \
  --tree baseline --tree patched --tree launch --out "$R" --name switch-off --formats json
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
[ -n "$NCU" ] && step 200 "${B[@]}" ncu --workdir "$W" --ncu "$NCU" --shape 1x4k \
  --tree baseline --tree patched --tree launch --out "$R" --name ncu --formats json,md
log "done"
tar -C "$OUT" -czf "$OUT/results.tgz" results && rm -rf "$R"
