"""GPU tests of v1 steps of long context on the REAL `prefetch` build (issue 31): there a GQA
twin's shared memory holds G heads' logits for the whole context, and `auto` must run only a
twin that keeps its occupancy (csrc/kvprefetch/launch_policy.cuh keeps_occupancy), else a twin of
fewer heads per CTA, else vLLM's kernel. Checked through torch.profiler's list of the kernels one
decode call ran: the twin that ran is the one kvprefetch.kernels.policy.twin_pick (the rule's
mirror) names for this device, and every output is bitwise stock's, for G = 4 (Llama-3.1-8B) and
G = 8 (Llama-3-70B at tensor-parallel 8), in auto and with every twin forced. Needs kernels-only
builds of `baseline` and `patched` (head 128, block 16, fp16) under $KVPREFETCH_WORKDIR."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.builds import WORKDIR, load_stock_and_patched
from tests.gpu.test_launcher_prefetch import _kernels_launched, _twins_ran

pytestmark = pytest.mark.gpu

# (preset, batch, context): v1 by vLLM's rule (num_seqs x heads > 512, context <= 8192); 2048
# and 3072 gave the 4x2 and 4x1 twins exactly 48 KiB of dynamic shared memory (the opt-in past
# 48 KiB counts the static part too; the forced-twin test below still runs them there); 7040 /
# 7056 were the last / first context where 4x1 fits two CTAs per SM. In v1 `auto` now takes
# only the chain-safe twins (launch_policy.cuh twin_pick); the mirror says which.
STEPS = [("llama-3.1-8b", 32, 2048), ("llama-3.1-8b", 64, 3072), ("llama-3.1-8b", 32, 6144),
         ("llama-3.1-8b", 128, 7040), ("llama-3.1-8b", 128, 7056), ("llama-3.1-8b", 256, 8192),
         ("llama-3-70b-tp8", 96, 8192), ("llama-3-70b-tp8", 256, 6000)]


@pytest.fixture(scope="module")
def stock_and_patched():
    if os.environ.get("KVPREFETCH_GQA", "auto") != "auto":
        pytest.skip("tests the `auto` rule; KVPREFETCH_GQA is set to something else")
    return load_stock_and_patched()


def _bitwise_equal(stock, patched, preset: str, batch: int, context: int) -> bool:
    import torch

    from kvprefetch.bench.matrix import shapes_from_specs
    from kvprefetch.kernels.kvinputs import make_inputs
    from kvprefetch.kernels.ops import forward_decode

    shape = shapes_from_specs([f"{batch}x{context}"], preset=preset)[0].attn
    args = make_inputs(shape, seed=batch + context).args()
    want = forward_decode(stock, args)[0].clone()
    got = forward_decode(patched, args)[0]
    torch.cuda.synchronize()
    return torch.equal(got.view(torch.int16), want.view(torch.int16))


@pytest.mark.filterwarnings("ignore:.*Profiler clears events")
@pytest.mark.parametrize(("preset", "batch", "context"), STEPS)
def test_auto_runs_the_twin_that_keeps_its_occupancy(stock_and_patched, preset: str, batch: int,
                                                     context: int) -> None:
    import torch

    from kvprefetch.bench.matrix import PRESETS
    from kvprefetch.kernels import policy

    stock, patched = stock_and_patched
    p = PRESETS[preset]
    ran, names = _kernels_launched_for(patched, preset, batch, context)
    assert ran == "v1"
    props = torch.cuda.get_device_properties(0)
    want = policy.twin_pick(p.num_heads, p.num_kv_heads, batch, context, "v1",
                            sm_count=props.multi_processor_count,
                            smem_per_sm=props.shared_memory_per_multiprocessor,
                            max_smem=props.shared_memory_per_block_optin)
    assert _twins_ran(names) == ([f"{want[0]}x{want[1]}"] if want else []), names
    assert _bitwise_equal(stock, patched, preset, batch, context)


def _kernels_launched_for(ops, preset: str, batch: int, context: int) -> tuple[str, list[str]]:
    return _kernels_launched(ops, f"{batch}x{context}", "float16", "auto", preset)


# KVPREFETCH_GQA is read once per process: each forced twin runs in its own interpreter, which
# prints, per step, the twins that ran and whether the output was bitwise stock's.
_FORCED_PROBE = """
import json, sys, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from kvprefetch.kernels.ops import find_builds, load_build
import tests.gpu.test_long_context as t
stock = load_build(find_builds(Path(sys.argv[2]), ["baseline"])[0])
patched = load_build(find_builds(Path(sys.argv[2]), ["patched"])[0])
out = []
for preset, batch, context in json.loads(sys.argv[3]):
    _, names = t._kernels_launched_for(patched, preset, batch, context)
    out.append([t._twins_ran(names), t._bitwise_equal(stock, patched, preset, batch, context)])
print(json.dumps(out))
"""


@pytest.mark.parametrize("twin", ["4x1", "4x2", "2x2", "2x4"])
def test_every_twin_forced_at_8k_is_bitwise_stock(stock_and_patched, twin: str) -> None:
    """Each twin forced (KVPREFETCH_GQA=<twin>) on v1 steps of 8192 tokens, for G = 4 and G = 8
    models, runs wherever its shared memory fits one CTA and gives stock's output bit for bit."""
    steps = [("llama-3.1-8b", 64, 8192), ("llama-3-70b-tp8", 128, 8192)]
    env = {**os.environ, "KVPREFETCH_GQA": twin}
    repo = str(Path(__file__).resolve().parents[2])  # the probe imports tests.gpu.<this module>
    res = subprocess.run([sys.executable, "-c", _FORCED_PROBE, repo,
                          str(WORKDIR), json.dumps(steps)], env=env, capture_output=True,
                         text=True, check=False, timeout=400)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    for (preset, _, _), (ran, equal) in zip(steps, got, strict=True):
        assert ran == [twin], (preset, ran)
        assert equal, preset
