"""``bench decode`` on the CPU with torch: the inputs a step is given, the model's K/V write in
vLLM's layout, and a tiny model's decode step end to end through paged-attention ops registered
in-process with vLLM's exact schemas (``kvprefetch.verify.reference``: a float64 reference in
place of a compiled kernel, which cannot run here). Moved from tests/unit/test_bench_decode.py,
which keeps the pure parts (the unit layer has no torch); the timed GPU path runs on the H200
(tests/gpu/test_bench_decode_gpu.py)."""

from __future__ import annotations

import pytest

from kvprefetch.bench import decode_model as dm
from kvprefetch.bench import decode_serve as ds
from kvprefetch.bench.decode import StepInputs, Workload, kernel_choices, plan_steps
from kvprefetch.bench.vllm_call import VllmCall


def test_step_inputs_pad_graph_steps_as_vllm_captures() -> None:
    """A graph step's inputs are padded to its bucket with a length-1 row whose block-table row
    is zeros, at the capture length's table width; an eager step's are its own; the kernel
    each step launches follows (test_graph_or_eager_as_vllm_decides in the unit layer has the
    rule that picks graph or eager)."""
    call = VllmCall(max_num_seqs=16, max_model_len=32768)
    short = ds.Step((100, 9000), ((0,), (1,)), (0, 16), (99, 8999))
    ok = ds.Step((100, 800, 8), ((0,),) * 3, (0, 1, 2), (99, 799, 7))
    inputs = StepInputs([ok, short], call, scratch=9, block_size=16, vocab=50, device="cpu",
                        seed=0)
    tokens, _, slots, seq_lens, tables = inputs.items[0]
    assert tokens.shape == (4,) and seq_lens.tolist() == [100, 800, 8, 1]  # one padded row
    # the captured block table: ceil(8192 / 16) columns, the pad row all zeros (block 0)
    assert tables.shape == (4, 512) and tables[3].tolist() == [0] * 512
    assert slots.tolist()[-1] == 9 * 16
    assert inputs.items[1][0].shape == (2,)  # eager: no padding
    assert inputs.items[1][4].shape == (2, -(-9000 // 16))  # and its own table width
    assert kernel_choices(inputs, 32, 16) == {"v1": 0, "v2": 2}
    assert kernel_choices(inputs, 256, 16) == {"v1": 1, "v2": 1}  # 4 x 256 > 512


TINY = dm.DecoderConfig(name="tiny", hidden=64, num_heads=4, num_kv_heads=2, head_dim=16,
                        intermediate=96, layers=2, vocab=100, qkv_bias=True)


def _reference_ops(namespace: str):
    import torch  # noqa: F401

    from kvprefetch.kernels.ops import ops_from_namespace
    from kvprefetch.verify.reference import _REGISTERED, register_reference_ops

    if namespace not in _REGISTERED:
        register_reference_ops(namespace)
    return ops_from_namespace(namespace, namespace)


def test_kv_write_is_vllms_layout() -> None:
    """The model's K/V write, read back through reference.gather_kv (the reader the identity
    checks use): each token lands at its slot, nothing else changes."""
    import torch

    from kvprefetch.kernels.ops import DecodeArgs
    from kvprefetch.verify.reference import gather_kv

    m = dm.Decoder(TINY, num_blocks=6, block_size=16, device="cpu")
    before = [t.clone() for t in (m.k_caches[1], m.v_caches[1])]
    k = torch.randn(3, 2, 16).to(torch.float16)
    v = torch.randn(3, 2 * 16).to(torch.float16)
    slots = torch.tensor([5, 16 * 3 + 15, 16 * 4 + 0])
    m.write_kv(1, k, v, slots)
    tables = torch.tensor([[0, 1], [2, 3], [4, 0]], dtype=torch.int32)
    args = DecodeArgs(query=None, key_cache=m.k_caches[1], value_cache=m.v_caches[1],
                      block_tables=tables, seq_lens=None, max_seq_len=32, kv_cache_dtype="auto",
                      num_kv_heads=2, scale=1.0, alibi_slopes=None, k_scale=m.one,
                      v_scale=m.one)
    for seq, pos in ((0, 5), (1, 31), (2, 0)):
        gk, gv = gather_kv(args, seq, pos + 1)
        assert torch.equal(gk[pos], k[seq].double())
        assert torch.equal(gv[pos], v[seq].view(2, 16).double())
    changed = (m.k_caches[1] != before[0]).flatten(1).any(1).nonzero().flatten().tolist()
    assert changed == [0, 3, 4]  # only the three slots' blocks


def test_tiny_model_step_through_two_trees_is_equal_and_attends() -> None:
    """A tiny model's decode step through two in-process trees gives the same logits, and the
    logits depend on the cached K/V (attention is really in the step)."""
    import torch

    from kvprefetch.bench.decode import checksum_weights, logits_checksum

    a, b = _reference_ops("kvprefetch_dec_a"), _reference_ops("kvprefetch_dec_b")
    m = dm.Decoder(TINY, num_blocks=8, block_size=16, device="cpu", max_position=64)
    steps, _ = plan_steps(Workload(batch=3, context=20, steps=2), 16)
    inputs = StepInputs(steps, VllmCall(max_num_seqs=3), scratch=7, block_size=16,
                        vocab=TINY.vocab, device="cpu", seed=0)
    w = checksum_weights(TINY.vocab, "cpu")
    out_a = m.step(a, *inputs.items[0], max_seq_len=8192)
    m.fill_cache(0)
    out_b = m.step(b, *inputs.items[0], max_seq_len=8192)
    assert out_a.shape == (4, TINY.vocab) and torch.isfinite(out_a.float()).all()
    assert torch.equal(out_a, out_b)
    assert torch.equal(logits_checksum(out_a[:3], w), logits_checksum(out_b[:3], w))
    m.fill_cache(1)  # other prompt K/V: other logits
    assert not torch.equal(m.step(a, *inputs.items[0], max_seq_len=8192), out_a)
    flipped = out_a.clone()
    flipped.view(torch.int16)[1, 7] ^= 1  # one bit of one logit
    assert not torch.equal(logits_checksum(flipped[:3], w), logits_checksum(out_a[:3], w))


class _HostEvent:
    """Stand-in for torch.cuda.Event on this GPU-less machine (the one thing mocked here): the
    host clock at record()."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.t = 0.0

    def record(self) -> None:
        import time

        self.t = time.perf_counter()

    def elapsed_time(self, end: _HostEvent) -> float:
        return (end.t - self.t) * 1e3


def test_run_workload_eager_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The timing loop, checksums and result document of run_workload, run eagerly on the CPU
    with two in-process trees (CUDA events and synchronize are stood in for: no GPU here), and
    the markdown rendered from it: every tree equal, every token counted, a ratio per tree."""
    import torch

    from kvprefetch.bench.decode import DecodeBenchConfig, run_workload
    from kvprefetch.bench.decode_report import decode_markdown, decode_summary

    monkeypatch.setattr(torch.cuda, "Event", _HostEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    a, b = _reference_ops("kvprefetch_dec_a"), _reference_ops("kvprefetch_dec_b")
    work = Workload(batch=3, requests=5, dist=ds.LengthDist("uniform", 20, 3, 64, seed=1))
    steps, blocks = plan_steps(work, 16)
    m = dm.Decoder(TINY, blocks, 16, device="cpu", max_position=64)
    cfg = DecodeBenchConfig(repeats=2, eager=True, max_model_len=64, profile_steps=1)
    res = run_workload(m, [a, b], work, steps, cfg, progress=lambda s: None)
    assert res["tokens"] == sum(o for _, o in work.lengths()) == sum(s.batch for s in steps)
    assert res["graph_steps"] == 0 and res["kernels"]["v1"] == len(steps)
    tb = res["trees"]["kvprefetch_dec_b"]
    assert tb["bitwise_equal"] is True and tb["ratio"]["n"] == 2 and tb["tokens_per_s"] > 0
    assert res["trees"]["kvprefetch_dec_a"]["ratio"] is None
    doc = {"kind": "decode", "meta": {
        "device": {"name": "cpu"}, "model": TINY.to_dict(), "config": cfg.__dict__,
        "trees": [a.name, b.name], "baseline": a.name, "started": "-"},
        "results": [{**res, "status": "ok"}, {**work.to_dict(), "status": "skipped",
                                               "reason": "needs 9 GiB"}]}
    md = decode_markdown(doc)
    assert "| kvprefetch_dec_b | 1 |" in md and "needs 9 GiB" in md
    assert decode_summary(doc)[0]["bitwise_equal"]
