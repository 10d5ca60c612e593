#!/usr/bin/env bash
# The main job, in the strongest mode this machine supports:
#   - where a CUDA >= 12.8 toolkit, a GPU and the network exist: the full two-tree vLLM build;
#   - otherwise: fetch -> patch -> kernels-only compile of both trees' real attention
#     sources -> verify-kernel (the GPU section runs where a GPU is present).
# Extra arguments go to `kvprefetch build` (e.g. --head-sizes 128 --block-sizes 16 for a
# quick narrowed build, or --mode kernels-only to force that mode).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(bash scripts/setup-venv.sh sass,plot)  # a failed set-up stops here (set -e)
VENV=$(cd "$VENV" && pwd)
K="$VENV/bin/kvprefetch"
# kvprefetch is installed in the kit's own venv, not on PATH. Say how to reach it, on success or
# failure alike (a failed step is investigated with the same commands). A launcher in, say,
# ~/.local/bin would write outside the repository and may not be on PATH either.
path_hint() {
  echo "kvprefetch is in $VENV; to run it as \`kvprefetch\` in this shell:" >&2
  echo "  source $VENV/bin/activate" >&2
}
trap path_hint EXIT
"$K" fetch --with-paper --extra-tree launch
"$K" apply --variant prefetch
"$K" apply --variant launch
"$K" apply --variant paper
"$K" diff-upstream --check --stat
"$K" build --arch "${KVPREFETCH_ARCH:-9.0a}" "$@"
"$K" verify-kernel
