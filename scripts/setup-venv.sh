#!/usr/bin/env bash
# Create (or reuse) the kit's own virtual environment and install kvprefetch into it, with a
# CUDA build of torch for compiling the kernels-only extension. Idempotent.
#   KVPREFETCH_VENV   where the venv lives (default: .venv in the repository)
#   KVPREFETCH_TORCH  the torch requirement (default: torch==2.14.1, a CUDA 13 build)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${KVPREFETCH_VENV:-.venv}
TORCH=${KVPREFETCH_TORCH:-torch==2.14.1}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  echo "+ $PY -m venv $VENV" >&2
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >&2
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)" 2>/dev/null; then
  echo "+ pip install $TORCH (CUDA build; about a minute from a local mirror, several GB otherwise)" >&2
  "$VENV/bin/python" -m pip install -q "$TORCH" >&2
fi
echo "+ pip install -e .[$1]" >&2
"$VENV/bin/python" -m pip install -q -e ".[$1]" >&2
echo "$VENV"
