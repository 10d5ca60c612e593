"""GPU test of the GQA twins beyond head 128 / block 16 (rules.inc's KVP_TWIN_AT): on the REAL
`baseline` and `patched` kernels-only builds, a head-64 model (TinyLlama-1.1B's shape: 32
query heads, 4 kv heads) at blocks 16 and 32, fp16 and bf16, v1 and v2:
- in `auto` the launcher runs the twin its mirror (kvprefetch.kernels.policy.twin_pick, given
  the head size, block size and cache) names for the step, and the output is stock's bit for
  bit;
- each twin forced (KVPREFETCH_GQA=<twin>) runs at every such step and is stock's bit for bit;
- v1 at block 16 has no head-64 twin (rules.inc: the v1 twins there changed the code of an
  unbounded copy), v2 has; bf16 v1 at block 32 (unbounded) has.
Needs kernels-only builds of baseline and patched that instantiate head 64 and blocks 16 and 32
(`kvprefetch build --kernels-only --head-sizes 64,... --block-sizes 16,32`), found through the
build manifests under $KVPREFETCH_WORKDIR (default kvprefetch-work)."""

from __future__ import annotations

import pytest

from tests.gpu.builds import load_stock_and_patched, run_forced

pytestmark = pytest.mark.gpu

PRESET = "tinyllama-1.1b"
# (batch x context, block size, dtype): v1 and v2 steps at both block sizes, both 16-bit caches
STEPS = [
    ("1x512", 16, "float16"), ("8x2k", 16, "float16"), ("64x1k", 16, "float16"),
    ("1x4k", 16, "float16"), ("16x8k", 16, "bfloat16"),
    ("1x512", 32, "float16"), ("8x2k", 32, "float16"), ("64x1k", 32, "bfloat16"),
    ("1x4k", 32, "bfloat16"), ("16x8k", 32, "float16"), ("32x1k", 32, "bfloat16"),
]


@pytest.fixture(scope="module")
def stock_and_patched():
    ops = load_stock_and_patched()
    for block in (16, 32):
        if not all(o.supports(64, block, "auto", "float16") for o in ops):
            pytest.skip(f"the builds do not instantiate head 64 at block {block}")
    return ops


def _shape(spec: str, block: int, dtype: str):
    from kvprefetch.bench.matrix import shapes_from_specs

    return shapes_from_specs([spec], preset=PRESET, block_size=block, dtype=dtype)[0].attn


def run_step(stock, patched, spec: str, block: int, dtype: str) -> tuple[str, list[str], bool]:
    """run_shape for a step of the preset."""
    return run_shape(stock, patched, _shape(spec, block, dtype))


def run_shape(stock, patched, shape) -> tuple[str, list[str], bool]:
    """(v1|v2, the twins one patched call ran, whether its output is stock's bit for bit), for
    a ragged batch of `shape` (an AttnShape)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from kvprefetch.kernels.kvinputs import make_inputs
    from kvprefetch.kernels.ops import forward_decode
    from tests.gpu.test_launcher_prefetch import _twins_ran

    args = make_inputs(shape, seed=7, ragged=True).args()
    want = forward_decode(stock, args)[0].clone()
    forward_decode(patched, args)  # warm-up: module load, attributes
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        got, kernel = forward_decode(patched, args)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    return kernel, _twins_ran(names), torch.equal(got.view(torch.int16), want.view(torch.int16))


@pytest.mark.filterwarnings("ignore:.*Profiler clears events")
@pytest.mark.parametrize(("spec", "block", "dtype"), STEPS)
def test_auto_runs_the_mirrors_twin_bitwise(stock_and_patched, spec: str, block: int,
                                           dtype: str) -> None:
    from kvprefetch.kernels import policy

    stock, patched = stock_and_patched
    kernel, ran, equal = run_step(stock, patched, spec, block, dtype)
    shape = _shape(spec, block, dtype)
    cache = "fp16" if dtype == "float16" else "bf16"
    if policy.twin_shapes("prefetch", kernel, "auto", 64, block, cache):
        pick = policy.twin_pick(shape.num_heads, shape.num_kv_heads, shape.num_seqs,
                                shape.max_seq_len, kernel, head_size=64, block_size=block,
                                dtype=cache)
        assert ran == ([f"{pick[0]}x{pick[1]}"] if pick else []), (kernel, ran)
    else:
        assert ran == [], (kernel, ran)
    assert equal


@pytest.mark.parametrize("twin", ["4x1", "4x2", "2x2", "2x4"])
def test_every_twin_forced_is_bitwise_stock(stock_and_patched, twin: str) -> None:
    """Each twin forced on every step above that has twins runs there and gives stock's output
    bit for bit (`auto` reaches only some twins at each instantiation)."""
    from kvprefetch.kernels import policy

    got = run_forced(twin, "tests.gpu.test_twin_coverage", "run_step", STEPS)
    for (spec, block, dtype), (kernel, ran, equal) in zip(STEPS, got, strict=True):
        cache = "fp16" if dtype == "float16" else "bf16"
        has = bool(policy.twin_shapes("prefetch", kernel, "auto", 64, block, cache))
        assert ran == ([twin] if has else []), (spec, block, dtype, kernel, ran)
        assert equal, (spec, block, dtype, kernel)
