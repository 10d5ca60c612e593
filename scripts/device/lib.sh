# Shared by the device scripts: a log with timestamps and seconds since start, a step runner
# with a time limit that keeps the step's exit code, and the seconds left of BUDGET_S.
# Source it after setting LOG (the log file) and BUDGET_S.
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
}
