#!/usr/bin/env bash
# The GPU-marked tests on real builds, in ONE device call (about 6 minutes): fetch the carried
# sdist into baseline, patched and launch, apply, kernels-only build (head 128, block 16, fp16,
# bf16 and fp8 caches: what the tests use), verify-kernel, then `pytest -m gpu` on the tests
# that need a GPU (they find the builds through KVPREFETCH_WORKDIR).
#   device tool: run(command="bash scripts/device/gpu-tests.sh", carry=[".carry"], timeout_s=600)
set -uo pipefail
BUDGET_S=${BUDGET_S:-420}
source "$(dirname "$0")/lib.sh"
begin_run gpu-tests

step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz --extra-tree launch \
  || exit 3
step 30 "${K[@]}" apply --workdir "$W" --variant prefetch || exit 4
step 30 "${K[@]}" apply --workdir "$W" --variant launch || exit 4
step 150 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes 128 \
  --block-sizes 16 --kv-dtypes fp16,bf16,fp8 || exit 5
# VERIFY=0 leaves verify-kernel out (about a minute), for a tree another run has verified.
if [ "${VERIFY:-1}" = 1 ]; then
  step 180 "${K[@]}" verify-kernel --workdir "$W"
  cp "$W/verify/report.json" "$R/verify.json" 2>/dev/null
fi
res_usage
# The GPU tests took 167 s on the H200 (53 passed) against a limit of 150 s, which ended the
# script with 124 (issue 42): 300 s leaves room for a slower node or a few more tests.
step 300 python3 -m pytest -m gpu -p no:cacheprovider -q -rs tests/gpu 2>&1 \
  | tee "$R/pytest-gpu.txt"
rc=${PIPESTATUS[0]}
log "pytest -m gpu exit $rc"
exit "$rc"
