#!/usr/bin/env bash
# The main job, in the strongest mode this machine supports:
#   - where a CUDA >= 12.8 toolkit, a GPU and the network exist: the full two-tree vLLM build;
#   - otherwise: fetch -> patch -> kernels-only compile of both trees' real attention
#     sources -> verify-kernel (the GPU section runs where a GPU is present).
# Extra arguments go to `kvprefetch build` (e.g. --head-sizes 128 --block-sizes 16 for a
# quick narrowed build, or --mode kernels-only to force that mode).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(bash scripts/setup-venv.sh sass,plot)
K="$VENV/bin/kvprefetch"
"$K" fetch --with-seed --extra-tree launch
"$K" apply --variant prefetch
"$K" apply --variant launch
"$K" apply --variant seed
"$K" diff-upstream --check --stat
"$K" build --arch "${KVPREFETCH_ARCH:-9.0a}" "$@"
"$K" verify-kernel
