#!/usr/bin/env bash
# Issue 29: the sampled benchmark. `bench kernel --sample N` on three fresh seeds, each step
# timed under CUDA-graph replay AND eagerly (back-to-back calls, host path included), cold,
# every output bitwise vs stock. The seeds are drawn when the first call starts (SAMPLE_SEEDS,
# default: the UTC month, day, hour and minute as one number, and the two after it), so that
# no rule can have been fitted to them; the rules were chosen on seeds 29 and 20261201
# (docs/results/2026-12-01-h200-sample). Trees, kernels-only:
#   baseline  stock vLLM 0.10.2
#   launch    the launcher's L2 prefetch kernel only (`apply --variant launch`), kernels untouched
#   gqa_off   the `prefetch` patch built with -DKVPREFETCH_GQA_DEFAULT_MODE=0: launch bounds,
#             code generation and prefetch, no GQA twin
#   patched   the `prefetch` patch as shipped (twins on `auto`)
#   control   stock rebuilt through the same pipeline (A/A: the benchmark's resolution)
# The last seed times all five (the attribution table); the first two baseline, patched and
# control (the distribution, the worst steps and the A/A band).
# Instantiations (what the sample may draw; the sampler reads them from the manifests):
# SAMPLE_HEADS (64,128,256), SAMPLE_BLOCKS (16,32), SAMPLE_KV (fp16,bf16,fp8): 48 kernels per
# source, about 170-200 s on 16 cores for the five trees. If the build runs out of its time,
# call again: ninja resumes where it stopped.
# Each seed: SAMPLE_N (200) steps, 11 rounds of 2 ms samples per tree, graph then eager of the
# same step side by side; the bench's --time-limit keeps it inside the call's budget (steps past
# it are recorded as not run). A seed completed in full is marked in $W.sample-done/SEED and
# skipped by later calls. GPU_TESTS=1 runs the GPU tests on the same builds after the seed
# (GPU_TEST_PATHS, default tests/gpu: the files or directories to run, space-separated).
# ATTRIBUTION=0 builds and times baseline, patched and control only (no attribution table;
# about 40% less build time).
# THREE device calls, each right after the one before, on the warm machine (the later ones find
# the builds in $W and skip fetch/apply/build), one seed each:
#   device tool: run(command="SEED_INDEX=0 bash scripts/device/sample.sh", carry=[".carry"],
#                    timeout_s=595), then SEED_INDEX=1 GPU_TESTS=1, then SEED_INDEX=2
# Results: sample-SEED.json/.md/.png per seed, run.log, env.txt, pytest-gpu.txt; commit them
# under docs/results/<date>-h200-sample-fresh/ (results of a second call go into the same
# folder).
set -uo pipefail
BUDGET_S=${BUDGET_S:-570}
source "$(dirname "$0")/lib.sh"
begin_run sample
HEADS=${SAMPLE_HEADS:-64,128,256}
BLOCKS=${SAMPLE_BLOCKS:-16,32}
KVD=${SAMPLE_KV:-fp16,bf16,fp8}
N=${SAMPLE_N:-200}
# the seeds are drawn once per work dir: a second call keeps the first's
mkdir -p "$W.sample-done"
if [ -z "${SAMPLE_SEEDS:-}" ] && [ -f "$W.sample-done/seeds" ]; then
  SAMPLE_SEEDS=$(cat "$W.sample-done/seeds")
fi
if [ -z "${SAMPLE_SEEDS:-}" ]; then
  first=$((10#$(date -u +%m%d%H%M)))
  SAMPLE_SEEDS="$first,$((first + 1)),$((first + 2))"
fi
echo "$SAMPLE_SEEDS" > "$W.sample-done/seeds"
IFS=, read -r -a SEEDS <<< "$SAMPLE_SEEDS"
TREES=baseline,launch,gqa_off,patched,control
ATTRIB=(--variant baseline --variant launch --variant gqa_off --variant patched --variant control)
PLAIN=(--variant baseline --variant patched --variant control)
if [ "${ATTRIBUTION:-1}" = 0 ]; then  # three trees only, every seed plain: a shorter build
  TREES=baseline,patched,control
  ATTRIB=("${PLAIN[@]}")
fi
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
  extra=(--extra-tree control)
  [ "${ATTRIBUTION:-1}" = 0 ] || extra+=(--extra-tree launch --extra-tree gqa_off)
  step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz "${extra[@]}" \
    || exit 3
  step 30 "${K[@]}" apply --workdir "$W" --variant prefetch --tree patched || exit 4
  if [ "${ATTRIBUTION:-1}" != 0 ]; then
    step 30 "${K[@]}" apply --workdir "$W" --variant prefetch --tree gqa_off || exit 4
    step 30 "${K[@]}" apply --workdir "$W" --variant launch || exit 4
  fi
  step 30 "${K[@]}" apply --workdir "$W" --variant control || exit 4
  defines=()
  [ "${ATTRIBUTION:-1}" = 0 ] || defines=(--tree-define gqa_off:KVPREFETCH_GQA_DEFAULT_MODE=0)
  step 250 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes "$HEADS" \
    --block-sizes "$BLOCKS" --kv-dtypes "$KVD" --trees "$TREES" "${defines[@]}" \
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
# SEED_INDEX (0, 1 or 2; default all) runs one seed in this call, the others are left for
# later calls; the last seed times all five trees (attribution), the others three.
for i in "${!SEEDS[@]}"; do
  seed=${SEEDS[$i]}
  if [ -f "$W.sample-done/$seed" ]; then log "seed $seed: done in an earlier call"; continue; fi
  if [ -n "${SEED_INDEX:-}" ] && [ "$i" != "$SEED_INDEX" ]; then LEFT_OVER+=("$seed"); continue; fi
  keep=$([ "${GPU_TESTS:-0}" = 1 ] && echo 150 || echo 0)
  limit=$(( $(left) - 45 - keep ))
  if [ "$limit" -lt 90 ]; then LEFT_OVER+=("$seed"); continue; fi
  if [ "$i" = $(( ${#SEEDS[@]} - 1 )) ]; then V=("${ATTRIB[@]}"); else V=("${PLAIN[@]}"); fi
  bench $((limit + 40)) "${B[@]}" --mode cold --sample "$N" --sample-seed "$seed" \
    --timing graph,eager --rounds 11 --sample-ms 2 --max-layers 4096 --time-limit "$limit" \
    "${V[@]}" --name "sample-$seed" --formats json,md,png
  if complete "$seed"; then touch "$W.sample-done/$seed"; else LEFT_OVER+=("$seed"); fi
done
# GPU_TESTS=1: the GPU-marked tests on the same builds, after this call's seed
if [ "${GPU_TESTS:-0}" = 1 ]; then
  read -r -a paths <<< "${GPU_TEST_PATHS:-tests/gpu}"
  step $(( $(left) - 10 )) python3 -m pytest -m gpu -p no:cacheprovider -q -rs "${paths[@]}" 2>&1 \
    | tee "$R/pytest-gpu.txt"
  pack
fi
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
