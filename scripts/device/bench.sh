#!/usr/bin/env bash
# The H200 benchmark run of issue 5, for the device machine, AFTER the kernels-only builds exist
# there (`kvprefetch build --kernels-only` against the device's own torch).
#
#   usage: OUT=/some/dir scripts/device/bench.sh [WORKDIR]      (WORKDIR default: kvprefetch-work)
#
# Writes at most 8 files to $OUT (the device tool's limit), flat:
#   identity.json     numerical identity of every build vs baseline (v1+v2, d64/128/256, ...)
#   kernel-cold.json  bench kernel, default matrix (llama-3.1-8b, batch 1..128 x ctx 512..32k,
#   kernel-cold.md    fp16, block 16), cold L2, every variant found, + its table and heatmap
#   kernel-cold.png
#   kernel-hot.json   a small hot-L2 subset
#   ncu.json          bench ncu (seed recipe) on two shapes; ncu-1-baseline.csv is its raw CSV
#   ncu-1-baseline.csv  (keep it: it replaces the hand-made tests/samples/ncu_raw_*.csv)
#   bench.log         everything printed
# Render markdown/PNG for the others here with `kvprefetch report $OUT/*.json`.
set -uo pipefail
WORKDIR="${1:-kvprefetch-work}"
: "${OUT:?set OUT to the output folder}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=python3
LOG="$OUT/bench.log"
: > "$LOG"
say() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
step() {  # step SECONDS CMD...: run with a time limit, log everything, never abort the script
  local limit=$1; shift
  say "+ $*"
  timeout "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  say "exit $rc"
  return 0
}

say "device: $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1)"
$PY -c 'import torch; p = torch.cuda.get_device_properties(0); print("torch", torch.__version__, "cuda", torch.version.cuda, p.name, "SMs", p.multi_processor_count, "L2", getattr(p, "L2_cache_size", "?"))' 2>&1 | tee -a "$LOG"
step 60 $PY -c "from kvprefetch.kernels.ops import find_builds; [print(b.tree, b.namespace, b.so_path, b.so_sha256[:16]) for b in find_builds('$WORKDIR')]"

# 1. Numerical identity (bitwise across builds + float64 reference), before any timing.
step 240 $PY -m kvprefetch.verify.numerics --workdir "$WORKDIR" --json "$OUT/identity.json"

# 2. bench kernel, default matrix, cold: all variants in one process, one progress line per shape.
step 330 $PY -m kvprefetch.cli.bench kernel --workdir "$WORKDIR" --mode cold \
  --out "$OUT" --name kernel-cold --formats json,md,png

# 3. A hot-L2 subset (one layer read again and again) for contrast.
step 120 $PY -m kvprefetch.cli.bench kernel --workdir "$WORKDIR" --mode hot \
  --batch 1,32 --context 1k,16k --out "$OUT" --name kernel-hot --formats json

# 4. ncu attribution (application replay, cold caches, unlocked clocks) on a v2 and a v1 shape.
NCU=$(command -v ncu || ls -d /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | tail -1)
if [ -n "$NCU" ]; then
  step 240 $PY -m kvprefetch.cli.bench ncu --workdir "$WORKDIR" --ncu "$NCU" \
    --shape 1x4k --shape 64x1k --out "$WORKDIR/bench/ncu" --name ncu --formats json,md
  cp "$WORKDIR/bench/ncu/ncu.json" "$OUT/" 2>/dev/null || say "no ncu.json"
  cp "$WORKDIR/bench/ncu/ncu-1-baseline.csv" "$OUT/" 2>/dev/null || say "no raw ncu CSV"
  [ -f "$WORKDIR/bench/ncu/ncu.md" ] && cat "$WORKDIR/bench/ncu/ncu.md" | tee -a "$LOG" >/dev/null
else
  say "ncu not found: skipping bench ncu"
fi

say "files in $OUT:"; ls -la "$OUT" | tee -a "$LOG"
# The end of the output is what the device tool returns: the kernel summary table last.
[ -f "$OUT/kernel-cold.md" ] && sed -n '/^## Summary/,/^## llama/p' "$OUT/kernel-cold.md"
