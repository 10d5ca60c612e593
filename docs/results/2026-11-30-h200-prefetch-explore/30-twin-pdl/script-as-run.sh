#!/usr/bin/env bash
# Exploration, ONE device call (about 4 minutes): the two batch-8 shapes short of 1.4x again.
# Nsight Compute (exploration run 27) timed the 2x2 twin alone at 16.1 us (b8 x 512) against
# 14.8 us per call in the benchmark's graph, and at b8 x 1k the twin and vLLM's reduce kernel
# at 19.9 + 4.4 us: each call is one or two short kernels back to back, so launch latency and
# the ramp of each grid are a real part of it. Tried: programmatic dependent launch (Hopper;
# KVPREFETCH_TWIN_PDL): each twin CTA lets the stream's next kernel launch at once and waits
# (griddepcontrol.wait) for the previous kernel to complete before it touches memory; pdl1 the
# twins only, pdl2 also kvprefetch's own v2 reduce kernel (vLLM's arithmetic, the same wait).
# First the bitwise identity of pdl1/pdl2 against stock (ragged lengths), then cold tables,
# every output bitwise vs stock: batch 1..16 x 512..4k, the issue's matrix, bf16 batch 1/8.
#   device tool: run(command="bash scripts/device/twin-pdl.sh", carry=[".carry"],
#                    timeout_s=590)
set -uo pipefail
BUDGET_S=${BUDGET_S:-570}
source "$(dirname "$0")/lib.sh"
begin_run twin-pdl
explore_build 300 pdl1 pdl2 -- --tree-define pdl1:KVPREFETCH_TWIN_PDL=1 \
  --tree-define pdl2:KVPREFETCH_TWIN_PDL=2
step 150 python3 -m kvprefetch.numerics --workdir "$W" --tree baseline --tree pdl1 \
  --tree pdl2 --json "$R/identity.json"
pack
[ "$(left)" -gt 60 ] && bench 120 "${B[@]}" --mode cold --batch 1,2,4,8,16 \
  --context 512,1k,2k,4k "${V[@]}" --name small --formats json,md
[ "$(left)" -gt 60 ] && bench 110 "${B[@]}" --mode cold --batch 1,8,32,64,128 \
  --context 512,1k,4k,16k "${V[@]}" --name matrix --formats json,md
[ "$(left)" -gt 40 ] && bench 70 "${B[@]}" --mode cold --batch 1,8 --context 512,1k,4k,16k \
  --dtype bfloat16 "${V[@]}" --name bf16 --formats json,md
summarize
