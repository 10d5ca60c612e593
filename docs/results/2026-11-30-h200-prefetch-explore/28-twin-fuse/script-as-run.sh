#!/usr/bin/env bash
# Exploration, ONE device call (about 5 minutes): the two batch-8 shapes short of 1.4x.
# b8 x 1k (v2, 2 partitions): Nsight Compute (exploration run 27) puts the 2x2 twin at 19.9 us
# and vLLM's reduce kernel after it at 4.2-4.6 us (cold, each alone). Tried: the v2 twins do
# the reduction themselves, as a thread-block cluster over a sequence's partitions (partition
# 0 reads the others' outputs, max logits and exp sums from their shared memory and repeats
# the reduce kernel's arithmetic): fuse8 (-DKVPREFETCH_TWIN_FUSE_MAX_PARTITIONS=8, contexts up
# to 4k). b8 x 512 (v1): exploration run 23's G = 1 small-grid twins ran 1.39x there against
# 1.34x (2x2): g1 (-DKVPREFETCH_TWIN_SMALL_G=1) and g1fuse (both).
# First the bitwise identity of every tree against stock (ragged sequence lengths, so clusters
# hold partitions with nothing to do), then cold tables, every output bitwise vs stock: batch
# 1..16 x 512..4k, the issue's matrix, bf16 batch 1/8.
#   device tool: run(command="bash scripts/device/twin-fuse.sh", carry=[".carry"],
#                    timeout_s=590)
set -uo pipefail
BUDGET_S=${BUDGET_S:-570}
source "$(dirname "$0")/lib.sh"
begin_run twin-fuse
explore_build 300 fuse8 g1 g1fuse -- \
  --tree-define fuse8:KVPREFETCH_TWIN_FUSE_MAX_PARTITIONS=8 \
  --tree-define g1:KVPREFETCH_TWIN_SMALL_G=1 --tree-define g1fuse:KVPREFETCH_TWIN_SMALL_G=1 \
  --tree-define g1fuse:KVPREFETCH_TWIN_FUSE_MAX_PARTITIONS=8
step 150 python3 -m kvprefetch.numerics --workdir "$W" --tree baseline --tree fuse8 \
  --tree g1fuse --json "$R/identity.json"
pack
[ "$(left)" -gt 60 ] && bench 120 "${B[@]}" --mode cold --batch 1,2,4,8,16 \
  --context 512,1k,2k,4k "${V[@]}" --name small --formats json,md
[ "$(left)" -gt 60 ] && bench 110 "${B[@]}" --mode cold --batch 1,8,32,64,128 \
  --context 512,1k,4k,16k "${V[@]}" --name matrix --formats json,md
[ "$(left)" -gt 40 ] && bench 70 "${B[@]}" --mode cold --batch 1,8 --context 512,1k,4k,16k \
  --dtype bfloat16 "${V[@]}" --name bf16 --formats json,md
summarize
