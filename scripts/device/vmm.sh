#!/usr/bin/env bash
# The one script the VMM work runs on the H200 (device tool), from the repository root:
#   bash scripts/device/vmm.sh
# It runs every kvprefetch.vmm test (CPU and gpu-marked) and the VMM benchmark (step latency with
# and without the mapping worker; SDPA decode over the VMM cache vs cudaMalloc), and writes
# env.txt, pytest-vmm.log, pytest-vmm.xml, vmm-bench.json and bench.log under $OUT.
# Code runs from the tree (PYTHONPATH=src); nothing is installed.
#
# The comparison against vLLM's paged kernel (stock and patched) is NOT run here: it needs
# kernels-only builds made on the device first. scripts/device/vmm-vs-paged.sh does all of it in
# one device call (carry .carry/ for the sdist):
#   kvprefetch fetch --workdir W --source .carry/vllm-0.10.2.tar.gz
#   kvprefetch apply --workdir W --variant prefetch
#   kvprefetch build --workdir W --kernels-only --head-sizes 128 --block-sizes 16 --kv-dtypes fp16
#   kvprefetch vmm bench --skip-steps --paged-workdir W --out $OUT/vmm-vs-paged.json
# (docs/vmm.md, "Against vLLM's paged kernel").
set -uo pipefail
OUT=${OUT:-/tmp/vmm-out}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem \
    --format=csv
  python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
  python3 -c 'import cuda.bindings as cb; print("cuda-bindings", cb.__version__)'
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

timeout 200 python3 -m pytest tests/unit/test_vmm_*.py tests/integration/test_vmm_paged.py tests/gpu/test_vmm_*.py -v -rs -s -p no:cacheprovider \
  --junitxml="$OUT/pytest-vmm.xml" > "$OUT/pytest-vmm.log" 2>&1
echo "pytest rc=$?" | tee -a "$OUT/pytest-vmm.log"
grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/pytest-vmm.log" | grep -E "gpu|passed|failed|FAILED|ERROR" | tail -40

timeout 170 python3 -m kvprefetch.vmm.bench --out "$OUT/vmm-bench.json" > "$OUT/bench.log" 2>&1
echo "bench rc=$?" | tee -a "$OUT/bench.log"
tail -45 "$OUT/bench.log"
