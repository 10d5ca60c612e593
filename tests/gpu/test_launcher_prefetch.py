"""GPU test of the shipped `auto` rule on the REAL `prefetch` build: its launchers fire
kv_l2_prefetch_kernel beside the attention kernel on steps whose KV is at most L2/2 (v1, and v2
whether or not the kernel carries the prologue) and not on larger steps, and only into a CUDA
graph being captured (an eager call of a step that small is paced by the host, where the extra
launches are loss); stock never launches it. Seen through torch.profiler's list of the kernels that
ran. Needs kernels-only builds of `baseline` and `patched` made on this machine
(`kvprefetch build --kernels-only`), found through the build manifests under $KVPREFETCH_WORKDIR
(default kvprefetch-work)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.gpu.builds import WORKDIR, load_stock_and_patched

pytestmark = pytest.mark.gpu

PREFETCH_KERNEL = "kv_l2_prefetch_kernel"


@pytest.fixture(scope="module")
def stock_and_patched():
    import torch

    if os.environ.get("KVPREFETCH", "auto") != "auto":
        pytest.skip("tests the `auto` rule; KVPREFETCH is set to something else")
    ops = load_stock_and_patched()
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the bulk L2 prefetch needs sm_90 (no prefetch kernel is launched before)")
    return ops


def _kernels_launched(ops, spec: str, dtype: str, kv_cache_dtype: str,
                      preset: str = "llama-3.1-8b", graph: bool = False) -> tuple[str, list[str]]:
    """(v1|v2, names of the CUDA kernels one decode call ran), after one warm-up call; with
    ``graph``, of one replay of a CUDA graph that captured the call."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from kvprefetch.bench.matrix import shapes_from_specs
    from kvprefetch.kernels.kvinputs import make_inputs
    from kvprefetch.kernels.ops import forward_decode

    shape = shapes_from_specs([spec], preset=preset, dtype=dtype,
                              kv_cache_dtype=kv_cache_dtype)[0].attn
    if not ops.supports(shape.head_size, shape.block_size, shape.kv_cache_dtype, shape.dtype):
        pytest.skip(f"{spec} {dtype}/{kv_cache_dtype} is not instantiated in {ops.name}")
    args = make_inputs(shape).args()
    _, kernel = forward_decode(ops, args)  # applies the mode and creates the side stream
    torch.cuda.synchronize()
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            forward_decode(ops, args)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            g.replay()
            torch.cuda.synchronize()
    else:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            _, kernel = forward_decode(ops, args)
            torch.cuda.synchronize()
    return kernel, [e.name for e in prof.events() if e.device_type.name == "CUDA"]


TWIN_KERNEL = "gqa_decode_kernel"
REDUCE_KERNEL = "reduce_kernel"  # vLLM's paged_attention_v2_reduce_kernel or kvprefetch's
# torch.profiler's (demangled) name ends in the twin's template arguments ..., G, S, STAGED,
# FUSED>(...) (FUSED: v2's reduction inside the twin; true only in the v2 2x2 twin).
TWIN_SHAPE = re.compile(r"gqa_decode_kernel<.*, (\d+), (\d+), (true|false)(?:, (true|false))?>\(")
# The twins with a shared-memory ring (csrc/kvprefetch/gqa_twins.cuh, KVPREFETCH_TWIN_STAGE): S = 2.
STAGED_TWINS = ("4x2", "2x2")


def _twins_ran(names: list[str]) -> list[str]:
    return [f"{m[1]}x{m[2]}" for n in names for m in [TWIN_SHAPE.search(n)] if m is not None]


def _staged_ran(names: list[str]) -> list[bool]:
    return [m[3] == "true" for n in names for m in [TWIN_SHAPE.search(n)] if m is not None]


def _fused_ran(names: list[str]) -> list[bool]:
    return [m[4] == "true" for n in names for m in [TWIN_SHAPE.search(n)] if m is not None]


