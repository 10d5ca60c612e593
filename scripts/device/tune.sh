#!/usr/bin/env bash
# Historical: made docs/results/2026-11-29-h200-tune-1 with the in-loop design (commit in that
# README). Its KVPREFETCH_DISTANCE knob no longer exists; to reproduce, check out that commit.
# Issue-6 tuning experiment on the H200: stock vs several prefetch configurations, all built
# from the same pinned sources (kernels-only, Llama-3.1-8B shape: head 128, block 16, fp16)
# and timed in ONE process by `bench kernel` (cold L2), outputs checked bitwise in the same run.
#   usage: OUT=... bash scripts/device/tune.sh
set -uo pipefail
: "${OUT:?set OUT}"
W=${KVPREFETCH_WORKDIR:-/tmp/kvt}
R=$OUT/results; mkdir -p "$R"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 KVPREFETCH_WORKDIR="$W" NO_COLOR=1
K=(python3 -m kvprefetch)
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$R/tune.log"; }
step() { local limit=$1; shift; log "+ $*"; timeout "$limit" "$@" 2>&1 | tee -a "$R/tune.log";
         log "exit ${PIPESTATUS[0]}"; }
# Trees: patched = the default (auto gate, distance 1); exp_on = always on, distance 1;
# exp_d2 / exp_d4 = always on, distance 2 / 4; seed = the paper's mechanism.
step 120 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz --with-seed \
  --extra-tree exp_on --extra-tree exp_d2 --extra-tree exp_d4
for t in patched exp_on exp_d2 exp_d4; do step 60 "${K[@]}" apply --workdir "$W" --tree $t; done
step 60 "${K[@]}" apply --workdir "$W" --variant seed
step 400 "${K[@]}" build --workdir "$W" --kernels-only --skip-doctor --jobs 16 \
  --head-sizes 128 --block-sizes 16 --kv-dtypes fp16,bf16 \
  --tree-define exp_on:KVPREFETCH_DEFAULT_MODE=1 \
  --tree-define exp_d2:KVPREFETCH_DEFAULT_MODE=1 --tree-define exp_d2:KVPREFETCH_DISTANCE=2 \
  --tree-define exp_d4:KVPREFETCH_DEFAULT_MODE=1 --tree-define exp_d4:KVPREFETCH_DISTANCE=4
step 200 "${K[@]}" verify-kernel --workdir "$W"
cp "$W/verify/report.json" "$R/verify.json"
step 200 python3 -m kvprefetch.cli.bench kernel --workdir "$W" --mode cold \
  --batch 1,8,32,64 --context 512,1k,4k,16k --out "$R" --name tune-a --formats json,md
step 120 python3 -m kvprefetch.cli.bench kernel --workdir "$W" --mode cold \
  --batch 128 --context 512,1k,4k --out "$R" --name tune-b --formats json,md
# The runtime switch: same patched build, KVPREFETCH=off must behave like stock.
step 60 env KVPREFETCH=off python3 -m kvprefetch.cli.bench kernel --workdir "$W" --mode cold \
  --batch 1,8 --context 512 --variant baseline --variant patched --out "$R" --name switch-off --formats json
log "done"
tar -C "$OUT" -czf "$OUT/results.tgz" results && rm -rf "$R"
