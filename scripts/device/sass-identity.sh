#!/usr/bin/env bash
# Issue 45: a change to csrc/kvprefetch/ that must leave every kernel's machine code as it was
# (the split of gqa_twins.cuh into its parts), checked on the FULL instantiation set of the
# `prefetch` tree (kernels/selection.py: 9 head sizes x 3 block sizes x 5 kv dtypes, v1 and v2,
# block-sparse or not, and the GQA twins beside the instantiations rules.inc names): compiled
# with the kit of the BEFORE commit (.carry/before.tar) and with this checkout's, then for every
# function `cuobjdump -sass` (instructions and encodings) and `cuobjdump -res-usage` compared
# (scripts/device/sass_identity.py says what is normalised: the fatbin header lines and the
# anonymous namespace's per-path id in names, nothing else).
# The set is compiled in PARTS, each a narrowed kernels-only build (--head-sizes,
# --block-sizes) in its own work dir, BEFORE and AFTER, all at once (a full-set source alone is
# ~10 min of one core); the union of the parts is checked to be the full set. The other trees
# need no compile: baseline's build never reads csrc/kvprefetch/ (its build key under both kits
# is compared here, and must be the same), and launch and paper do not include the twins (their
# preprocessed launchers, like patched's, are compared on the CPU: see the issue's report).
#   device tool: run(command="bash scripts/device/sass-identity.sh", carry=[".carry"],
#                    timeout_s=600)
#   .carry/: vllm-0.10.2.tar.gz (the pinned sdist) and before.tar, the BEFORE commit's files:
#            git archive -o .carry/before.tar <BEFORE_COMMIT>
# If the builds run out of time, call again on the warm machine: ninja resumes each build
# where it stopped, and finished parts are not rebuilt.
# PARTS ("HEADS:BLOCKS ..." space-separated) and KV narrow it for a test run; the summary then
# says full_set false. Results: summary.json, summary.md, logs/ (each build's output), run.log,
# env.txt. Exit 0: every part built and every function identical; 1: a difference (listed);
# 2: something not carried; 3: a part not built in time (call again).
set -uo pipefail
BUDGET_S=${BUDGET_S:-570}
source "$(dirname "$0")/lib.sh"
begin_run sass-identity
[ -f .carry/before.tar ] || {
  log "missing .carry/before.tar (git archive -o .carry/before.tar BEFORE_COMMIT; carry it)"
  exit 2; }
