# Shared by the device scripts: a log with timestamps and seconds since start, a step runner
# with a time limit that keeps the step's exit code, and the seconds left of BUDGET_S.
# Source it after setting BUDGET_S, then call begin_run NAME (below).
log() { echo "== $(date -u +%H:%M:%S) +${SECONDS}s $*" | tee -a "$LOG"; }
step() { local limit=$1; shift; log "+ $*"; timeout "$limit" "$@" 2>&1 | tee -a "$LOG";
         local rc=${PIPESTATUS[0]}; log "exit $rc"; return "$rc"; }
left() { echo $((BUDGET_S - SECONDS)); }
device_env() {   # what the results were measured on, for env.txt
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
  nvcc --version | tail -2 | head -1
  git rev-parse HEAD 2>/dev/null; git status --short 2>/dev/null | head -20
  local tree; tree=$(worktree_id) && echo "tree $tree (the files as copied; a commit with" \
    "these files has it as \`git rev-parse COMMIT^{tree}\`)"
}
# The git tree id of the checkout's files as they are, tracked and untracked (not ignored),
# written through a scratch index so git's own index is untouched. The device copy's commit is
# the session's first, with later edits on top; this id names the files that actually ran.
worktree_id() {
  local idx rc; idx=$(mktemp) || return 1
  cp "$(git rev-parse --git-path index 2>/dev/null)" "$idx" 2>/dev/null || : > "$idx"
  GIT_INDEX_FILE=$idx git add -A . > /dev/null 2>&1 && GIT_INDEX_FILE=$idx git write-tree
  rc=$?; rm -f "$idx"; return "$rc"
}
# res_usage: registers, stack and shared memory of every kernel in each built tree's library
# (`cuobjdump -res-usage`), one file per tree in the results: what decides how many CTAs fit an
# SM, which an early launch needs (docs/design.md, programmatic dependent launch).
res_usage() {
  local m t so tool
  tool=$(python3 -c 'from kvprefetch.machine.toolchain import find_cuobjdump as f; t = f()
print(t.cuobjdump if t else "cuobjdump")' 2>/dev/null) || tool=cuobjdump
  for m in "$W"/build/*/*/manifest.json; do
    [ -f "$m" ] || continue
    t=$(basename "$(dirname "$(dirname "$m")")")
    so=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["build_so_path"])' "$m")
    "$tool" -res-usage "$so" > "$R/res-usage-$t.txt" 2>&1 || log "res-usage of $t failed"
  done
}
# Designs timed beside the default, each one more tree with the `prefetch` patch built with one
# define, added when its switch is 1 (appends to V and FETCH, and the build's --tree-define
# flags to ALT_DEF; nothing without the switch):
#   NOPDL=1   -> `nopdl`, KVPREFETCH_TWIN_PDL=0: the twins launched as vLLM launches its
#                kernels, not as programmatic dependents (repeat run 24's design;
#                docs/tuning-log.md rows 42-46);
#   NOSTAGE=1 -> `nostage`, KVPREFETCH_TWIN_STAGE=0: the twins load K and V from global, no
#                shared-memory ring (repeat run 36's design; rows 47-49);
#   NOFUSE=1  -> `nofuse`, KVPREFETCH_TWIN_FUSE=0: a reduce kernel after every v2 twin, none
#                inside (repeat run 41's design, SASS identical; rows 51-53).
#   NOSPLIT=1 -> `nosplit`, KVPREFETCH_TWIN_STAGE_SPLIT=0: each staged warp's whole ring
#                requested at once (the design of repeat run 51, `ec95c35`).
ALT_DEF=()
alt_tree() {  # SWITCH TREE DEFINE
  [ "${!1:-0}" = 1 ] || return 0
  V+=(--tree "$2"); FETCH+=(--extra-tree "$2")
  ALT_DEF+=(--tree-define "$2:$3")
}
alt_trees() { ALT_DEF=(); alt_tree NOPDL nopdl KVPREFETCH_TWIN_PDL=0
              alt_tree NOSTAGE nostage KVPREFETCH_TWIN_STAGE=0
              alt_tree NOFUSE nofuse KVPREFETCH_TWIN_FUSE=0
              alt_tree NOSPLIT nosplit KVPREFETCH_TWIN_STAGE_SPLIT=0; }
# The results folder's life: pack() writes $OUT/results.tgz atomically (what the device tool
# brings back; call it after each table so a cut-short run still returns what it measured);
# bench() is step() followed by pack(); finish() packs and removes the folder.
pack() { tar -C "$OUT" -czf "$OUT/results.tgz.tmp" results && mv "$OUT/results.tgz.tmp" "$OUT/results.tgz"; }
bench() { step "$@"; local rc=$?; pack; return "$rc"; }
finish() { log "done"; pack && rm -rf "$R"; }
# begin_run NAME: the run's folders and commands, then its preamble. Sets OUT (default
# /tmp/NAME-out; the device tool sets it), W (the work dir: KVPREFETCH_WORKDIR or
# /tmp/kvf-NAME), R = $OUT/results, LOG, K (the kvprefetch CLI) and B (`bench kernel` writing
# into R), exports what the CLI reads, records the device in env.txt, packs and removes R on
# exit, and stops (exit 2) unless the pinned sdist was carried into .carry/.
begin_run() {
  local name=$1
  OUT=${OUT:-/tmp/$name-out}
  W=${KVPREFETCH_WORKDIR:-/tmp/kvf-$name}
  R=$OUT/results; mkdir -p "$R"
  LOG=$R/run.log
  export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 NO_COLOR=1 \
    KVPREFETCH_WORKDIR="$W" KVPREFETCH_PAGED_WORKDIR="$W"
  K=(python3 -m kvprefetch)
  B=(python3 -m kvprefetch.cli.bench kernel --workdir "$W" --out "$R")
  trap finish EXIT
  device_env > "$R/env.txt" 2>&1
  tee -a "$LOG" < "$R/env.txt"
  [ -f .carry/vllm-0.10.2.tar.gz ] || { log "missing .carry/vllm-0.10.2.tar.gz (carry it)"; exit 2; }
}
# A script's last step: the summary rows of every table it measured; where the time budget let
# none run (a slow build), it says so and exits 6 instead of ending quietly.
summarize() {
  if ! ls "$R"/*.md > /dev/null 2>&1; then
    log "no table measured: BUDGET_S=$BUDGET_S left too little after the build (raise it)"
    exit 6
  fi
  grep -A10 "^## Summary" "$R"/*.md | grep "| cold\|| hot" | cut -c1-220
}
