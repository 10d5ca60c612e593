#!/usr/bin/env bash
# One H200 call, end to end, from this checkout and the carried sdist (the device has no
# network): fetch -> apply (prefetch and seed) -> kernels-only build of baseline, patched and
# seed against the device's own torch -> verify-kernel with the GPU identity check -> the
# GPU-marked tests -> (optionally) the benchmarks. Results are tarred into $OUT/results.tgz
# (the device returns at most 8 files).
#
#   usage: OUT=... bash scripts/device/h200.sh [build-verify|all]
#   needs: .carry/vllm-0.10.2.tar.gz (cp kvprefetch-work/downloads/vllm-0.10.2.tar.gz .carry/)
set -uo pipefail
: "${OUT:?set OUT}"
WHAT=${1:-all}
W=${KVPREFETCH_WORKDIR:-/tmp/kvw}
R=$OUT/results
mkdir -p "$R"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 KVPREFETCH_WORKDIR="$W" NO_COLOR=1
K=(python3 -m kvprefetch)
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$R/h200.log"; }
step() { local limit=$1; shift; log "+ $*"; timeout "$limit" "$@" 2>&1 | tee -a "$R/h200.log";
         log "exit ${PIPESTATUS[0]}"; }

log "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader)"
log "$(nvcc --version | tail -2 | head -1); $(python3 -c 'import torch; print("torch", torch.__version__)')"
step 120 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz --with-seed
step 60 "${K[@]}" apply --workdir "$W"
step 60 "${K[@]}" apply --workdir "$W" --variant seed
step 60 "${K[@]}" diff-upstream --workdir "$W" --check --stat
step 60 "${K[@]}" doctor --kernels-only
# What verify's GPU check and the bench presets need: d 64/128/256, block 16/32,
# fp16/bf16 and an fp8 (e4m3) cache. 48 kernels per launcher source, 6 sources in parallel.
step 420 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 \
  --head-sizes 64,128,256 --block-sizes 16,32 --kv-dtypes fp16,bf16,fp8
step 300 "${K[@]}" verify-kernel --workdir "$W"
cp "$W/verify/report.json" "$R/verify.json"
step 240 python3 -m pytest -m gpu -p no:cacheprovider -q tests/gpu 2>&1
if [ "$WHAT" = all ] && [ -f scripts/device/bench.sh ]; then
  OUT="$R" step 480 bash scripts/device/bench.sh "$W"
fi
cp "$W"/build/*/*/manifest.json "$R/" 2>/dev/null
for t in baseline patched seed; do cp "$W/build/$t"/*/manifest.json "$R/manifest-$t.json" 2>/dev/null; done
log "done"
tar -C "$OUT" -czf "$OUT/results.tgz" results && rm -rf "$R"
