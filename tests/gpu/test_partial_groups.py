"""GPU test of the GQA twins for models whose query heads per kv head are not a multiple of the
twin's G (3, 5, 6, 7: Qwen2.5-7B has 7, Qwen2.5-14B and Yi-34B 5 and 7): a kv head's heads run
in groups of G, the last group holding the rest (gqa_decode_kernel's `live`; launch_policy.cuh
twin_heads). On the REAL `baseline` and `patched` kernels-only builds, v1 and v2 steps of
ragged batches, fp16 and bf16:
- in `auto` the launcher runs the twin its mirror (kvprefetch.kernels.policy.twin_pick) names,
  none where the short-CTA guard declines one (v1 and v2), and the output is stock's bit for
  bit;
- each twin forced (KVPREFETCH_GQA=<twin>) runs wherever its G is at most the heads per kv head
  (4x1 and 4x2 not at 3 per kv head), the fused v2 2x2 twin included (1x4k with 4 kv heads:
  a grid of one CTA per SM), and every output is stock's bit for bit, the heads of the last,
  partial group included.
Needs kernels-only builds of baseline and patched that instantiate head 128 / block 16 and
head 64 / block 32 (`kvprefetch build --kernels-only`), found through the build manifests
under $KVPREFETCH_WORKDIR (default kvprefetch-work)."""

from __future__ import annotations

import pytest

from tests.gpu.builds import load_stock_and_patched, run_forced

pytestmark = pytest.mark.gpu

# (query heads, kv heads, head size, block size, dtype, batch, context)
STEPS = [
    (12, 4, 128, 16, "float16", 1, 4096), (12, 4, 128, 16, "float16", 64, 1024),
    (20, 4, 128, 16, "float16", 1, 4096), (20, 4, 128, 16, "bfloat16", 8, 2048),
    (40, 8, 128, 16, "float16", 64, 1024), (40, 8, 128, 16, "float16", 16, 8192),
    (24, 4, 128, 16, "bfloat16", 32, 2048),
    (28, 4, 128, 16, "float16", 1, 4096), (28, 4, 128, 16, "float16", 96, 1024),
    (28, 4, 128, 16, "bfloat16", 4, 16384), (28, 4, 128, 16, "float16", 256, 512),
    (28, 4, 64, 32, "float16", 8, 2048), (28, 4, 64, 32, "bfloat16", 64, 1024),
    # v2 where the short-CTA guard (launch_policy.cuh outlasts_stock) declines the 4x2 twin the
    # table names: the launcher's own count of stock's v2 CTAs per SM must agree with the
    # mirror's (5)
    (10, 2, 128, 16, "bfloat16", 110, 10868),
]
TWINS = ("4x1", "4x2", "2x2", "2x4")


@pytest.fixture(scope="module")
def stock_and_patched():
    ops = load_stock_and_patched()
    for head, block in ((128, 16), (64, 32)):
        if not all(o.supports(head, block, "auto", "float16") for o in ops):
            pytest.skip(f"the builds do not instantiate head {head} at block {block}")
    return ops


def _shape(heads: int, kv: int, head: int, block: int, dtype: str, batch: int, ctx: int):
    from kvprefetch.kernels.kvinputs import AttnShape

    return AttnShape(num_seqs=batch, num_heads=heads, num_kv_heads=kv, head_size=head,
                     block_size=block, max_seq_len=ctx, dtype=dtype)


def run(stock, patched, *step) -> tuple[str, list[str], bool]:
    """run_shape for one of STEPS."""
    from tests.gpu.test_twin_coverage import run_shape

    return run_shape(stock, patched, _shape(*step))


def _has_twins(kernel: str, head: int, block: int, dtype: str) -> bool:
    from kvprefetch.kernels import policy

    cache = "fp16" if dtype == "float16" else "bf16"
    return bool(policy.twin_shapes("prefetch", kernel, "auto", head, block, cache))


@pytest.mark.filterwarnings("ignore:.*Profiler clears events")
@pytest.mark.parametrize("step", STEPS, ids=lambda s: "-".join(map(str, s)))
def test_auto_runs_the_mirrors_twin_bitwise(stock_and_patched, step) -> None:
    from kvprefetch.kernels import policy

    heads, kv, head, block, dtype, batch, ctx = step
    kernel, ran, equal = run(*stock_and_patched, *step)
    want: list[str] = []
    if _has_twins(kernel, head, block, dtype):
        cache = "fp16" if dtype == "float16" else "bf16"
        pick = policy.twin_pick(heads, kv, batch, ctx, kernel, head_size=head,
                                block_size=block, dtype=cache)
        want = [f"{pick[0]}x{pick[1]}"] if pick else []
    assert ran == want, (kernel, ran)
    assert equal


@pytest.mark.parametrize("twin", TWINS)
def test_every_twin_forced_is_bitwise_stock(stock_and_patched, twin: str) -> None:
    """Each twin forced on every step above runs wherever its G is at most the heads per kv
    head and the instantiation has twins, and gives stock's output bit for bit."""
    got = run_forced(twin, "tests.gpu.test_partial_groups", "run", STEPS)
    group = int(twin.split("x")[0])
    for step, (kernel, ran, equal) in zip(STEPS, got, strict=True):
        heads, kv, head, block, dtype = step[:5]
        runs = group <= heads // kv and _has_twins(kernel, head, block, dtype)
        assert ran == ([twin] if runs else []), (step, kernel, ran)
        assert equal, (step, kernel)


@pytest.mark.filterwarnings("ignore:.*Profiler clears events")
@pytest.mark.parametrize(("heads", "ctx"), [(20, 5120), (28, 4096)])
def test_fused_twin_reduces_a_partial_group_bitwise(stock_and_patched, heads: int,
                                                    ctx: int) -> None:
    """One sequence of 5k tokens with 5 query heads per kv head, or of 4k with 7, and 4 kv
    heads: `auto` runs the v2 2x2 twin that does v2's reduction itself (its grid of 120 or
    128 CTAs takes one per SM), so each kv head's last group's CTA reduces 1 live head of its
    2. The output is stock's bit for bit."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from kvprefetch.kernels.kvinputs import make_inputs
    from kvprefetch.kernels.ops import forward_decode
    from tests.gpu.test_launcher_prefetch import _fused_ran

    stock, patched = stock_and_patched
    from kvprefetch.kernels import policy

    assert policy.twin_pick(heads, 4, 1, ctx, "v2") == (2, 2)
    args = make_inputs(_shape(heads, 4, 128, 16, "float16", 1, ctx), seed=11).args()
    want = forward_decode(stock, args)[0].clone()
    forward_decode(patched, args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        got, kernel = forward_decode(patched, args)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    assert kernel == "v2" and _fused_ran(names) == [True], names
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