# torch.profiler warns (once per process) that each profiling cycle clears its events; this
# test reads them inside the cycle, and the suite turns warnings into errors.
@pytest.mark.filterwarnings("ignore:.*Profiler clears events")
@pytest.mark.parametrize(("spec", "dtype", "kv", "kernel", "fires", "twin"), [
    ("1x512", "float16", "auto", "v1", True, "2x4"),  # 2 MB, 32 CTAs (0.24 per SM)
    ("1x4k", "float16", "auto", "v2", True, "2x2"),   # 16.8 MB, 256 CTAs
    ("1x4k", "float16", "fp8", "v2", True, None),     # 8.4 MB; fp8 caches have no twin
    # 134 MB > L2/2; 2048 stock CTAs, of which 480 surely have work (3.6 per SM)
    # no twin since e31e1e7 (some number of long rows would give a twin more waves than
    # stock's code: policy.more_waves_for_some)
    ("8x4k", "float16", "auto", "v2", False, None),
    ("32x1k", "float16", "auto", "v1", False, None),  # 134 MB
])
def test_prefetch_kernel_fires_on_small_steps_only(stock_and_patched, spec: str, dtype: str,
                                                   kv: str, kernel: str, fires: bool,
                                                   twin: str | None) -> None:
    """The launcher's prefetch kernel runs beside small steps only, and only in a captured graph
    (eagerly never, in `auto`); and in `auto` one of the
    GQA-grouped twins replaces vLLM's kernel, the one kvprefetch.kernels.policy.twin_pick names for
    the step on the H200; stock runs neither."""
    import torch

    from kvprefetch.kernels import policy
    stock, patched = stock_and_patched
    ran, names = _kernels_launched(patched, spec, dtype, kv)
    assert ran == kernel
    assert _twins_ran(names) == ([twin] if twin else []), names
    # every staged twin here gets its two slots per warp (none is a v1 step of long context)
    assert _staged_ran(names) == ([twin in STAGED_TWINS] if twin else []), names
    # without a twin, vLLM's kernel or the kit's unbounded copy of it (stock's code) runs
    assert any(("paged_attention" in n or "unbounded_v1_kernel" in n) and "reduce" not in n
               for n in names) == (not twin), names
    batch, ctx = (int(x[:-1]) * 1024 if x.endswith("k") else int(x) for x in spec.split("x"))
    ctas = 32 * batch * (1 if kernel == "v1" else -(-ctx // 512))  # 32 query heads
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if kv == "auto" and sms == 132:  # the mirror's pick (or none) is what ran
        pick = policy.twin_pick(32, 8, batch, ctx, kernel)
        assert twin == (f"{pick[0]}x{pick[1]}" if pick else None)
    # v2's reduction: inside the twin where policy.twin_reduces says so, else a reduce kernel
    fused = bool(twin) and policy.twin_reduces(kernel, *map(int, twin.split("x")),
                                               ctas // int(twin.split("x")[0]), sms)
    assert _fused_ran(names) == ([fused] if twin else []), names
    assert any(REDUCE_KERNEL in n for n in names) == (kernel == "v2" and not fused), names
    assert not any(PREFETCH_KERNEL in n for n in names), names  # eager: never in `auto`
    _, captured = _kernels_launched(patched, spec, dtype, kv, graph=True)
    assert any(PREFETCH_KERNEL in n for n in captured) == fires, captured
    assert _twins_ran(captured) == _twins_ran(names), captured  # the same decision in a graph
    for graph in (False, True):
        _, stock_names = _kernels_launched(stock, spec, dtype, kv, graph=graph)
        assert not any(PREFETCH_KERNEL in n or TWIN_KERNEL in n for n in stock_names), stock_names


# KVPREFETCH_GQA is read once per process, so each setting runs in its own interpreter, which
# prints the twins one decode call ran (the helpers above, imported from this file).
_FORCED_PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from kvprefetch.kernels.ops import find_builds, load_build
import tests.gpu.test_launcher_prefetch as t
patched = load_build(find_builds(Path(sys.argv[2]), ["patched"])[0])
_, names = t._kernels_launched(patched, sys.argv[3], "float16", "auto")
print(json.dumps(t._twins_ran(names)))
"""


@pytest.mark.parametrize(("setting", "spec", "ran"), [
    ("off", "1x512", []),         # vLLM's kernel
    ("on", "1x512", ["4x1"]),     # `on` is 4x1, on a grid where auto picks 2x4
    ("4x2", "1x512", ["4x2"]),
    ("2x2", "8x4k", ["2x2"]),     # auto would pick 4x1 there
    ("2x4", "32x1k", ["2x4"]),
    ("bogus", "1x512", ["2x4"]),  # ignored with a note on stderr: the default, auto
])
def test_kvprefetch_gqa_forces_the_named_twin(stock_and_patched, setting: str, spec: str,
                                             ran: list[str]) -> None:
    """KVPREFETCH_GQA=off|on|4x1|4x2|2x2|2x4 runs that twin (or none) at a launch it can take,
    whatever `auto` would pick; an unknown value is ignored with a message naming the values."""
    import json
    import subprocess
    import sys

    env = {**os.environ, "KVPREFETCH_GQA": setting}
    repo = str(Path(__file__).resolve().parents[2])  # the probe imports tests.gpu.<this module>
    res = subprocess.run([sys.executable, "-c", _FORCED_PROBE, repo,
                          str(WORKDIR), spec], env=env, capture_output=True, text=True,
                         check=False, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == ran
    if setting == "bogus":
        assert "ignoring KVPREFETCH_GQA=bogus (use off, auto, on, 4x1" in res.stderr


def test_reduction_inside_the_twin_on_two_streams_at_once(stock_and_patched) -> None:
    """v2's reduction inside the 2x2 twin (csrc/kvprefetch/gqa_twins.cuh, reduce_in_twin): on a grid
    where the launcher runs it (b4 x 1k: 128 twin CTAs; on the H200's 132 SMs the rule's range),
    with ragged sequences (some of one partition, whose output is copied), two streams run it at the
    same time, each on its own inputs, eight launches per stream per round, over five rounds:
    every output is bitwise stock's. Each stream counts its CTAs' arrivals on counters of its
    own (fuse_slot); the test checks the outputs under concurrent use, it cannot force the two
    streams' kernels to overlap."""
    import torch

    from kvprefetch.bench.matrix import shapes_from_specs
    from kvprefetch.kernels import policy
    from kvprefetch.kernels.kvinputs import make_inputs
    from kvprefetch.kernels.ops import forward_decode

    stock, patched = stock_and_patched
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if not policy.twin_reduces("v2", 2, 2, 128, sms):
        pytest.skip(f"a 128-CTA 2x2 grid does not reduce inside the twin on {sms} SMs")
    ran, names = _kernels_launched(patched, "1x4k", "float16", "auto")
    assert ran == "v2" and _twins_ran(names) == ["2x2"] and _fused_ran(names) == [True], names
    shape = shapes_from_specs(["1x4k"], dtype="float16", kv_cache_dtype="auto")[0].attn
    # `auto` reaches the fused twin at one sequence only (launch_policy.cuh twin_pick: a 2x2
    # grid of more than half of the SMs needs heads x (sequences + partitions - 1) >= 1.5 per
    # SM), so every stream's batch is one sequence of 4k here
    inputs = [make_inputs(shape, seed=seed) for seed in (1, 2, 3)]
    want = [forward_decode(stock, i.args())[0].clone() for i in inputs]
    streams = [torch.cuda.Stream() for _ in inputs]
    torch.cuda.synchronize()
    for _ in range(5):
        outs: list[list] = [[] for _ in inputs]
        for _ in range(8):
            for k, (st, i) in enumerate(zip(streams, inputs, strict=True)):
                with torch.cuda.stream(st):
                    outs[k].append(forward_decode(patched, i.args())[0])
        torch.cuda.synchronize()
        for k, w in enumerate(want):
            for o in outs[k]:
                assert torch.equal(o.view(torch.int16), w.view(torch.int16))


def test_reduction_inside_the_twin_writes_stock_zeros_for_an_empty_sequence(
        stock_and_patched) -> None:
    """A sequence of no tokens (seq_len 0, e.g. a padded slot of a captured batch) has no
    partition for the fused 2x2 twin to reduce; vLLM's reduce kernel writes 0 for it, and so
    must the twin (csrc/kvprefetch/gqa_twins.cuh: the kernel's first lines). Its row and every other
    row bitwise stock's, on a step where the twin reduces (b4 x 1k, 128 twin CTAs)."""
    import torch

    from kvprefetch.bench.matrix import shapes_from_specs
    from kvprefetch.kernels import policy
    from kvprefetch.kernels.kvinputs import make_inputs
    from kvprefetch.kernels.ops import forward_decode

    stock, patched = stock_and_patched
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if not policy.twin_reduces("v2", 2, 2, 128, sms):
        pytest.skip(f"a 128-CTA 2x2 grid does not reduce inside the twin on {sms} SMs")
    shape = shapes_from_specs(["4x1k"], dtype="float16", kv_cache_dtype="auto")[0].attn
    inputs = make_inputs(shape, seed=4)
    inputs.seq_lens[2] = 0
    args = inputs.args()
    want = forward_decode(stock, args)[0]
    got = forward_decode(patched, args)[0]
    torch.cuda.synchronize()
    assert torch.count_nonzero(want[2]).item() == 0  # stock: zeros for the empty sequence
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


UNBOUNDED_KERNEL = "unbounded_v1_kernel"


@pytest.mark.filterwarnings("ignore:.*Profiler clears events")
@pytest.mark.parametrize(("spec", "dtype", "unbounded"), [
    ("20x30", "float16", True),     # 640 CTAs of 2 blocks: one wave of stock's, two bounded
    ("16x30", "float16", False),    # 512 CTAs: one wave either way, for any long rows
    ("20x200", "float16", True),    # 13 blocks per CTA: a long chain wins no wave back
    ("40x100", "bfloat16", True),   # 1280 CTAs of 7 blocks: 2 waves of stock's, 3 bounded
])
def test_bounded_v1_runs_stock_code_where_the_bound_costs_a_wave(
        stock_and_patched, spec: str, dtype: str, unbounded: bool) -> None:
    """On an MHA model (no twin), the v1 launcher runs stock's unbounded copy of the bounded
    kernel exactly where policy.stock_v1_wins says (wherever some number of long rows would
    give the bound a wave more), from the two kernels' occupancy the runtime reports (H200: 4
    bounded and 5 stock CTAs of head 128 per SM), eagerly and in a
    captured graph alike; the output is bitwise equal to stock's either way."""
    import torch

    from kvprefetch.bench.matrix import shapes_from_specs
    from kvprefetch.kernels import policy
    from kvprefetch.kernels.kvinputs import make_inputs
    from kvprefetch.kernels.ops import forward_decode

    stock, patched = stock_and_patched
    preset = "llama-2-7b"
    kernel, names = _kernels_launched(patched, spec, dtype, "auto", preset=preset)
    assert kernel == "v1"
    assert any(UNBOUNDED_KERNEL in n for n in names) == unbounded, names
    assert sum("paged_attention_v1_kernel" in n for n in names) == (not unbounded), names
    _, captured = _kernels_launched(patched, spec, dtype, "auto", preset=preset, graph=True)
    assert any(UNBOUNDED_KERNEL in n for n in captured) == unbounded, captured
    batch = int(spec.split("x")[0])
    if torch.cuda.get_device_properties(0).multi_processor_count == 132:
        assert policy.stock_v1_wins(32, batch, 132, 4, 5) == unbounded
    _, stock_names = _kernels_launched(stock, spec, dtype, "auto", preset=preset)
    assert not any(UNBOUNDED_KERNEL in n for n in stock_names), stock_names
    shape = shapes_from_specs([spec], preset=preset, dtype=dtype)[0].attn
    args = make_inputs(shape).args()
    want, _ = forward_decode(stock, args)
    got, _ = forward_decode(patched, args)
    torch.cuda.synchronize()
    assert torch.equal(want.view(torch.int16), got.view(torch.int16))


@pytest.mark.filterwarnings("ignore:.*Profiler clears events")
@pytest.mark.parametrize(("batch", "ctx", "twin_or_code"), [
    (20, 3300, "stock"),   # bucket 24: 640 long CTAs, one wave of stock's, two of the bound's
    (24, 8000, "stock"),   # bucket 24 full: two waves either way, but 17-23 long rows lose one
    (16, 3300, "4x2"),     # v2 (512 heads x rows): 4x2 holds 8 heads per SM, never a wave more
])
def test_vllm_graph_call_runs_no_variant_that_long_rows_could_slow(
        stock_and_patched, batch: int, ctx: int, twin_or_code: str) -> None:
    """Llama-3.1-8B's decode as vLLM 0.10.2 replays it (bench/vllm_call.py: the batch padded to
    its bucket with length-1 rows, max_seq_len = the capture length 8192): where some number of
    long rows would give the bounded kernel or a twin a wave more than stock's code, the
    captured launch runs stock's unbounded copy and no twin (the batches that lost a whole
    step, 0.906-0.958x, before the wave guard); v2 keeps a twin that cannot lose a wave. The
    output is bitwise stock's."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from kvprefetch.bench.vllm_call import VllmCall, launch_for
    from kvprefetch.kernels import policy
    from kvprefetch.kernels.kvinputs import AttnShape, make_inputs
    from kvprefetch.kernels.ops import forward_decode

    stock, patched = stock_and_patched
    launch = launch_for([ctx] * batch, num_heads=32, block_size=16,
                        call=VllmCall(max_num_seqs=256), timing="graph")
    assert launch.max_seq_len == 8192 and launch.pad_rows == launch.num_seqs - batch
    shape = AttnShape(num_seqs=launch.num_seqs, num_heads=32, num_kv_heads=8, head_size=128,
                      block_size=16, max_seq_len=launch.max_seq_len, dtype="float16",
                      kv_cache_dtype="auto")
    args = make_inputs(shape, seq_lens=launch.seq_lens, pad_rows=launch.pad_rows).args()
    names = {}
    for ops in (stock, patched):
        forward_decode(ops, args)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out, kernel = forward_decode(ops, args)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            g.replay()
            torch.cuda.synchronize()
        names[ops.name] = ([e.name for e in prof.events() if e.device_type.name == "CUDA"],
                           out.clone(), kernel)
    got, out, kernel = names[patched.name]
    assert kernel == launch.kernel
    if twin_or_code == "stock":
        assert launch.kernel == "v1" and not _twins_ran(got), got
        assert any(UNBOUNDED_KERNEL in n for n in got), got
        if torch.cuda.get_device_properties(0).multi_processor_count == 132:
            assert policy.twin_pick(32, 8, launch.num_seqs, 8192, "v1") is None
            assert policy.stock_v1_wins(32, launch.num_seqs, 132, 4, 5)
    else:
        assert launch.kernel == "v2" and _twins_ran(got) == [twin_or_code], got
    want = names[stock.name][1]
    assert torch.equal(want.view(torch.int16), out.view(torch.int16))
