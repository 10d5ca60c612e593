#!/usr/bin/env bash
# The test command: sets up the kit's venv (torch CUDA build included) and runs the whole
# suite -- tests/unit (pure, seconds: no process, no network), tests/integration (the real
# vLLM 0.10.2 sdist, real git, real venvs, nvcc on the real attention sources, a one-node
# Slurm) and tests/gpu (skipped where no GPU exists). Arguments go to pytest:
#   bash scripts/test.sh tests/unit      the fast loop
#   bash scripts/test.sh -m "not slow"   everything but the real compiles
#   bash scripts/test.sh --fresh [ARGS]  the same, as a new machine runs it (below)
# pytest's exit code 5 (no tests collected) is a failure here: a selection that matches nothing
# must not pass CI.
#
# The suite runs in parallel (pytest-xdist, `-n N --dist loadgroup`): N is the number of CPUs
# plus one (3 on CI's 2 cores: much of the suite waits on subprocesses, git, pip and the disk,
# not the CPU), at least 2. Each expensive session fixture is still built once for the whole
# run (tests/integration/sharing.py). To choose yourself:
#   KVPREFETCH_TEST_WORKERS=4 bash scripts/test.sh     4 workers (0 or 1: serial, no xdist)
#   bash scripts/test.sh -n 2 ...                       your own -n (with --dist loadgroup added)
#   bash scripts/test.sh -p no:xdist ...  /  --dist X   yours, untouched
#
# --fresh runs the suite from a clean clone of HEAD in a temporary folder, with an empty HOME,
# XDG_CACHE_HOME/XDG_CONFIG_HOME, MPLCONFIGDIR, TMPDIR and pip/uv caches, and a new .venv (torch
# is downloaded again): what a user's first run meets, which a developer's warm caches hide
# (issue 42: matplotlib's font cache made every first run red while CI stayed green). What
# passes through is where packages come from, not what was downloaded: the environment
# (PIP_INDEX_URL, PIP_FIND_LINKS, ...), pip's /etc config, and your user pip/uv config file
# (as PIP_CONFIG_FILE / UV_CONFIG_FILE: an index or mirror, never a cache). Uncommitted changes
# are not in the clone. The folder is removed when the suite passes, kept (and named) when not.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--fresh" ]; then
  shift
  if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    echo "note: --fresh tests HEAD ($(git rev-parse --short HEAD)); uncommitted changes are not in it" >&2
  fi
  top=$(mktemp -d "${TMPDIR:-/tmp}/kvprefetch-fresh.XXXXXX")
  # The whole suite took 18 GB here at its peak (README, Requirements); say so before it runs
  # out half-way (CI's run of 5ee646a met ENOSPC at 77%, its errors naming no cause).
  free_gb=$(df -P -BG "$top" | awk 'NR == 2 { sub("G", "", $4); print $4 }')
  if [ "${free_gb:-0}" -lt 18 ]; then
    echo "warning: ${free_gb} GB free at $top; the whole suite took 18 GB at its peak: free" \
      "disk or point TMPDIR at a larger disk (the overlay test skips where its build cannot fit)" >&2
  fi
  echo "+ git clone $(pwd) $top/kvprefetch  (HEAD $(git rev-parse --short HEAD))" >&2
  git clone -q --no-hardlinks "$(pwd)" "$top/kvprefetch"
  git -C "$top/kvprefetch" checkout -q --detach "$(git rev-parse HEAD)"
  mkdir -p "$top/home/.cache" "$top/home/.config" "$top/mpl" "$top/tmp" "$top/pip-cache" \
    "$top/uv-cache"
  pass=()
  pipconf=${PIP_CONFIG_FILE:-}
  for f in "$HOME/.config/pip/pip.conf" "$HOME/.pip/pip.conf"; do
    if [ -z "$pipconf" ] && [ -f "$f" ]; then pipconf=$f; fi
  done
  if [ -n "$pipconf" ]; then
    echo "  pip config passed through: $pipconf" >&2
    pass+=("PIP_CONFIG_FILE=$pipconf")
  fi
  uvconf=${UV_CONFIG_FILE:-}
  if [ -z "$uvconf" ] && [ -f "$HOME/.config/uv/uv.toml" ]; then uvconf=$HOME/.config/uv/uv.toml; fi
  if [ -n "$uvconf" ]; then
    echo "  uv config passed through: $uvconf" >&2
    pass+=("UV_CONFIG_FILE=$uvconf")
  fi
  set +e
  env -u KVPREFETCH_VENV -u KVPREFETCH_WORKDIR -u KVPREFETCH_TEST_CACHE -u VIRTUAL_ENV \
    -u PYTHONPATH ${pass[@]+"${pass[@]}"} \
    HOME="$top/home" XDG_CACHE_HOME="$top/home/.cache" XDG_CONFIG_HOME="$top/home/.config" \
    MPLCONFIGDIR="$top/mpl" TMPDIR="$top/tmp" PIP_CACHE_DIR="$top/pip-cache" \
    UV_CACHE_DIR="$top/uv-cache" bash "$top/kvprefetch/scripts/test.sh" "$@"
  rc=$?
  set -e
  if [ "$rc" -eq 0 ]; then
    rm -rf "$top"
  else
    echo "the fresh run failed (exit $rc); its clone, venv and caches are kept in $top" >&2
  fi
  exit "$rc"
fi
VENV=$(bash scripts/setup-venv.sh test,plot)
xdist=()
own_n=0
own_dist=0
prev=
for a in "$@"; do
  case "$a" in
    -n|-n*|--numprocesses|--numprocesses=*) own_n=1 ;;
    --dist|--dist=*|-pno:xdist) own_dist=1 ;;
  esac
  if [ "$prev" = "-p" ] && [ "$a" = "no:xdist" ]; then own_dist=1; fi
  prev=$a
done
if [ "$own_dist" -eq 0 ] && [ "$own_n" -eq 1 ]; then
  xdist=(--dist loadgroup --no-loadscope-reorder)  # your -n, each fixture built once
elif [ "$own_dist" -eq 0 ]; then
  workers=${KVPREFETCH_TEST_WORKERS:-$(( $(nproc 2>/dev/null || echo 1) + 1 ))}
  if ! [[ "$workers" =~ ^[0-9]+$ ]]; then
    echo "KVPREFETCH_TEST_WORKERS=$workers is not a number of workers (0 or 1: serial)" >&2
    exit 2
  fi
  if [ "$workers" -ge 2 ]; then
    # (--no-loadscope-reorder: the slow groups first, as tests/integration/sharing.py orders)
    xdist=(-n "$workers" --dist loadgroup --no-loadscope-reorder)
    echo "+ pytest -n $workers --dist loadgroup (KVPREFETCH_TEST_WORKERS to change)" >&2
  fi
fi
set +e
"$VENV/bin/python" -m pytest ${xdist[@]+"${xdist[@]}"} "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests (exit 5)" >&2
  exit 1
fi
exit "$rc"
