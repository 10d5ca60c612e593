#!/usr/bin/env bash
# The test command: sets up the kit's venv (torch CUDA build included) and runs the whole
# suite -- tests/unit (pure, seconds: no process, no network), tests/integration (the real
# vLLM 0.10.2 sdist, real git, real venvs, nvcc on the real attention sources, a one-node
# Slurm) and tests/gpu (skipped where no GPU exists). Arguments go to pytest:
#   bash scripts/test.sh tests/unit      the fast loop
#   bash scripts/test.sh -m "not slow"   everything but the real compiles
# pytest's exit code 5 (no tests collected) is a failure here: a selection that matches nothing
# must not pass CI.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(bash scripts/setup-venv.sh test,plot)
set +e
"$VENV/bin/python" -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests (exit 5)" >&2
  exit 1
fi
exit "$rc"
