#!/usr/bin/env bash
# Issue 31, ONE device call (about 8 minutes): v1 steps of long context, where a GQA twin's
# shared memory (G heads' logits for the whole context) limits how many of its CTAs an SM
# holds. `auto` now keeps each twin at the occupancy its launch bound gives it
# (csrc/kvprefetch/launch_policy.cuh keeps_occupancy) and otherwise moves to a twin of fewer heads per CTA,
# or to vLLM's kernel. Trees (head 128, block 16, fp16): baseline, patched (the shipped
# `auto`), gqa_off (the same patch, KVPREFETCH_GQA_DEFAULT_MODE=0: no twin), control (A/A).
# Tables, cold, every output bitwise vs stock:
#   issue31   the issue's rows (--matrix issue31)
#   long-v1   the rule's sample: batch 32..256 x context 2k..8k, every step v1
#   forced-*  each twin forced (KVPREFETCH_GQA=4x1|4x2|2x2) on part of that sample
#   fresh     a sample drawn at run time (batch 24..256, context 3.5k..8k; FRESH_SEED, default
#             the date), so that no rule can have been fitted to it
#   70b-tp8   Llama-3-70B at tensor-parallel 8 (8 query heads over 1 kv head: G = 8)
#   qwen      Qwen2.5-7B (7 query heads per kv head: no twin)
# The GPU tests of tests/gpu/test_long_context.py. Then Nsight Compute at b64 x 8k (occupancy limits, achieved occupancy, DRAM throughput) for
# stock, no twin, 4x1 forced and the shipped auto, and each tree's `cuobjdump -res-usage`.
#   device tool: run(command="bash scripts/device/long-context.sh", carry=[".carry"], timeout_s=590)
set -uo pipefail
BUDGET_S=${BUDGET_S:-570}
source "$(dirname "$0")/lib.sh"
begin_run long-context
V=(--tree baseline --tree patched --tree gqa_off --tree control)
step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz --extra-tree control \
  --extra-tree gqa_off || exit 3
for t in patched gqa_off; do
  step 30 "${K[@]}" apply --workdir "$W" --variant prefetch --tree "$t" || exit 4
done
step 30 "${K[@]}" apply --workdir "$W" --variant control || exit 4
step 240 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes 128 \
  --block-sizes 16 --kv-dtypes fp16 --trees baseline,patched,gqa_off,control \
  --tree-define gqa_off:KVPREFETCH_GQA_DEFAULT_MODE=0 || exit 5
res_usage
bench 60 "${B[@]}" --mode cold --matrix issue31 "${V[@]}" --name issue31 --formats json,md
bench 150 "${B[@]}" --mode cold --batch 32,64,128,256 --context 2k,3k,4k,5k,6k,7k,8k "${V[@]}" \
  --name long-v1 --formats json,md,png
step 150 python3 -m pytest -m gpu -p no:cacheprovider -q -rs tests/gpu/test_long_context.py 2>&1 \
  | tail -30 > "$R/pytest-gpu.txt"
for t in 4x1 4x2 2x2; do
  export KVPREFETCH_GQA=$t
  [ "$(left)" -gt 200 ] && bench 40 "${B[@]}" --mode cold --batch 64,256 --context 3k,6k,7k,8k \
    --tree baseline --tree patched --name "forced-$t" --formats json,md
  unset KVPREFETCH_GQA
done
FRESH_SEED=${FRESH_SEED:-$(date -u +%Y%m%d)}
read -r FB FC < <(python3 -c 'import random, sys; r = random.Random(int(sys.argv[1]))
print(",".join(map(str, sorted(r.sample(range(24, 257), 3)))),
      ",".join(map(str, sorted(r.sample(range(3500, 8193), 3)))))' "$FRESH_SEED")
log "fresh sample (seed $FRESH_SEED): batch $FB x context $FC"
[ "$(left)" -gt 120 ] && bench 60 "${B[@]}" --mode cold --batch "$FB" --context "$FC" "${V[@]}" \
  --name fresh --formats json,md
[ "$(left)" -gt 100 ] && bench 50 "${B[@]}" --mode cold --preset llama-3-70b-tp8 \
  --batch 96,128,256 --context 4k,6k,8k "${V[@]}" --name 70b-tp8 --formats json,md
[ "$(left)" -gt 80 ] && bench 40 "${B[@]}" --mode cold --preset qwen2.5-7b --batch 64,128 \
  --context 4k,8k "${V[@]}" --name qwen --formats json,md
ncu_occupancy() {  # TREE [GQA_MODE]: one ncu CSV of the b64 x 8k step
  env ${2:+KVPREFETCH_GQA=$2} python3 - "$W" "$R/ncu-b64x8k-$1${2:+-$2}.csv" "$1" <<'EOF'
import sys
from pathlib import Path
from kvprefetch.bench.matrix import shapes_from_specs
from kvprefetch.bench.ncu import NcuOptions, ncu_command, target_command
from kvprefetch.kernels.ops import find_builds
from kvprefetch.runner import run
build = find_builds(Path(sys.argv[1]), [sys.argv[3]])[0]
shape = shapes_from_specs(["64x8k"])[0].to_dict()
opts = NcuOptions(launch_skip=4, launch_count=2, kernel_regex="regex:paged_attention|gqa_decode",
                  metrics=("gpu__time_duration.sum", "launch__occupancy_limit_shared_mem",
                           "launch__occupancy_limit_registers", "launch__registers_per_thread",
                           "launch__shared_mem_per_block_dynamic", "launch__grid_size",
                           "launch__block_size", "sm__warps_active.avg.pct_of_peak_sustained_active",
                           "dram__throughput.avg.pct_of_peak_sustained_elapsed"))
run(ncu_command(target_command(sys.executable, build.so_path, build.namespace, shape, 8),
                Path(sys.argv[2]), opts), echo=True)
EOF
}
if [ "$(left)" -gt 60 ]; then
  for tm in baseline: gqa_off: patched:4x1 patched:; do
    [ "$(left)" -gt 30 ] && { log "ncu $tm"; ncu_occupancy "${tm%%:*}" "${tm##*:}" 2>&1 \
      | tail -5 | tee -a "$LOG"; }
  done
  pack
fi
summarize
