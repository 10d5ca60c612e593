"""``bench decode``'s pure parts: the scheduler, block allocator, padding and bucket rules, the
length distributions and the model configs on their real code paths. Its torch parts (the step
inputs, the KV write, a tiny model's decode step through in-process reference ops, the timing
loop on the CPU) are in tests/integration/test_bench_decode.py: the unit layer has no torch.
The timed GPU path runs on the H200 (tests/gpu/test_bench_decode_gpu.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvprefetch.bench import decode_model as dm
from kvprefetch.bench import decode_serve as ds
from kvprefetch.bench.decode import (
    DecodeBenchConfig,
    Workload,
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
        for n, table, slot, pos in zip(s.seq_lens, s.block_tables, s.slots, s.positions,
                                       strict=True):
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
    # the inputs each mode builds (torch tensors) are checked in
    # tests/integration/test_bench_decode.py::test_step_inputs_pad_graph_steps_as_vllm_captures


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
