"""kvprefetch.verify.numerics, the identity check verify-kernel runs on the GPU, run on the CPU.

There is no GPU here, so the "builds" are ops registered in-process with vLLM's schemas and a
CPU implementation (``reference.register_reference_ops``); one of them is deliberately wrong in
each failure test. The check itself (poisoning, bitwise comparison, tolerance, not-checked
handling, report) is the real code, on real torch tensors: moved from
tests/unit/test_bench_identity.py, which keeps the pure parts (the unit layer has no torch). On
the H200 the same check runs on the compiled builds (scripts/device/bench.sh,
tests/gpu/test_bench_smoke.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvprefetch.kernels import ops
from kvprefetch.verify import numerics
from kvprefetch.verify.numerics import FAILED, NOT_CHECKED, PASSED, IdentityCase
from kvprefetch.verify.reference import register_reference_ops

_REGISTERED: dict[str, object] = {}


def _ops(namespace: str, name: str, transform=None) -> ops.PagedOps:
    """A stand-in build: the reference written into ``out`` (then ``transform(out)``)."""
    if namespace not in _REGISTERED:
        _REGISTERED[namespace] = register_reference_ops(namespace, transform)
    return ops.ops_from_namespace(namespace, name=name)


SMALL = [IdentityCase(64, 16, "float16", "auto", 200),
         IdentityCase(128, 32, "bfloat16", "fp8", 513, num_kv_heads=1),
         IdentityCase(64, 16, "bfloat16", "auto", 1500)]


def test_identical_builds_pass() -> None:
    a = _ops("kvp_id_ref_a", "baseline")
    b = _ops("kvp_id_ref_b", "patched")
    rep = numerics.check_identity([a, b], cases=SMALL, device="cpu", seed=3)
    assert rep.status == PASSED and rep.passed
    assert len(rep.rows) == 2 * len(SMALL)
    assert {r.kernel for r in rep.rows} == {"v1", "v2"}
    assert all(r.bitwise_equal for r in rep.rows)
    d = rep.to_dict()
    assert d["checked"] == 6 and d["failed"] == 0 and d["kind"] == "identity"
    assert d["max_rel_err"]["float16"] < numerics.TOLERANCES["float16"]


def test_one_flipped_bit_fails_bitwise_equality() -> None:
    import torch

    def flip_last_bit(out: torch.Tensor) -> None:
        bits = out.view(torch.int16).view(-1)
        bits[-1] ^= 1

    a = _ops("kvp_id_ref_a", "baseline")
    b = _ops("kvp_id_flip", "patched", flip_last_bit)
    rep = numerics.check_identity([a, b], cases=SMALL[:1], device="cpu")
    assert rep.status == FAILED
    for r in rep.rows:
        assert r.bitwise_equal is False
        assert any("not bitwise equal to baseline: patched" in p for p in r.problems)
        # one ulp is far inside the tolerance: only the bitwise check catches it
        assert all(e < numerics.TOLERANCES["float16"] for _, e in r.rel_err)


def test_unwritten_output_is_caught_by_the_poison() -> None:
    import torch

    def forget_a_row(out: torch.Tensor) -> None:
        out[-1].fill_(float("nan"))  # as if the kernel never wrote the last sequence

    a = _ops("kvp_id_ref_a", "baseline")
    b = _ops("kvp_id_nan", "patched", forget_a_row)
    rep = numerics.check_identity([a, b], cases=SMALL[:1], device="cpu")
    assert rep.status == FAILED
    assert all(any("NaN" in p for p in r.problems) for r in rep.rows)


def test_wrong_math_fails_the_reference_even_when_both_builds_agree() -> None:
    import torch

    def scale_up(out: torch.Tensor) -> None:
        out.mul_(1.05)

    a = _ops("kvp_id_wrong_a", "baseline", scale_up)
    b = _ops("kvp_id_wrong_b", "patched", scale_up)
    rep = numerics.check_identity([a, b], cases=SMALL[:1], device="cpu")
    assert rep.status == FAILED
    assert all(r.bitwise_equal for r in rep.rows)
    assert all(any("relative error" in p for p in r.problems) for r in rep.rows)


def test_missing_instantiation_is_not_checked(tmp_path: Path) -> None:
    only128 = ops.BuiltOps(tree="patched", variant="prefetch", namespace="x", so_path=tmp_path,
                           so_sha256="", head_sizes=(128,), block_sizes=(16, 32),
                           kv_dtypes=("fp16", "bf16", "fp8"), manifest_path=tmp_path)
    a = _ops("kvp_id_ref_a", "baseline")
    b = ops.PagedOps(name="patched", namespace="kvp_id_ref_b",
                     v1=_ops("kvp_id_ref_b", "p").v1, v2=_ops("kvp_id_ref_b", "p").v2,
                     build=only128)
    rep = numerics.check_identity([a, b], cases=SMALL, device="cpu")
    by_head = {(r.case.head_size, r.kernel): r for r in rep.rows}
    assert by_head[(64, "v1")].status == NOT_CHECKED
    assert "patched" in by_head[(64, "v1")].problems[0]
    assert by_head[(128, "v2")].status == PASSED
    assert rep.status == PASSED  # what ran passed; the rest is listed, never counted as passed
    assert rep.to_dict()["not_checked"] == 4


def test_main_without_a_gpu_reports_not_checked(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the not-checked path is for machines without one")
    out = tmp_path / "identity.json"
    code = numerics.main(["--workdir", str(tmp_path), "--json", str(out)])
    doc = json.loads(out.read_text())
    assert code == 2
    assert doc["status"] == NOT_CHECKED and doc["passed"] is False
    assert "no CUDA device" in doc["reason"]
