"""kvprefetch.kernels.ops against vLLM 0.10.2's own sources (the unpacked sdist): the v1/v2 rule
and the op schemas are vLLM's. Then ops through torch: the schema check on ops registered
in-process and forward_decode. No GPU here, so the compiled ops are stood in for by ops registered
in-process with vLLM's exact schemas (``reference.register_reference_ops`` or a recording
implementation); everything between ``torch.ops.<ns>`` and the caller is the real code. The rest
of ops (manifests, the rule, the refusals before torch) is in tests/unit/test_ops.py, which has
no torch."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from kvprefetch.errors import BenchError
from kvprefetch.kernels import ops


def test_choose_kernel_agrees_with_vllm_source_expression(vllm_tree: Path) -> None:
    """Evaluate vLLM's own ``use_v1 = (...)`` expression (from the real 0.10.2 sdist) over a
    grid and compare."""
    src = (vllm_tree / "vllm/attention/ops/paged_attn.py").read_text()
    part = int(re.search(r"^_PARTITION_SIZE = (\d+)", src, re.MULTILINE).group(1))
    expr = re.search(r"use_v1 = (\(.*?\))\n", src, re.DOTALL).group(1)
    assert part == ops.PARTITION_SIZE
    for max_seq_len, num_seqs, num_heads in itertools.product(
            (1, 511, 512, 513, 1024, 1025, 4096, 8191, 8192, 8193, 16384, 32768),
            (1, 2, 8, 15, 16, 17, 64, 128, 256), (1, 8, 32, 64)):
        max_num_partitions = (max_seq_len + part - 1) // part
        use_v1 = eval(expr, {}, {"max_seq_len": max_seq_len, "max_num_partitions":
                                 max_num_partitions, "num_seqs": num_seqs, "num_heads": num_heads})
        assert ops.choose_kernel(max_seq_len, num_seqs, num_heads) == ("v1" if use_v1 else "v2")


def test_schemas_are_vllms(vllm_tree: Path) -> None:
    src = (vllm_tree / "csrc/torch_bindings.cpp").read_text()
    for name, expected in (("paged_attention_v1", ops.V1_SCHEMA_ARGS),
                           ("paged_attention_v2", ops.V2_SCHEMA_ARGS)):
        m = re.search(r'ops\.def\(\s*"' + name + r'\((.*?)\) -> \(\)"\);', src, re.DOTALL)
        text = "".join(re.findall(r'"(.*?)"', '"' + m.group(1) + '"'))
        schema = f"{name}({text}) -> ()"
        assert ops.schema_mismatch(schema, expected) is None


# ----------------------------------------------------- through torch (moved from tests/unit)

def test_ops_from_namespace_checks_schema() -> None:
    import torch

    lib = torch.library.Library("kvp_test_badschema", "DEF")
    lib.define("paged_attention_v1(Tensor! out, Tensor query) -> ()")
    lib.define(ops.V2_SCHEMA)
    with pytest.raises(BenchError, match=r"does not have vLLM 0\.10\.2's schema"):
        ops.ops_from_namespace("kvp_test_badschema")
    with pytest.raises(BenchError, match="has no paged_attention_v1"):
        ops.ops_from_namespace("kvp_test_nothing_registered")


class _Recorder:
    """A stand-in kernel (no GPU here) that records what vLLM's calling code passed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    def register(self, namespace: str):
        import torch

        lib = torch.library.Library(namespace, "DEF")
        lib.define(ops.V1_SCHEMA)
        lib.define(ops.V2_SCHEMA)

        def v1(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens,
               block_size, max_seq_len, alibi, kv_dtype, k_scale, v_scale, *rest):
            self.calls.append(("v1", {"block_size": block_size, "max_seq_len": max_seq_len,
                                      "rest": rest}))
            out.fill_(1.0)

        def v2(out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads,
               scale, block_tables, seq_lens, block_size, max_seq_len, alibi, kv_dtype, k_scale,
               v_scale, *rest):
            self.calls.append(("v2", {"exp_sums": tuple(exp_sums.shape),
                                      "exp_dtype": exp_sums.dtype, "tmp": tuple(tmp_out.shape),
                                      "tmp_dtype": tmp_out.dtype, "rest": rest}))
            out.fill_(2.0)

        lib.impl("paged_attention_v1", v1, "CPU")
        lib.impl("paged_attention_v2", v2, "CPU")
        return lib


def test_forward_decode_mirrors_vllm_dispatch_and_v2_workspace() -> None:
    import torch

    from kvprefetch.kernels.kvinputs import AttnShape, make_inputs

    rec = _Recorder()
    _lib = rec.register("kvp_test_recorder")
    p = ops.ops_from_namespace("kvp_test_recorder", name="rec")
    shape = AttnShape(num_seqs=2, num_heads=8, num_kv_heads=2, head_size=64, block_size=16,
                      max_seq_len=1500, dtype="bfloat16")
    inputs = make_inputs(shape, device="cpu", seed=1)
    out, kernel = ops.forward_decode(p, inputs.args())
    assert kernel == "v2" and bool((out == 2.0).all())
    name, seen = rec.calls[-1]
    assert name == "v2"
    assert seen["exp_sums"] == (2, 8, 3) and seen["exp_dtype"] == torch.float32
    assert seen["tmp"] == (2, 8, 3, 64) and seen["tmp_dtype"] == torch.bfloat16
    assert seen["rest"] == (0, 0, 0, 64, 0)  # tp_rank and block-sparse args as vLLM passes them
    out, kernel = ops.forward_decode(p, inputs.args(), force="v1")
    assert kernel == "v1" and rec.calls[-1][1]["block_size"] == 16
    assert rec.calls[-1][1]["max_seq_len"] == 1500
    with pytest.raises(BenchError):
        ops.forward_decode(p, inputs.args(), force="v3")


def test_forward_decode_with_reference_ops_matches_reference() -> None:
    import torch

    from kvprefetch.kernels.kvinputs import AttnShape, make_inputs
    from kvprefetch.verify.reference import reference_decode, register_reference_ops

    _lib = register_reference_ops("kvp_test_reference_fd")
    p = ops.ops_from_namespace("kvp_test_reference_fd")
    shape = AttnShape(num_seqs=3, num_heads=4, num_kv_heads=4, head_size=64, block_size=32,
                      max_seq_len=700, dtype="float32")
    inputs = make_inputs(shape, device="cpu", seed=3, ragged=True)
    ref = reference_decode(inputs.args())
    for force in ("v1", "v2"):
        out, _ = ops.forward_decode(p, inputs.args(), force=force)
        assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-6)

