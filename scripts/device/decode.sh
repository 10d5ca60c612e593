#!/usr/bin/env bash
# `bench decode` on the H200, ONE device call (about 8 minutes): whole-model decode steps of
# Llama-3.1-8B, Qwen2.5-7B and Llama-3-70B at tensor-parallel 8 (8 of its layers) through stock
# (baseline), the shipped `prefetch` (patched) and the paper's variant (`paper`), one process per model,
# every step's logits checked bitwise. Fetch the carried sdist, apply, kernels-only build (head
# 128, block 16, fp16), the GPU tests of tests/gpu/test_bench_decode_gpu.py, then per model:
# batch 1, 8, 32, 128 x context 1k, 8k, 32k (the points whose K/V fits are run, the others are
# recorded as skipped) and one long-tail serving trace (--serve longtail).
#   device tool: run(command="bash scripts/device/decode.sh", carry=[".carry"], timeout_s=590)
set -uo pipefail
BUDGET_S=${BUDGET_S:-570}
source "$(dirname "$0")/lib.sh"
begin_run decode
V=(--tree baseline --tree patched --tree paper)
step 60 "${K[@]}" fetch --workdir "$W" --source .carry/vllm-0.10.2.tar.gz --with-paper || exit 3
for v in prefetch paper; do
  step 30 "${K[@]}" apply --workdir "$W" --variant "$v" || exit 4
done
step 200 "${K[@]}" build --workdir "$W" --kernels-only --jobs 16 --head-sizes 128 \
  --block-sizes 16 --kv-dtypes fp16 || exit 5
step 150 python3 -m pytest -m gpu -p no:cacheprovider -q -rs tests/gpu/test_bench_decode_gpu.py \
  2>&1 | tail -30 > "$R/pytest-gpu.txt"
D=(python3 -m kvprefetch bench decode --workdir "$W" --out "$R" "${V[@]}" --batch 1,8,32,128
   --context 1k,8k,32k --steps ${STEPS:-16} --repeats ${REPEATS:-3} --serve longtail
   --requests ${REQUESTS:-256} --output-len 48 --formats json,md,png)
for p in llama-3.1-8b qwen2.5-7b llama-3-70b-tp8; do
  [ "$(left)" -gt 60 ] && bench $(( $(left) - 20 )) "${D[@]}" --preset "$p" --name "decode-$p"
done
grep -h -A6 "^## Summary" "$R"/decode-*.md 2>/dev/null | tee -a "$LOG"
