#!/usr/bin/env bash
# Exploration, ONE device call (about 6 minutes): what the small-grid twins wait on at the two
# batch-8 shapes short of 1.4x (b8 x 512, v1, 2x2 twin with the launcher's L2 prefetch beside
# it; b8 x 1k, v2, 2x2 twin + vLLM's reduce kernel). Exploration run 26 found that issuing the
# K/V loads of B blocks per warp at once (B = 2, 4) did not help there and cost 5-17% at B = 4
# on the same grid, so the chains of dependent block loads are not the limit. Here:
#  1. Nsight Compute (one cold launch of each kernel, --cache-control all): durations, warp
#     states (is it memory latency, barriers, or instruction fetch: the B = 4 twin's code is
#     122 KB against 46 KB), for baseline, patched and b4 (2x2 at B = 4).
#  2. Timed, cold, bitwise vs stock, batch 1..16 x 512..2k: patched, nol2 (the same twins
#     without the launcher's L2 prefetch kernel: KVPREFETCH_DEFAULT_MODE=0), b2 (2x2 at B = 2).
#   device tool: run(command="bash scripts/device/twin-limits.sh", carry=[".carry"],
#                    timeout_s=590)
set -uo pipefail
BUDGET_S=${BUDGET_S:-570}
source "$(dirname "$0")/lib.sh"
begin_run twin-limits
explore_build 300 nol2 b2 b4 -- --tree-define nol2:KVPREFETCH_DEFAULT_MODE=0 \
  --tree-define b2:KVPREFETCH_TWIN_BATCH_2X2=2 --tree-define b4:KVPREFETCH_TWIN_BATCH_2X2=4
[ "$(left)" -gt 60 ] && bench 150 "${B[@]}" --mode cold --batch 1,2,4,8,16 \
  --context 512,1k,2k --variant baseline --variant patched --variant nol2 --variant b2 \
  --name small --formats json,md
SECTIONS=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats
          --section LaunchStats --section Occupancy --section InstructionStats)
targets() {
  python3 - "$W" <<'PY'
import shlex, sys
from pathlib import Path
from kvprefetch.bench.ncu import target_command
from kvprefetch.ops import find_builds
for b in find_builds(Path(sys.argv[1]), ["baseline", "patched", "nol2", "b4"]):
    for batch, ctx, kernel in ((8, 512, "v1"), (8, 1024, "v2")):
        shape = dict(batch=batch, context=ctx, num_heads=32, num_kv_heads=8, head_size=128,
                     block_size=16, dtype="float16", kv_cache_dtype="auto", kernel=kernel)
        cmd = target_command(sys.executable, b.so_path, b.namespace, shape, launches=8)
        print(f"b{batch}-{ctx}-{kernel}-{b.tree}", shlex.join(cmd))
PY
}
targets > "$R/targets.txt" || exit 6
while read -r name cmd; do
  [ "$(left)" -gt 30 ] || { log "out of time before $name"; break; }
  eval "T=($cmd)"
  step 90 ncu --cache-control all --clock-control none --target-processes all \
    -k regex:'paged_attention|gqa_decode|kv_l2_prefetch' --launch-skip 6 --launch-count 3 \
    "${SECTIONS[@]}" --page raw --print-units base "${T[@]}" > "$R/ncu-$name.txt" 2>&1
  pack
done < "$R/targets.txt"
# Per kernel: its name line, duration, registers, and each stall reason's cycles per issued
# instruction (the WarpStateStats chart's metrics, on the raw page).
STALLS="barrier|long_scoreboard|no_instruction|wait|short_scoreboard|lg_throttle|membar"
STALLS+="|branch_resolving|math_pipe_throttle|mio_throttle|not_selected|selected|dispatch_stall"
STALLS+="|drain|imc_miss|sleeping"
grep -H -E "Context 1, Stream|gpu__time_duration.sum|launch__registers_per_thread |\
issue_stalled_($STALLS)_per_issue_active" "$R"/ncu-*.txt | sed 's/(float\*, float\*.*)//' |
  cut -c1-170 | head -400
summarize
