#!/usr/bin/env bash
# The test command: sets up the kit's venv (torch CUDA build included) and runs the whole
# suite -- unit tests, and integration tests that download the real vLLM 0.10.2 sdist, clone
# with real git, create real venvs and compile the real attention sources with nvcc.
# GPU-marked tests are skipped where no GPU exists.
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
