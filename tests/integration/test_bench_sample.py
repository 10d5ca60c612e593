"""The sampled benchmark's ragged steps reaching the kernel's inputs: bench/kernel.py's per-shape
procedure on the CPU with recording ops, in torch tensors (the block tables, lengths and KV pool a
kernel would receive, padded as vLLM's captured launch pads them). Moved from
tests/unit/test_bench_sample.py, which keeps the draw, the report and the CLI (the unit layer has
no torch). No GPU, no wall-clock dependence."""

from __future__ import annotations

import math

import pytest

from kvprefetch.bench import kernel as k
from kvprefetch.bench.matrix import BenchShape
from kvprefetch.bench.vllm_call import EXACT, VllmCall
from kvprefetch.kernels.kvinputs import AttnShape
from kvprefetch.kernels.ops import PagedOps, choose_kernel


def _recording_ops(name: str, calls: list[dict]) -> PagedOps:
    """Stand-in ops that record what the kernel would receive and write zeros."""

    def v1(out, q, kc, vc, num_kv_heads, scale, block_tables, seq_lens, block_size,
           max_seq_len, *rest):
        calls.append({"kernel": "v1", "tables": block_tables.clone(), "lens": seq_lens.clone(),
                      "max_seq_len": max_seq_len, "key_cache": kc})
        out.zero_()

    def v2(out, exp_sums, max_logits, tmp_out, q, kc, vc, num_kv_heads, scale, block_tables,
           seq_lens, block_size, max_seq_len, *rest):
        calls.append({"kernel": "v2", "tables": block_tables.clone(), "lens": seq_lens.clone(),
                      "max_seq_len": max_seq_len, "key_cache": kc})
        out.zero_()

    return PagedOps(name=name, namespace=name, v1=v1, v2=v2)


@pytest.mark.parametrize("timing", ["graph", "eager"])
@pytest.mark.parametrize("lens", [(5, 40, 17), (600, 3)])
def test_ragged_lengths_reach_the_kernel_inputs_under_the_exact_call(lens: tuple[int, ...],
                                                                     timing: str) -> None:
    attn = AttnShape(num_seqs=len(lens), num_heads=8, num_kv_heads=2, head_size=64,
                     block_size=16, max_seq_len=max(lens))
    kernel = choose_kernel(max(lens), len(lens), 8)
    assert kernel == ("v1" if max(lens) <= 512 else "v2")
    shape = BenchShape("G4/kv2/d64", attn, kernel, seq_lens=lens, family="ragged")
    calls: list[dict] = []
    ops = [_recording_ops("baseline", calls), _recording_ops("patched", calls)]
    cfg = k.KernelBenchConfig(mode="hot", rounds=3, target_sample_ms=0.0, min_launches=1,
                              timing=timing, call=EXACT)
    r = k.bench_shape(ops, shape, cfg, l2_bytes=2**20, copy_bw=1e12, device="cpu")
    assert r.status == "measured" and r.bitwise_equal is True and r.timing == timing
    blocks = [math.ceil(n / 16) for n in lens]
    chunk = 64 * 16 * 2
    assert r.plan is not None and r.plan.bytes_per_layer == 2 * sum(blocks) * 2 * chunk
    assert r.bytes_moved == 2 * sum(blocks) * 2 * chunk + 2 * len(lens) * 8 * 64 * 2
    assert r.to_dict()["kv_bytes"] == 2 * sum(blocks) * 2 * chunk
    assert r.to_dict()["seq_lens"] == list(lens)
    assert calls and all(c["kernel"] == kernel for c in calls)
    c = calls[0]
    assert c["lens"].tolist() == list(lens) and c["max_seq_len"] == max(lens)
    table = c["tables"]
    assert tuple(table.shape) == (len(lens), math.ceil(max(lens) / 16))
    used = []
    for i, nb in enumerate(blocks):
        row = table[i].tolist()
        assert all(x == 0 for x in row[nb:])      # padding past the sequence's blocks
        used += row[:nb]
    # every block a sequence reads is its own, and the pool holds exactly the blocks needed
    assert sorted(used) == list(range(sum(blocks)))
    assert c["key_cache"].shape[0] == sum(blocks)


