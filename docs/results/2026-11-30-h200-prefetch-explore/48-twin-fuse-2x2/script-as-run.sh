#!/usr/bin/env bash
# Exploration, ONE device call (about 6 minutes): v2's reduction inside the twins. Run 46
# (`46-twin-reduce/`) timed b8 x 1k at 20.3 us with the reduction after the twin and 17.8 us
# with none at all (wrong outputs, an upper bound): the reduce kernel and the wait for the
# whole twin grid before it are 12% of that step. Here the CTA of each (sequence, head group)
# that finishes last reduces the group's heads itself (reduce_in_twin, KVPREFETCH_TWIN_FUSE=1,
# counters per stream).
# Trees (head 128, block 16, fp16 + bf16): baseline; patched (the `prefetch` patch, fused);
# nofuse (KVPREFETCH_TWIN_FUSE=0: the reduce kernel after every v2 twin, as shipped).
#  1. verify-kernel (baseline vs patched: SASS checks and the GPU identity cases).
#  2. Timed, cold, every output bitwise vs stock: batch 1..16 x 512..16k, the issue's matrix,
#     bf16 batch 1/8.
#   device tool: run(command="bash scripts/device/twin-fuse.sh", carry=[".carry"],
#                    timeout_s=560)
set -uo pipefail
BUDGET_S=${BUDGET_S:-540}
source "$(dirname "$0")/lib.sh"
begin_run twin-fuse
explore_build 200 nofuse -- --tree-define nofuse:KVPREFETCH_TWIN_FUSE=0
res_usage
step 150 "${K[@]}" verify-kernel --workdir "$W"
cp "$W/verify/report.json" "$R/verify.json" 2>/dev/null
pack
twin_tables
summarize
