#!/usr/bin/env bash
# Issue 6 on the H200, in ONE device call (about 7 minutes; scripts/device/prefetch-repeat.sh
# supersedes it with repeated runs and an A/A control, this one made the runs under
# docs/results/2026-11-29-h200-prefetch-final and -explore/1-3): stock vs kvprefetch's `prefetch`
# variant (prologue prefetch in the v2 kernels it measured faster in, every other kernel
# stock, launcher-side L2 prefetch before small v1 steps) with its auto rule and compiled off
# (pro_off: what the code change alone does); the `launch` variant; the paper's `seed`. All
# built here kernels-only from the carried sdist, verified, then timed by `bench kernel` in
# one process per table: the default matrix, the other presets (MHA, d=64, d=256), bf16 and
# fp8 KV caches, and KVPREFETCH=off. CALIBRATE=1 adds pro_on/pro_half and the auto-rule grid.
#   device tool: run(command="bash scripts/device/prefetch-ab.sh", carry=[".carry"], timeout_s=590)
# Everything lands in $OUT/results.tgz (logs, env, verify report, bench JSON/MD/PNG).
set -uo pipefail
BUDGET_S=${BUDGET_S:-570}
CAL=${CALIBRATE:-0}
source "$(dirname "$0")/lib.sh"
begin_run prefetch-ab
B+=(--mode cold)

EXTRA=(pro_off); [ "$CAL" = 1 ] && EXTRA+=(pro_on pro_half)
step 120 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz --with-seed \
  --extra-tree launch $(printf -- '--extra-tree %s ' "${EXTRA[@]}") || exit 3
for t in patched "${EXTRA[@]}"; do
  step 30 "${K[@]}" apply --workdir "$W" --variant prefetch --tree "$t" || exit 4
done
step 30 "${K[@]}" apply --workdir "$W" --variant launch --tree launch || exit 4
step 30 "${K[@]}" apply --workdir "$W" --variant seed || exit 4
step 30 "${K[@]}" diff-upstream --workdir "$W" --check --stat || exit 4
DEFS=(--tree-define pro_off:KVPREFETCH_DEFAULT_MODE=0)
[ "$CAL" = 1 ] && DEFS+=(--tree-define pro_on:KVPREFETCH_DEFAULT_MODE=1
                         --tree-define pro_half:KVPREFETCH_AUTO_MAX_CTAS_PCT=50)
step 300 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 \
  --head-sizes 64,128,256 --block-sizes 16 --kv-dtypes fp16,bf16,fp8 "${DEFS[@]}" || exit 5
step 200 "${K[@]}" verify-kernel --workdir "$W"
cp "$W/verify/report.json" "$R/verify.json" 2>/dev/null
step 150 "${B[@]}" --matrix default --name kernel-cold --formats json,md,png
[ "$CAL" = 1 ] && step 60 "${B[@]}" --batch 1,2,4 --context 512,1k,2k,4k --variant baseline \
  --variant patched --variant pro_on --variant pro_off --variant pro_half --name calibrate \
  --formats json,md
S=(--batch 1,8,64 --context 512,4k,16k --variant baseline --variant patched --variant launch --variant seed)
for p in llama-2-7b tinyllama-1.1b gemma-2b; do
  [ "$(left)" -gt 70 ] && step 60 "${B[@]}" --preset "$p" "${S[@]}" --name "preset-$p" --formats json,md
done
[ "$(left)" -gt 60 ] && step 50 "${B[@]}" --dtype bfloat16 "${S[@]}" --name dtype-bf16 --formats json,md
[ "$(left)" -gt 60 ] && step 50 "${B[@]}" --kv-cache-dtype fp8 "${S[@]}" --name kv-fp8 --formats json,md
[ "$(left)" -gt 30 ] && step 30 env KVPREFETCH=off "${B[@]}" --batch 1,8 --context 1k,4k \
  --variant baseline --variant patched --variant pro_off --name switch-off --formats json,md
summarize
