#!/usr/bin/env bash
# Exploration, ONE device call (about 6 minutes): what limits vLLM's attention kernels on the
# large steps where no L2 prefetch helps? Nsight Compute's full sections (speed of light,
# memory workload with its L1/L2 tables, scheduler and warp-state statistics, occupancy) for
# stock (`baseline`) and the shipped `prefetch` kernels (`patched`), one cold launch each
# (--cache-control all: L2 flushed before every replay pass), on five Llama-3.1-8B fp16 steps:
# b128 x 4k and b64 x 1k (v1), b8 x 16k, b1 x 16k and b8 x 1k (v2). The question behind it:
# are the large steps bound by the L2-to-SM traffic of the GQA group's repeated K/V reads
# (exploration run 16 tried to share them through L1 and lost), by instruction issue, or by
# latency? Writes one text report per (shape, tree) under results/.
#   device tool: run(command="bash scripts/device/ncu-limits.sh", carry=[".carry"], timeout_s=560)
set -uo pipefail
BUDGET_S=${BUDGET_S:-540}
source "$(dirname "$0")/lib.sh"
begin_run ncu-limits
step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz || exit 3
step 30 "${K[@]}" apply --workdir "$W" --variant prefetch || exit 4
step 200 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes 128 \
  --block-sizes 16 --kv-dtypes fp16 --trees baseline,patched || exit 5
SECTIONS=(--section SpeedOfLight --section MemoryWorkloadAnalysis
          --section MemoryWorkloadAnalysis_Tables --section MemoryWorkloadAnalysis_Chart
          --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats
          --section Occupancy --section LaunchStats --section InstructionStats)
# The profiled program: kvprefetch.bench.ncu's target (eager decode calls of one build).
targets() {
  python3 - "$W" <<'PY'
import shlex, sys
from pathlib import Path
from kvprefetch.bench.ncu import target_command
from kvprefetch.kernels.ops import find_builds
shapes = [(128, 4096, "v1"), (64, 1024, "v1"), (8, 16384, "v2"), (1, 16384, "v2"),
          (8, 1024, "v2")]
for b in find_builds(Path(sys.argv[1]), ["baseline", "patched"]):
    for batch, ctx, kernel in shapes:
        shape = dict(batch=batch, context=ctx, num_heads=32, num_kv_heads=8, head_size=128,
                     block_size=16, dtype="float16", kv_cache_dtype="auto", kernel=kernel)
        cmd = target_command(sys.executable, b.so_path, b.namespace, shape, launches=8)
        print(f"b{batch}-{ctx}-{kernel}-{b.tree}", shlex.join(cmd))
PY
}
targets > "$R/targets.txt" || exit 6
while read -r name cmd; do
  [ "$(left)" -gt 40 ] || { log "out of time before $name"; break; }
  eval "T=($cmd)"
  step 120 ncu --cache-control all --clock-control none --target-processes all \
    -k regex:'paged_attention_v[12]_kernel' --launch-skip 4 --launch-count 1 \
    "${SECTIONS[@]}" --print-units base "${T[@]}" > "$R/ncu-$name.txt" 2>&1
  pack
done < "$R/targets.txt"
grep -H -E "Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|L1/TEX Hit|L2 Hit Rate|Issue Slots Busy|Achieved Occupancy|Registers Per" "$R"/ncu-*.txt | cut -c1-160
