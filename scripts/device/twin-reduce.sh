#!/usr/bin/env bash
# Exploration, ONE device call (about 5 minutes): how much of b8 x 1k's time (repeat run 41:
# 1.36x, 20.3 us, the one shape of issue 6's matrix short of 1.4x) is v2's reduction after the
# twin, and where the staged 2x2 twin's warps wait there.
#  1. Trees (head 128, block 16, fp16 + bf16): baseline; patched; skipred (the `prefetch` patch
#     with KVPREFETCH_EXPLORE_SKIP_REDUCE=1: after a v2 twin no reduction at all, so its outputs
#     are WRONG and the bench says so; the time is the most a reduction done inside the twin
#     could save). Timed cold: batch 1..16 x 512..16k and the issue's matrix.
#  2. Nsight Compute (one cold launch, --cache-control all) of patched at b8 x 1k and b8 x 512:
#     warp states per kernel (raw page) and the twin's per-instruction stall samples (source
#     page, SASS, CSV).
#   device tool: run(command="bash scripts/device/twin-reduce.sh", carry=[".carry"],
#                    timeout_s=540)
set -uo pipefail
BUDGET_S=${BUDGET_S:-520}
source "$(dirname "$0")/lib.sh"
begin_run twin-reduce
explore_build 200 skipred -- --tree-define skipred:KVPREFETCH_EXPLORE_SKIP_REDUCE=1
[ "$(left)" -gt 60 ] && bench 120 "${B[@]}" --mode cold --batch 1,2,4,8,16 \
  --context 512,1k,2k,4k,16k "${V[@]}" --name small --formats json,md
[ "$(left)" -gt 60 ] && bench 110 "${B[@]}" --mode cold --batch 1,8,32,64,128 \
  --context 512,1k,4k,16k "${V[@]}" --name matrix --formats json,md
targets() {
  python3 - "$W" <<'PY'
import shlex, sys
from pathlib import Path
from kvprefetch.bench.ncu import target_command
from kvprefetch.kernels.ops import find_builds
for b in find_builds(Path(sys.argv[1]), ["patched"]):
    for batch, ctx, kernel in ((8, 1024, "v2"), (8, 512, "v1")):
        shape = dict(batch=batch, context=ctx, num_heads=32, num_kv_heads=8, head_size=128,
                     block_size=16, dtype="float16", kv_cache_dtype="auto", kernel=kernel)
        cmd = target_command(sys.executable, b.so_path, b.namespace, shape, launches=8)
        print(f"b{batch}-{ctx}-{kernel}-{b.tree}", shlex.join(cmd))
PY
}
targets > "$R/targets.txt" || exit 6
STALLS="barrier|long_scoreboard|no_instruction|wait|short_scoreboard|lg_throttle|membar"
STALLS+="|branch_resolving|math_pipe_throttle|mio_throttle|not_selected|selected|dispatch_stall"
STALLS+="|drain|imc_miss|sleeping"
while read -r name cmd; do
  [ "$(left)" -gt 40 ] || { log "out of time before $name"; break; }
  eval "T=($cmd)"
  step 90 ncu --cache-control all --clock-control none --target-processes all \
    -k regex:'gqa_decode|gqa_reduce|kv_l2_prefetch' --launch-skip 6 --launch-count 3 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section LaunchStats --section Occupancy --page raw --print-units base "${T[@]}" \
    > "$R/ncu-$name.txt" 2>&1
  pack
  [ "$(left)" -gt 40 ] || break
  step 90 ncu --cache-control all --clock-control none --target-processes all \
    -k regex:'gqa_decode' --launch-skip 6 --launch-count 1 --section WarpStateStats \
    --section SourceCounters --page source --print-source sass --csv "${T[@]}" \
    > "$R/ncu-source-$name.csv" 2>&1
  gzip -f "$R/ncu-source-$name.csv"
  pack
done < "$R/targets.txt"
grep -H -E "Context 1, Stream|gpu__time_duration.sum|launch__registers_per_thread |\
issue_stalled_($STALLS)_per_issue_active" "$R"/ncu-b*.txt | sed 's/(float\*, float\*.*)//' |
  cut -c1-170 | head -120
summarize
