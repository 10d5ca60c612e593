"""kvprefetch.verify.numerics, the identity check verify-kernel runs on the GPU: its pure parts
(the default cases, the overall status). The check itself runs on the CPU over in-process
stand-in builds in tests/integration/test_bench_identity.py (the unit layer has no torch), and on
the H200 over the compiled builds (scripts/device/bench.sh, tests/gpu/test_bench_smoke.py)."""

from __future__ import annotations

from kvprefetch.kernels import ops
from kvprefetch.verify import numerics
from kvprefetch.verify.numerics import FAILED, NOT_CHECKED, PASSED, IdentityCase


def test_default_cases_cover_the_issue() -> None:
    cases = numerics.default_cases()
    assert {c.head_size for c in cases} >= {64, 128, 256}
    assert {c.block_size for c in cases} >= {16, 32}
    assert {c.dtype for c in cases} >= {"float16", "bfloat16"}
    assert {c.kv_cache_dtype for c in cases} >= {"auto", "fp8"}
    ctx = {c.max_seq_len for c in cases}
    assert min(ctx) <= ops.PARTITION_SIZE < max(ctx)          # one partition and several
    assert max(ctx) > ops.V1_MAX_SEQ_LEN                        # over v1's limit
    choices = {ops.choose_kernel(c.max_seq_len, c.num_seqs, c.num_heads) for c in cases}
    assert choices == {"v1", "v2"}
    multi_v1 = [c for c in cases if c.max_seq_len > ops.PARTITION_SIZE
                and ops.choose_kernel(c.max_seq_len, c.num_seqs, c.num_heads) == "v1"]
    assert multi_v1, "a multi-partition context where vLLM still picks v1"


def test_overall_status() -> None:
    c = IdentityCase(64, 16, "float16", "auto", 200)
    row = lambda s: numerics.IdentityRow(c, "v1", "v1", s, None, (), 1e-3)
    assert numerics.overall_status([]) == NOT_CHECKED
    assert numerics.overall_status([row(NOT_CHECKED)]) == NOT_CHECKED
    assert numerics.overall_status([row(PASSED), row(NOT_CHECKED)]) == PASSED
    assert numerics.overall_status([row(PASSED), row(FAILED)]) == FAILED