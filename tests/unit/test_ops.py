"""kvprefetch.kernels.ops without torch: manifests on disk, the schema parser, vLLM's v1/v2 rule
(checked against vLLM's own sources in tests/integration/test_ops.py) and the refusals that come
before a library is loaded. The schema check on registered ops and forward_decode go through
torch and are in tests/integration/test_ops.py (the unit layer has no torch)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvprefetch.errors import BenchError
from kvprefetch.kernels import ops


@pytest.mark.parametrize(
    ("max_seq_len", "num_seqs", "num_heads", "expected"),
    [
        (512, 1, 32, "v1"),      # one partition
        (513, 1, 32, "v2"),      # two partitions, little parallel work
        (513, 16, 32, "v2"),     # 16*32 = 512 is not > 512
        (513, 17, 32, "v1"),     # 17*32 = 544 > 512
        (8192, 128, 32, "v1"),   # at the v1 limit with lots of work
        (8193, 128, 32, "v2"),   # over 8192: always v2
        (8193, 1, 1, "v2"),
        (1, 1, 1, "v1"),
    ],
)
def test_choose_kernel_matches_vllm_rule(max_seq_len: int, num_seqs: int, num_heads: int,
                                         expected: str) -> None:
    assert ops.choose_kernel(max_seq_len, num_seqs, num_heads) == expected


def test_parse_schema_args_normalises_torch_alias_annotations() -> None:
    printed = "ns::op(Tensor(a!) out, Tensor($0! -> ) tmp, Tensor? x, str s, int n) -> ()"
    assert ops.parse_schema_args(printed) == [("Tensor!", "out"), ("Tensor!", "tmp"),
                                              ("Tensor?", "x"), ("str", "s"), ("int", "n")]
    assert ops.schema_mismatch(printed, [("Tensor!", "out")]) == "expected 1 arguments, found 5"
    assert ops.schema_mismatch(printed, ops.V1_SCHEMA_ARGS) == (
        "argument 1: expected 'Tensor query', found 'Tensor! tmp'")


def _manifest(root: Path, tree: str, key: str, *, so: bool = True, **extra: object) -> Path:
    d = root / "build" / tree / key
    d.mkdir(parents=True)
    so_name = f"kvprefetch_{tree}_C.so"
    if so:
        (d / so_name).write_bytes(b"not really a shared library " + tree.encode())
    data = {"tree": tree, "variant": "prefetch" if tree == "patched" else tree,
            "namespace": f"kvprefetch_{tree}", "so_path": so_name, "so_sha256": "0" * 64,
            "head_sizes": [64, 128, 256], "block_sizes": [16, 32],
            "kv_dtypes": ["fp16", "bf16", "fp8"]}
    data.update(extra)
    (d / "manifest.json").write_text(json.dumps(data))
    return d / "manifest.json"


def test_find_builds_orders_trees_and_takes_newest(tmp_path: Path) -> None:
    old = _manifest(tmp_path, "patched", "aaa")
    new = _manifest(tmp_path, "patched", "bbb")
    os.utime(old, (1_000_000, 1_000_000))
    _manifest(tmp_path, "seed", "ccc")
    _manifest(tmp_path, "baseline", "ddd")
    _manifest(tmp_path, "extra", "eee", so=False)           # library missing: skipped
    full = tmp_path / "build" / "full" / "fff"
    full.mkdir(parents=True)
    (full / "manifest.json").write_text(json.dumps({"tree": "full", "so_sha256": {}}))
    builds = ops.find_builds(tmp_path)
    assert [b.tree for b in builds] == ["baseline", "patched", "seed"]
    assert builds[1].manifest_path == new
    assert builds[1].so_path == new.parent / "kvprefetch_patched_C.so"
    assert [b.tree for b in ops.find_builds(tmp_path, ["seed", "baseline"])] == ["baseline", "seed"]
    assert ops.find_builds(tmp_path / "nowhere") == []


def test_manifest_supports_reads_the_build_selection_vocabulary(tmp_path: Path) -> None:
    # kvprefetch.kernels.selection: fp16/bf16/fp32 = that query dtype with an auto cache; fp8 =
    # an fp8 cache for each selected query dtype (fp16 and bf16 when none is selected).
    b = ops.read_manifest(_manifest(tmp_path, "baseline", "k", kv_dtypes=["fp16", "fp8"]))
    assert b.supports(128, 16, "auto", "float16")
    assert b.supports(128, 16, "fp8", "float16") and b.supports(128, 16, "fp8_e4m3")
    assert not b.supports(128, 16, "auto", "bfloat16")
    assert not b.supports(128, 16, "fp8", "bfloat16")
    assert not b.supports(128, 16, "fp8_e5m2")
    assert not b.supports(96, 16, "fp8") and not b.supports(128, 8, "fp8")
    only_fp8 = ops.compiled_combos(["fp8_e4m3"])
    assert only_fp8 == {("float16", "fp8_e4m3"), ("bfloat16", "fp8_e4m3")}
    full = ops.compiled_combos(["fp16", "bf16", "fp32", "fp8", "fp8_e5m2"])
    assert len(full) == 9  # vLLM's 9 (query, cache) pairs


def test_read_manifest_reports_missing_keys(tmp_path: Path) -> None:
    p = tmp_path / "manifest.json"
    p.write_text(json.dumps({"tree": "baseline"}))
    with pytest.raises(BenchError, match="lacks variant, namespace"):
        ops.read_manifest(p)


def test_load_build_refuses_a_library_whose_hash_changed(tmp_path: Path) -> None:
    b = ops.read_manifest(_manifest(tmp_path, "baseline", "k"))
    with pytest.raises(BenchError, match="manifest says"):
        ops.load_build(b)


def test_load_library_missing_file(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="does not exist"):
        ops.load_library(tmp_path / "nope.so", "kvprefetch_nope")
