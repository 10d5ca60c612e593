#!/usr/bin/env bash
# Issue 6 on the H200, in ONE device call: stock vs the in-kernel prologue prefetch (auto gate;
# always on; auto with the prologue as a real call) vs the launch variant vs the paper's seed, built here kernels-only from the carried sdist, verified, then timed by `bench kernel`
# in one process (cold, the default matrix) twice, plus KVPREFETCH=off on four shapes.
#   device tool: run(command="bash scripts/device/prefetch-ab.sh", carry=[".carry"], timeout_s=590)
#   Optional: SEL="--head-sizes 128 --block-sizes 16 --kv-dtypes fp16" (the default, narrow),
#             EXTRA_BENCH="..." more `bench kernel` arguments for a third, wider pass.
# Everything lands in $OUT/results.tgz (logs, verify report, bench JSON/MD/PNG).
set -uo pipefail
OUT=${OUT:-/tmp/prefetch-ab-out}
W=${KVPREFETCH_WORKDIR:-/tmp/kvf-ab}
R=$OUT/results; mkdir -p "$R"
SEL=${SEL:---head-sizes 128 --block-sizes 16 --kv-dtypes fp16}
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 NO_COLOR=1 \
  KVPREFETCH_WORKDIR="$W"
K=(python3 -m kvprefetch)
B=(python3 -m kvprefetch.commands.bench)
log() { echo "== $(date -u +%H:%M:%S) +${SECONDS}s $*" | tee -a "$R/run.log"; }
step() { local limit=$1; shift; log "+ $*"; timeout "$limit" "$@" 2>&1 | tee -a "$R/run.log";
         local rc=${PIPESTATUS[0]}; log "exit $rc"; return "$rc"; }
finish() { log "done"; tar -C "$OUT" -czf "$OUT/results.tgz" results && rm -rf "$R"; }
trap finish EXIT
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
  git rev-parse HEAD 2>/dev/null; git status --short 2>/dev/null | head -20
} > "$R/env.txt" 2>&1
cat "$R/env.txt" | tee -a "$R/run.log"
[ -f .carry/vllm-0.10.2.tar.gz ] || { log "missing .carry/vllm-0.10.2.tar.gz (carry it)"; exit 2; }

step 120 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz --with-seed \
  --extra-tree launch --extra-tree pro_on --extra-tree pro_call || exit 3
for t in patched pro_on pro_call; do
  step 30 "${K[@]}" apply --workdir "$W" --variant prefetch --tree "$t" || exit 4
done
step 30 "${K[@]}" apply --workdir "$W" --variant launch --tree launch || exit 4
step 30 "${K[@]}" apply --workdir "$W" --variant seed || exit 4
step 30 "${K[@]}" diff-upstream --workdir "$W" --check --stat || exit 4
# shellcheck disable=SC2086
step 300 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 $SEL \
  --tree-define pro_on:KVPREFETCH_DEFAULT_MODE=1 \
  --tree-define pro_call:KVPREFETCH_PROLOGUE_NOINLINE=1 || exit 5
step 200 "${K[@]}" verify-kernel --workdir "$W"
cp "$W/verify/report.json" "$R/verify.json" 2>/dev/null
step 120 "${B[@]}" kernel --workdir "$W" --mode cold --matrix default --out "$R" \
  --name kernel-cold --formats json,md,png
step 120 "${B[@]}" kernel --workdir "$W" --mode cold --matrix default --out "$R" \
  --name kernel-cold-2 --formats json,md
step 60 env KVPREFETCH=off "${B[@]}" kernel --workdir "$W" --mode cold --batch 1,8 \
  --context 512,4k,16k --variant baseline --variant patched --variant pro_call \
  --out "$R" --name switch-off --formats json,md
if [ -n "${EXTRA_BENCH:-}" ]; then
  # shellcheck disable=SC2086
  step 150 "${B[@]}" kernel --workdir "$W" --mode cold $EXTRA_BENCH --out "$R" \
    --name kernel-extra --formats json,md
fi
grep -A12 "^## Summary" "$R/kernel-cold.md" "$R/kernel-cold-2.md" 2>/dev/null | cut -c1-220
