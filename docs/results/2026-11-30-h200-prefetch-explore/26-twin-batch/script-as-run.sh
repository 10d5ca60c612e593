#!/usr/bin/env bash
# Exploration, ONE device call (about 5 minutes): the twins' warps walk their blocks one after
# the other, and each block's K (then V) loads are consumed before the next block's are issued:
# one memory round trip per block and pass (SASS of the 2x2 twin: 16 K loads, then the dot
# products, per loop iteration). Tried here: each warp issues the loads of B blocks at once
# (kTwins' b, -DKVPREFETCH_TWIN_BATCH_<twin>=B), and with B > 1 requests its first V blocks
# before the softmax (KVPREFETCH_TWIN_EARLY_V). ptxas (nvcc 13.0) gives B = 4 at 255
# registers for 4x2 and 2x2 (one 256-thread CTA per SM), B = 2 at 238-243; 2x4 at B = 2
# spills (128 registers at 512 threads).
# Trees (head 128, block 16, fp16 + bf16), all but baseline the `prefetch` patch:
#   baseline; patched (B = 1 everywhere); b4 (4x2, 2x2 at B = 4; auto); b2 (4x2, 2x2, 2x4 at
#   B = 2; auto); b4late (b4, V loads at the V pass); f42b4 / f22b4 (4x2 / 2x2 at B = 4, forced
#   at every launch); f24b2 (2x4 at B = 2, forced).
# Timed, cold, every output bitwise vs stock: batch 1..16 x 512..16k, the issue's matrix,
# bf16 batch 1/8 x 512..16k.
#   device tool: run(command="bash scripts/device/twin-batch.sh", carry=[".carry"],
#                    timeout_s=590)
set -uo pipefail
BUDGET_S=${BUDGET_S:-570}
source "$(dirname "$0")/lib.sh"
begin_run twin-batch
EXTRA=(b4 b2 b4late f42b4 f22b4 f24b2)
D=()
for t in b4 b4late; do
  D+=(--tree-define "$t:KVPREFETCH_TWIN_BATCH_4X2=4"
      --tree-define "$t:KVPREFETCH_TWIN_BATCH_2X2=4")
done
D+=(--tree-define b4late:KVPREFETCH_TWIN_EARLY_V=0)
for x in 4X2 2X2 2X4; do D+=(--tree-define "b2:KVPREFETCH_TWIN_BATCH_$x=2"); done
# forced twins: KVPREFETCH_GQA_DEFAULT_MODE = 3 + the twin's index in kTwins
D+=(--tree-define f42b4:KVPREFETCH_TWIN_BATCH_4X2=4
    --tree-define f42b4:KVPREFETCH_GQA_DEFAULT_MODE=4
    --tree-define f22b4:KVPREFETCH_TWIN_BATCH_2X2=4
    --tree-define f22b4:KVPREFETCH_GQA_DEFAULT_MODE=5
    --tree-define f24b2:KVPREFETCH_TWIN_BATCH_2X4=2
    --tree-define f24b2:KVPREFETCH_GQA_DEFAULT_MODE=6)
explore_build 330 "${EXTRA[@]}" -- "${D[@]}"
twin_tables
summarize