@pytest.mark.parametrize("mml", [None, 4096])
def test_a_graph_step_gets_vllms_captured_launch(mml: int | None) -> None:
    """Under the vLLM call a graph-timed step of 3 sequences is launched as vLLM replays it:
    padded to its bucket 4 with a length-1 row whose block-table row is zeros (block 0, a real
    block of the pool), at the capture length min(8192, max_model_len) with a block table that
    wide; the v2 workspace and bytes follow the launch, the KV bytes the real rows plus one
    block for the pad row; the row records the step's real batch beside its launch."""
    lens = (5, 40, 17)
    attn = AttnShape(num_seqs=3, num_heads=8, num_kv_heads=2, head_size=64, block_size=16,
                     max_seq_len=40)
    shape = BenchShape("G4/kv2/d64", attn, choose_kernel(40, 3, 8), seq_lens=lens,
                       family="ragged", max_model_len=mml)
    calls: list[dict] = []
    ops = [_recording_ops("baseline", calls), _recording_ops("patched", calls)]
    cfg = k.KernelBenchConfig(mode="hot", rounds=3, target_sample_ms=0.0, min_launches=1,
                              call=VllmCall())
    r = k.bench_shape(ops, shape, cfg, l2_bytes=2**20, copy_bw=1e12, device="cpu")
    capture = 8192 if mml is None else 4096
    assert r.status == "measured" and r.bitwise_equal is True and r.timing == "graph"
    c = calls[0]
    assert c["lens"].tolist() == [5, 40, 17, 1] and c["max_seq_len"] == capture
    assert c["kernel"] == choose_kernel(capture, 4, 8) == "v2"
    assert tuple(c["tables"].shape) == (4, capture // 16)
    assert c["tables"][3].tolist() == [0] * (capture // 16)
    assert c["key_cache"].shape[0] == 1 + 3 + 2  # the real rows' blocks only
    chunk = 64 * 16 * 2
    row = r.to_dict()
    assert row["kv_bytes"] == 2 * (1 + 3 + 2 + 1) * 2 * chunk
    assert row["batch"] == 3 and row["context"] == 40 and row["kernel"] == "v2"
    assert row["launch"]["num_seqs"] == 4 and row["launch"]["real_batch"] == 3
    assert row["launch"]["max_seq_len"] == capture and row["launch"]["timing"] == "graph"
    assert row["launch"]["table_width"] == capture // 16


def test_a_step_vllm_runs_eagerly_is_timed_eagerly_once() -> None:
    """A step longer than the capture length is eager in vLLM: asked for graph timing it is
    timed eagerly at its real values and recorded so."""
    attn = AttnShape(num_seqs=2, num_heads=8, num_kv_heads=2, head_size=64, block_size=16,
                     max_seq_len=9000)
    shape = BenchShape("G4/kv2/d64", attn, "v2", seq_lens=(9000, 3), family="ragged")
    calls: list[dict] = []
    ops = [_recording_ops("baseline", calls), _recording_ops("patched", calls)]
    graph = k.KernelBenchConfig(mode="hot", rounds=3, target_sample_ms=0.0, min_launches=1)
    r = k.bench_shape(ops, shape, graph, l2_bytes=2**20, copy_bw=1e12, device="cpu")
    assert r.timing == "eager" and r.launch is not None and not r.launch.graph
    assert "9000 > capture length 8192" in r.launch.eager_reason
    assert calls[0]["lens"].tolist() == [9000, 3] and calls[0]["max_seq_len"] == 9000
    # asked for graph and eager it runs once: tests/unit/test_bench_sample.py's
    # test_a_step_vllm_runs_eagerly_is_timed_once_under_graph_and_eager


def test_uniform_shapes_keep_their_old_inputs() -> None:
    """A matrix shape (no seq_lens) still gives every sequence max_seq_len."""
    attn = AttnShape(num_seqs=2, num_heads=8, num_kv_heads=2, head_size=64, block_size=16,
                     max_seq_len=100)
    calls: list[dict] = []
    ops = [_recording_ops("baseline", calls), _recording_ops("patched", calls)]
    k.bench_shape(ops, BenchShape("x", attn, "v1"), k.KernelBenchConfig(
        mode="hot", rounds=3, target_sample_ms=0.0, min_launches=1), 2**20, 1e12, device="cpu")
    assert calls[0]["lens"].tolist() == [100, 100]

