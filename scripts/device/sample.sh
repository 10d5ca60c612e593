#!/usr/bin/env bash
# Issue 29, item 1: the sampled benchmark. `bench kernel --sample N` on three seeds, each step
# timed under CUDA-graph replay AND eagerly (back-to-back calls, host path included), cold,
# every output bitwise vs stock. Seeds: 29 (fixed: the one to tune on) and two fresh ones drawn
# from the date (FRESH_SEED, default YYYYMMDD, and FRESH_SEED + 1), so that nothing can have
# been fitted to them. Trees, kernels-only:
#   baseline  stock vLLM 0.10.2
#   launch    the launcher's L2 prefetch kernel only (`apply --variant launch`), kernels untouched
#   gqa_off   the `prefetch` patch built with -DKVPREFETCH_GQA_DEFAULT_MODE=0: launch bounds,
#             code generation and prefetch, no GQA twin
#   patched   the `prefetch` patch as shipped (twins on `auto`)
#   control   stock rebuilt through the same pipeline (A/A: the benchmark's resolution)
# Instantiations (what the sample may draw; the sampler reads them from the manifests):
# SAMPLE_HEADS (64,128,256), SAMPLE_BLOCKS (16,32), SAMPLE_KV (fp16,bf16,fp8). Estimated build:
# 4 trees at head 128 / block 16 / fp16 took 83 s (2026-12-01-h200-long-context) and 5 trees
# at 3 heads x block 16 x fp16,bf16,fp8 (24 kernels per source) 90 s; block 16+32 doubles the
# kernels per source (48), so about 170-200 s on 16 cores, under the build step's 250 s. If it
# runs out anyway, call again: ninja resumes where it stopped (or pass SAMPLE_BLOCKS=16).
# Each seed: SAMPLE_N (200) steps, 11 rounds of 2 ms samples per variant, graph then eager of
# the same step side by side; the bench's --time-limit keeps it inside the call's budget (steps
# past it are recorded as not run). A seed completed in full is marked in the work dir
# ($W.sample-done/SEED) and skipped by later calls.
# ONE OR TWO device calls: the first fetches the carried sdist, applies, builds, and runs as
# many seeds as fit; when seeds are left it exits 7 and says so: call the same command again on
# the warm machine (it finds the builds in $W, skips fetch/apply/build, and runs the seeds left).
#   device tool: run(command="bash scripts/device/sample.sh", carry=[".carry"], timeout_s=590)
# Results: sample-SEED.json/.md/.png per seed, run.log, env.txt; commit them under
# docs/results/<date>-h200-sample/ (results of a second call go into the same folder).
set -uo pipefail
BUDGET_S=${BUDGET_S:-570}
source "$(dirname "$0")/lib.sh"
begin_run sample
HEADS=${SAMPLE_HEADS:-64,128,256}
BLOCKS=${SAMPLE_BLOCKS:-16,32}
KVD=${SAMPLE_KV:-fp16,bf16,fp8}
N=${SAMPLE_N:-200}
TUNE_SEED=29
# the fresh seeds are drawn once per work dir: a second call after midnight keeps the first's
mkdir -p "$W.sample-done"
[ -f "$W.sample-done/fresh-seed" ] && FRESH_SEED=${FRESH_SEED:-$(cat "$W.sample-done/fresh-seed")}
FRESH_SEED=${FRESH_SEED:-$(date -u +%Y%m%d)}
echo "$FRESH_SEED" > "$W.sample-done/fresh-seed"
SEEDS=("$TUNE_SEED" "$FRESH_SEED" "$((FRESH_SEED + 1))")
TREES=baseline,launch,gqa_off,patched,control
V=(--variant baseline --variant launch --variant gqa_off --variant patched --variant control)
log "instantiations: head $HEADS, block $BLOCKS, kv $KVD; seeds ${SEEDS[*]}; $N steps each"

builds_ready() {  # the five trees built with exactly this instantiation set
  python3 - "$W" "$TREES" "$HEADS" "$BLOCKS" "$KVD" <<'EOF'
import sys
from pathlib import Path
from kvprefetch.kernels.ops import find_builds
w, trees, heads, blocks, kv = sys.argv[1:]
ints = lambda s: sorted(int(x) for x in s.split(","))
found = {b.tree: b for b in find_builds(Path(w))}
ok = all(t in found and sorted(found[t].head_sizes) == ints(heads)
         and sorted(found[t].block_sizes) == ints(blocks)
         and sorted(found[t].kv_dtypes) == sorted(kv.split(",")) for t in trees.split(","))
sys.exit(0 if ok else 1)
EOF
}

if builds_ready; then
  log "builds found in $W: fetch, apply and build skipped"
else
  step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz --extra-tree launch \
    --extra-tree gqa_off --extra-tree control || exit 3
  for t in patched gqa_off; do
    step 30 "${K[@]}" apply --workdir "$W" --variant prefetch --tree "$t" || exit 4
  done
  step 30 "${K[@]}" apply --workdir "$W" --variant launch || exit 4
  step 30 "${K[@]}" apply --workdir "$W" --variant control || exit 4
  step 250 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes "$HEADS" \
    --block-sizes "$BLOCKS" --kv-dtypes "$KVD" --trees "$TREES" \
    --tree-define gqa_off:KVPREFETCH_GQA_DEFAULT_MODE=0 \
    || { log "build stopped: call again (ninja resumes) or narrow SAMPLE_BLOCKS=16"; exit 5; }
fi

complete() {  # SEED: its document exists and every step was started (none cut by the limit)
  python3 - "$R/sample-$1.json" <<'EOF'
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except OSError:
    sys.exit(1)
cut = [r for r in doc["meta"]["not_measured"] if r["reason"].startswith("not started")]
sys.exit(1 if cut or doc["meta"]["aborted"] else 0)
EOF
}

LEFT_OVER=()
for seed in "${SEEDS[@]}"; do
  if [ -f "$W.sample-done/$seed" ]; then log "seed $seed: done in an earlier call"; continue; fi
  limit=$(( $(left) - 45 ))
  if [ "$limit" -lt 90 ]; then LEFT_OVER+=("$seed"); continue; fi
  bench $((limit + 40)) "${B[@]}" --mode cold --sample "$N" --sample-seed "$seed" \
    --timing graph,eager --rounds 11 --sample-ms 2 --max-layers 4096 --time-limit "$limit" \
    "${V[@]}" --name "sample-$seed" --formats json,md,png
  if complete "$seed"; then touch "$W.sample-done/$seed"; else LEFT_OVER+=("$seed"); fi
done
for f in "$R"/sample-*.md; do
  [ -f "$f" ] || continue
  log "$(basename "$f"):"
  grep -E "^## (graph|eager)|^\| (launch|gqa_off|patched|control) \||^A/A band" "$f" \
    | tee -a "$LOG"
done
if [ "${#LEFT_OVER[@]}" -gt 0 ]; then
  log "seeds left: ${LEFT_OVER[*]}: call this script again on the warm machine (it reuses $W)"
  exit 7
fi
