"""``bench decode`` on the CPU: the scheduler, block allocator, padding and bucket rules, the
length distributions and the model configs on their real code paths, and a tiny model's decode
step end to end through paged-attention ops registered in-process with vLLM's exact schemas
(``kvprefetch.verify.reference``: a float64 reference in place of a compiled kernel, which cannot run
here). The timed GPU path runs on the H200 (tests/gpu/test_bench_decode_gpu.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvprefetch.bench import decode_model as dm
from kvprefetch.bench import decode_serve as ds
from kvprefetch.bench.decode import (
    DecodeBenchConfig,
    StepInputs,
    Workload,
    kernel_choices,
    plan_steps,
    step_mode,
)
from kvprefetch.bench.vllm_call import VllmCall
from kvprefetch.errors import ConfigError


def test_the_trace_is_captured_up_to_its_largest_batch() -> None:
    """bench decode's buckets are vLLM's with max_num_seqs = the trace's largest batch, its
    capture length min(max_seq_len_to_capture, max_model_len)."""
    call = DecodeBenchConfig(max_model_len=4096).call(20)
    assert call.buckets == (1, 2, 4, 8, 16, 24) and call.capture_len == 4096
    assert DecodeBenchConfig(eager=True).call(8).enforce_eager


def test_length_distributions_are_seeded_and_bounded() -> None:
    for kind in ds.DISTRIBUTIONS:
        d = ds.LengthDist(kind, prompt=1000, output=100, max_len=8192, seed=3)
        a, b = d.sample(400), d.sample(400)
        assert a == b
        assert all(p >= 1 and o >= 1 and p + o <= 8192 for p, o in a)
    assert set(ds.LengthDist("fixed", 1000, 100).sample(5)) == {(1000, 100)}
    tail = [p for p, _ in ds.LengthDist("longtail", 500, 100, 32768, seed=1).sample(2000)]
    assert max(tail) > 10 * sorted(tail)[len(tail) // 2]  # a few are 10-100x longer
    assert ds.LengthDist("uniform", 1000, 100, seed=1).sample(5) != \
        ds.LengthDist("uniform", 1000, 100, seed=2).sample(5)
    with pytest.raises(ConfigError, match="unknown length distribution"):
        ds.LengthDist("zipf")
    with pytest.raises(ConfigError, match="model length"):
        ds.LengthDist("fixed", 8000, 500, max_len=8192)


def test_allocator_never_hands_out_the_scratch_block() -> None:
    a = ds.BlockAllocator(5, 16)
    got = a.allocate(4)
    assert sorted(got) == [0, 1, 2, 3] and a.scratch == 4 and a.free == 0
    with pytest.raises(ConfigError, match="1 KV blocks wanted, 0 free"):
        a.allocate(1)
    a.release(got[:2])
    assert a.free == 2


def test_scheduler_runs_continuous_batching() -> None:
    """At most max_batch requests run; finished ones leave and waiting ones take their slots;
    every step's slot is inside the sequence's own blocks at its last position; blocks come back
    to the pool; every request produces exactly its output length."""
    lengths = [(20, 3), (5, 1), (40, 2), (16, 4), (1, 1)]
    alloc = ds.BlockAllocator(ds.blocks_needed(lengths, 2, 16), 16)
    steps = list(ds.Scheduler(lengths, 2, alloc).steps())
    assert all(s.batch <= 2 for s in steps)
    assert sum(s.batch for s in steps) == sum(o for _, o in lengths)
    assert steps[0].seq_lens == (21, 6) and steps[1].seq_lens == (22, 41)  # 1 left, 2 joined
    for s in steps:
        for n, table, slot, pos in zip(s.seq_lens, s.block_tables, s.slots, s.positions):
            assert pos == n - 1 and len(table) == -(-n // 16)
            assert slot == table[pos // 16] * 16 + pos % 16
            assert alloc.scratch not in table
        flat = [b for t in s.block_tables for b in t]
        assert len(flat) == len(set(flat))  # no block shared by two running sequences
    assert alloc.free == alloc.scratch  # everything returned


def test_fixed_point_is_one_batch_of_equal_steps() -> None:
    steps, blocks = plan_steps(Workload(batch=4, context=1024, steps=3), 16)
    assert [s.seq_lens for s in steps] == [(1024,) * 4, (1025,) * 4, (1026,) * 4]
    assert blocks == 4 * (-(-(1023 + 3) // 16)) + 1


def test_graph_or_eager_as_vllm_decides() -> None:
    """A step replays its bucket's graph unless --eager, no bucket holds it, or one sequence is
    longer than max_seq_len_to_capture; graphs launch the kernel vLLM's rule picks for that
    length (captured with it), eager steps the one for their real maximum."""
    call = VllmCall(max_num_seqs=16, max_model_len=32768)
    short = ds.Step((100, 9000), ((0,), (1,)), (0, 16), (99, 8999))
    assert step_mode(short, call) is None  # 9000 > 8192: eager
    ok = ds.Step((100, 800, 8), ((0,),) * 3, (0, 1, 2), (99, 799, 7))
    assert step_mode(ok, call) == 4
    assert step_mode(ok, VllmCall(max_num_seqs=16, enforce_eager=True)) is None
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


def test_presets_and_hf_configs() -> None:
    llama = dm.PRESETS["llama-3.1-8b"]
    assert (llama.num_heads, llama.num_kv_heads, llama.head_dim, llama.layers) == (32, 8, 128, 32)
    qwen = dm.PRESETS["qwen2.5-7b"]
    assert (qwen.num_heads, qwen.num_kv_heads, qwen.head_dim, qwen.qkv_bias) == (28, 4, 128, True)
    tp8 = dm.PRESETS["llama-3-70b-tp8"]
    assert (tp8.num_heads, tp8.num_kv_heads, tp8.hidden, tp8.intermediate, tp8.tp) == (
        8, 1, 8192, 3584, 8)
    assert 15e9 < llama.weight_bytes() < 17e9  # an 8B model in 16-bit
    assert dm.preset("llama-3.1-8b", layers=2).layers == 2
    with pytest.raises(ConfigError, match="unknown decode preset"):
        dm.preset("gpt-2")
    with pytest.raises(ConfigError, match="tensor-parallel 3"):
        dm.from_hf_config({"num_attention_heads": 32, "hidden_size": 4096,
                           "intermediate_size": 14336, "num_hidden_layers": 2,
                           "vocab_size": 1000}, tp=3)


def test_config_json_is_read(tmp_path: Path) -> None:
    d = tmp_path / "mistral-7b"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "num_hidden_layers": 32,
        "vocab_size": 32000, "rope_theta": 1e6, "torch_dtype": "bfloat16"}))
    c = dm.load_config(d / "config.json", layers=4)
    assert (c.name, c.layers, c.vocab, c.dtype, c.qkv_bias) == ("mistral-7b", 4, 32000,
                                                                "bfloat16", False)
    (d / "config.json").write_text(json.dumps({"hidden_size": 1}))
    with pytest.raises(ConfigError, match="lacks or mangles 'num_attention_heads'"):
        dm.load_config(d / "config.json")
    (d / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not a JSON object"):
        dm.load_config(d / "config.json")


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
