"""kvprefetch.bench.matrix: presets, the default matrix of issue 5/6, and option parsing."""

from __future__ import annotations

import pytest

from kvprefetch.bench import matrix as m
from kvprefetch.errors import ConfigError
from kvprefetch.kernels.ops import choose_kernel

VLLM_HEAD_SIZES = {32, 64, 80, 96, 112, 120, 128, 192, 256}  # paged_attn.py L44-45


def test_presets_are_real_attention_shapes_vllm_instantiates() -> None:
    assert {"llama-3.1-8b", "llama-2-7b", "gemma-2b", "tinyllama-1.1b"} <= set(m.PRESETS)
    llama = m.PRESETS["llama-3.1-8b"]
    assert (llama.num_heads, llama.num_kv_heads, llama.head_size) == (32, 8, 128)
    assert m.PRESETS["llama-2-7b"].num_kv_heads == m.PRESETS["llama-2-7b"].num_heads  # MHA
    assert {p.head_size for p in m.PRESETS.values()} >= {64, 128, 256}
    for p in m.PRESETS.values():
        assert p.head_size in VLLM_HEAD_SIZES
        assert p.num_heads % p.num_kv_heads == 0
        assert "config.json" in p.source


def test_default_matrix_is_the_issue_matrix() -> None:
    shapes = m.BenchMatrix().shapes()
    assert len(shapes) == 25
    assert {s.attn.num_seqs for s in shapes} == {1, 8, 32, 64, 128}
    assert {s.attn.max_seq_len for s in shapes} == {512, 1024, 4096, 16384, 32768}
    assert {(s.preset, s.attn.block_size, s.attn.dtype, s.attn.kv_cache_dtype) for s in shapes} \
        == {("llama-3.1-8b", 16, "float16", "auto")}
    for s in shapes:
        assert s.kernel == choose_kernel(s.attn.max_seq_len, s.attn.num_seqs, 32)
        assert not s.forced
    assert {s.kernel for s in shapes} == {"v1", "v2"}


def test_force_and_cross_product() -> None:
    mx = m.build_matrix(presets=["llama-2-7b,gemma-2b"], batches=["1", "8"], contexts=["1k,32k"],
                        block_sizes=["16,32"], dtypes=["bf16"], kv_cache_dtypes=["auto,fp8"],
                        force="v2")
    shapes = mx.shapes()
    assert len(shapes) == 2 * 2 * 2 * 2 * 1 * 2
    assert all(s.kernel == "v2" and s.forced for s in shapes)
    assert {s.attn.dtype for s in shapes} == {"bfloat16"}
    assert shapes[0].preset == "llama-2-7b"
    assert mx.to_dict()["contexts"] == [1024, 32768]


@pytest.mark.parametrize(("text", "n"),
                         [("512", 512), ("1k", 1024), ("32K", 32768), (" 4k ", 4096),
                          ("2147483647", 2**31 - 1)])
def test_parse_size(text: str, n: int) -> None:
    assert m.parse_size(text) == n


@pytest.mark.parametrize("bad", ["", "1m", "k", "-1", "0", "1.5k", "2147483648", "2097152k",
                                 "99999999999999999999k"])
def test_parse_size_rejects(bad: str) -> None:
    with pytest.raises(ConfigError):
        m.parse_size(bad)


def test_parse_sizes_keeps_order_and_dedups() -> None:
    assert m.parse_sizes(["8,1", "1", "128"]) == (8, 1, 128)
    assert m.format_size(16384) == "16k" and m.format_size(1000) == "1000"


@pytest.mark.parametrize("kwargs", [
    {"presets": ("gpt-5",)}, {"block_sizes": (64,)}, {"dtypes": ("int8",)},
    {"kv_cache_dtypes": ("int4",)}, {"force": "v3"}, {"batches": ()},
])
def test_matrix_validation(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        m.BenchMatrix(**kwargs)


def test_shapes_from_specs() -> None:
    shapes = m.shapes_from_specs(["1x4k", "64x1k"], preset="llama-3.1-8b")
    assert [(s.attn.num_seqs, s.attn.max_seq_len, s.kernel) for s in shapes] == [
        (1, 4096, choose_kernel(4096, 1, 32)), (64, 1024, choose_kernel(1024, 64, 32))]
    assert "ctx4k" in shapes[0].label
    with pytest.raises(ConfigError):
        m.parse_shape_spec("4k")


def test_named_matrix_issue6() -> None:
    mx = m.build_matrix(matrix="issue6")
    shapes = mx.shapes()
    assert len(shapes) == 20
    assert {s.attn.num_seqs for s in shapes} == {1, 8, 32, 64, 128}
    assert {s.attn.max_seq_len for s in shapes} == {512, 1024, 4096, 16384}
    assert mx.to_dict()["name"] == "issue6"
    assert m.build_matrix().to_dict()["name"] == "default"


def test_default_matrix_has_long_v1_steps() -> None:
    """The default matrix is the 5 x 5 grid plus v1 steps of long context (issue 31): batch
    16-256 at 6k and 8k, each point once; vLLM runs v1 there from batch 32 on (32 query heads),
    v2 at batch 16."""
    mx = m.build_matrix()
    shapes = mx.shapes()
    points = [(s.attn.num_seqs, s.attn.max_seq_len) for s in shapes]
    assert len(points) == len(set(points))
    assert set(points) == ({(b, c) for b in m.DEFAULT_BATCHES for c in m.DEFAULT_CONTEXTS}
                           | {(b, c) for b in (16, 32, 64, 96, 128, 256) for c in (6144, 8192)})
    kernels = {(s.attn.num_seqs, s.attn.max_seq_len): s.kernel for s in shapes}
    assert {kernels[(b, 8192)] for b in (32, 64, 96, 128, 256)} == {"v1"}
    assert kernels[(16, 8192)] == "v2"
    assert mx.to_dict()["extra_grids"] == [[[16, 32, 64, 96, 128, 256], [6144, 8192]]]
    # overriding an axis replaces the named union with one grid
    assert len(m.build_matrix(batches=["1"]).shapes()) == len(m.DEFAULT_CONTEXTS)


def test_issue31_matrix_is_the_issues_rows() -> None:
    points = [(s.attn.num_seqs, s.attn.max_seq_len, s.kernel)
              for s in m.build_matrix(matrix="issue31").shapes()]
    assert sorted(points) == sorted([(64, 2048, "v1"), (64, 4096, "v1"), (64, 6000, "v1"),
                                     (32, 8192, "v1"), (64, 8192, "v1"), (96, 8000, "v1"),
                                     (128, 8192, "v1")])


def test_named_matrix_axes_can_be_overridden() -> None:
    mx = m.build_matrix(contexts=["1k"], matrix="issue6")
    assert mx.contexts == (1024,) and mx.batches == (1, 8, 32, 64, 128)
    assert mx.name == "issue6+"
    with pytest.raises(ConfigError, match="unknown matrix"):
        m.build_matrix(matrix="issue7")
    assert "issue6: batch 1,8,32,64,128 x context 512,1k,4k,16k" in m.describe_named_matrices()
