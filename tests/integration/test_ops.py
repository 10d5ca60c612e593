"""kvprefetch.kernels.ops against vLLM 0.10.2's own sources (the unpacked sdist): the v1/v2 rule
and the op schemas are vLLM's. The rest of ops is in tests/unit/test_ops.py."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

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