# The default parts: heads without twins grouped, those with twins (64, 128) split by block.
PARTS=${PARTS:-"32,80,96:8,16,32 112,120:8,16,32 192:8,16,32 256:8,16,32 64:8,32 64:16
                128:8,32 128:16"}
# The full set, as the default build's (kernels/selection.py): heads;blocks;kv dtypes.
FULL=$(python3 -c 'from kvprefetch.kernels.selection import HEAD_SIZES as h, BLOCK_SIZES as b, KV_DTYPES as k
print(";".join(",".join(map(str, x)) for x in (h, b, k)))' 2>/dev/null)
IFS=';' read -r FULL_HEADS FULL_BLOCKS FULL_KV <<< "${FULL:-;;}"
KV=${KV:-$FULL_KV}
JOBS=${JOBS:-2}  # ninja jobs per build; every build runs at once
read -r -d '' -a PART_LIST <<< "$PARTS"
log "parts: ${PART_LIST[*]}; kv $KV; ${#PART_LIST[@]} x 2 builds, $JOBS jobs each"

# The BEFORE kit, whole: its python package finds its own csrc/kvprefetch/ and patches/ beside
# its src/ (upstream.kit_root).
KB=$W/kit-before
rm -rf "$KB" && mkdir -p "$KB" && tar -xf .carry/before.tar -C "$KB" \
  || { log "cannot unpack .carry/before.tar"; exit 2; }
[ -d "$KB/src/kvprefetch" ] && [ -d "$KB/csrc/kvprefetch" ] && [ -d "$KB/patches" ] || {
  log ".carry/before.tar lacks src/kvprefetch, csrc/kvprefetch or patches (not a git archive?)"
  exit 2; }
AFTER_PP=$PYTHONPATH
BEFORE_PP=$KB/src
mkdir -p "$R/logs"

# One side of one part: fetch the `patched` tree only, apply `prefetch` with that side's kit,
# build the part. Output to logs/SIDE-PART.log.
build_side() {  # SIDE PART_NAME HEADS BLOCKS LIMIT
  local side=$1 name=$2 heads=$3 blocks=$4 limit=$5 pp wd
  [ "$side" = before ] && pp=$BEFORE_PP || pp=$AFTER_PP
  wd=$W/$side-$name
  {
    if [ ! -d "$wd/trees/patched" ]; then
      PYTHONPATH=$pp "${K[@]}" fetch --workdir "$wd" --source .carry/vllm-0.10.2.tar.gz \
        --only patched || exit 3
    fi
    PYTHONPATH=$pp "${K[@]}" apply --workdir "$wd" --variant prefetch || exit 4
    PYTHONPATH=$pp timeout "$limit" "${K[@]}" build --workdir "$wd" --kernels-only \
      --trees patched --head-sizes "$heads" --block-sizes "$blocks" --kv-dtypes "$KV" \
      --jobs "$JOBS" --yes
  } > "$R/logs/$side-$name.log" 2>&1
}
part_name() { local p=${1//,/-}; echo "h${p%%:*}_b${p#*:}"; }

# The baseline tree's build key under both kits (a dry run): the same, or the kit's headers
# reach a tree they must not.
baseline_keys() {
  local side pp key keys=()
  for side in before after; do
    [ "$side" = before ] && pp=$BEFORE_PP || pp=$AFTER_PP
    key=$(PYTHONPATH=$pp "${K[@]}" build --workdir "$W/baseline" --kernels-only --trees baseline \
            --dry-run --json --yes 2>> "$R/logs/baseline.log" \
          | python3 -c 'import json, sys; print(json.load(sys.stdin)["trees"][0]["key"])' 2>/dev/null)
    keys+=("${key:-}")
  done
  echo "${keys[0]}:${keys[1]}"
}

limit=$(( $(left) - 100 ))  # what the builds may take; the comparison needs the rest
log "building every part, before and after, at once (limit ${limit}s)"
pids=()
for p in "${PART_LIST[@]}"; do
  name=$(part_name "$p")
  for side in before after; do
    build_side "$side" "$name" "${p%%:*}" "${p#*:}" "$limit" &
    pids+=($!)
  done
done
[ -d "$W/baseline/trees/baseline" ] \
  || step 60 "${K[@]}" fetch --workdir "$W/baseline" --source .carry/vllm-0.10.2.tar.gz \
       --only baseline
BASE_KEYS=$(baseline_keys)
log "baseline build key before:after $BASE_KEYS"
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=$((failed + 1)); done
log "builds done: $failed of ${#pids[@]} failed or ran out of time (logs/)"
pack

# Each part's two libraries (a build that did not finish has no manifest: not built).
so_of() {  # WORKDIR
  local m
  m=$(ls -t "$1"/build/patched/*/manifest.json 2>/dev/null | head -1)
  [ -n "$m" ] || { echo "$1/not-built.so"; return; }
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["build_so_path"])' "$m"
}
specs=()
for p in "${PART_LIST[@]}"; do
  name=$(part_name "$p")
  specs+=("$name=$p:$(so_of "$W/before-$name"):$(so_of "$W/after-$name")")
done
CUOBJDUMP=$(python3 -c 'from kvprefetch.machine.toolchain import find_cuobjdump as f; t = f()
print(t.cuobjdump if t else "cuobjdump")' 2>/dev/null)
step $(( $(left) > 30 ? $(left) - 10 : 30 )) python3 scripts/device/sass_identity.py \
  --results "$R" --dumps "$W/dumps" --cuobjdump "${CUOBJDUMP:-cuobjdump}" --kv "$KV" \
  --full-heads "$FULL_HEADS" --full-blocks "$FULL_BLOCKS" --full-kv "$FULL_KV" \
  --baseline-keys "$BASE_KEYS" "${specs[@]}"
rc=$?
log "sass identity exit $rc"
exit "$rc"
