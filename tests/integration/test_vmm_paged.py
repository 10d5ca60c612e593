"""``vmm bench --paged-workdir``: vLLM's paged decode beside SDPA over the VMM cache.

No GPU here, so the compiled kernels-only builds are stood in for by in-process ops with vLLM's
exact schemas that write the float64 reference (``reference.register_reference_ops``), and the
per-shape timing runs through bench kernel's eager host-clock backend (``device="cpu"``): the
inputs, the per-build graphs-or-calls, the rotated rounds, NaN poisoning, the bitwise comparison
and the JSON fields are the real code; the times are host-clock and mean nothing, so no test
reads them for anything but consistency. Where the CLI would start the GPU run its ``main`` is
replaced by a recorder (the real one needs CUDA). These run the decode hook for real on the CPU
(seconds each); the CLI is in tests/unit/test_vmm_paged.py, the GPU parts in tests/gpu/.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from kvprefetch.bench.vllm_call import VllmCall, launch_for
from kvprefetch.errors import BenchError
from kvprefetch.kernels import ops
from kvprefetch.vmm import paged as P
from kvprefetch.vmm.bench import DecodeConfig, render_summary
from tests.unit.test_vmm_paged import _decode_result  # the same stand-in result

CFG = DecodeConfig(q_heads=8, kv_heads=2, head_dim=64, rounds=3, sample_ms=0.0)


L2 = 1 << 18  # a small "L2" keeps the rotated layers (and the CPU reference calls) few


_REF: dict[str, object] = {}


def _reference_ops(namespace: str, name: str, transform: Any = None) -> ops.PagedOps:
    """A stand-in build (no GPU here): vLLM's schemas, the float64 reference as the kernel."""
    from kvprefetch.verify.reference import register_reference_ops

    if namespace not in _REF:
        _REF[namespace] = register_reference_ops(namespace, transform)
    return ops.ops_from_namespace(namespace, name=name)


def _bump(out: Any) -> None:
    out.view(-1)[0] += 1


def test_hook_times_every_build_and_checks_bitwise_equality_on_cpu() -> None:
    builds = [_reference_ops("kvp_vp_base", "baseline"), _reference_ops("kvp_vp_pat", "patched")]
    hook = P.make_paged_decode(builds, CFG, l2_bytes=L2, copy_bytes_per_s=4.3e12,
                               device="cpu")
    t = hook(2, 100)
    assert t.status == "measured" and t.error == ""
    # the paged side is launched as vLLM's graph launches it: bucket 2 at the capture length
    want = launch_for([100, 100], num_heads=CFG.q_heads, block_size=16, call=VllmCall(),
                      timing="graph")
    assert want.max_seq_len == 8192
    assert t.kernel == want.kernel == ops.choose_kernel(8192, 2, CFG.q_heads)
    assert [b.name for b in t.builds] == ["baseline", "patched"]
    assert t.bitwise_equal is True
    assert t.builds[0].equal_to_baseline is None and t.builds[1].equal_to_baseline is True
    assert all(b.nan_free and b.ms > 0 and b.spread >= 0 for b in t.builds)
    # layers rotated so that a pass reads more than 4x the (here tiny) L2, as the VMM side does
    per_layer = 2 * 2 * 112 * CFG.kv_heads * CFG.head_dim * 2   # 100 tokens -> 7 blocks of 16
    assert t.layers == math.ceil(4 * L2 / per_layer) > 1


def test_hook_reports_a_build_whose_outputs_differ() -> None:
    builds = [_reference_ops("kvp_vp_base", "baseline"),
              _reference_ops("kvp_vp_bad", "patched", _bump)]
    t = P.make_paged_decode(builds, CFG, L2, 4.3e12, device="cpu")(1, 40)
    assert t.status == "measured"
    assert t.bitwise_equal is False and t.builds[1].equal_to_baseline is False
    fields = P.paged_fields(t, 0.5, 1000, 4000.0)
    assert fields["paged_bitwise_equal"] is False
    assert fields["paged_builds"]["patched"]["equal_to_baseline"] is False


def test_hook_records_a_shape_a_build_cannot_run() -> None:
    base = _reference_ops("kvp_vp_base", "baseline")
    no64 = ops.BuiltOps(tree="patched", variant="prefetch", namespace="x", so_path=Path("x.so"),
                        so_sha256="", head_sizes=(128,), block_sizes=(16,), kv_dtypes=("fp16",),
                        manifest_path=Path("manifest.json"))
    patched = ops.PagedOps(name="patched", namespace="x", v1=base.v1, v2=base.v2, build=no64)
    t = P.make_paged_decode([base, patched], CFG, L2, 4.3e12, device="cpu")(1, 40)
    assert t.status == "skipped" and "instantiation not in build(s): patched" in t.error
    fields = P.paged_fields(t, 0.5, 1000, 4000.0)
    assert fields["paged_status"] == "skipped" and "paged_ms" not in fields
    r = _decode_result(1, 40, 0.5, **fields)
    assert r.paged_ms is None and r.vmm_over_paged is None and r.paged_builds == {}


def test_hook_records_a_build_that_raises_and_lets_the_run_go_on() -> None:
    base = _reference_ops("kvp_vp_base", "baseline")

    def broken(*_args: Any) -> None:
        raise BenchError("kernel launch refused", "rebuild")

    bad = ops.PagedOps(name="patched", namespace="x", v1=broken, v2=broken)
    t = P.make_paged_decode([base, bad], CFG, L2, 4.3e12, device="cpu")(1, 40)
    assert t.status == "failed" and "kernel launch refused" in t.error and t.builds == ()
    assert P.paged_fields(t, 0.5, 1000, 4000.0)["paged_status"] == "failed"


def test_paged_fields_give_every_builds_ratio_and_bandwidth_fraction() -> None:
    builds = [_reference_ops("kvp_vp_base", "baseline"), _reference_ops("kvp_vp_pat", "patched")]
    t = P.make_paged_decode(builds, CFG, L2, 4.3e12, device="cpu")(2, 64)
    vmm_ms, kv_bytes, copy_gbps = 0.25, 2 * 2 * 64 * CFG.kv_heads * CFG.head_dim * 2, 4300.0
    f = P.paged_fields(t, vmm_ms, kv_bytes, copy_gbps)
    r = asdict(_decode_result(2, 64, vmm_ms, **f))
    by_name = {b.name: b for b in t.builds}
    assert r["paged_status"] == "measured" and r["paged_kernel"] == t.kernel
    assert set(r["paged_builds"]) == {"baseline", "patched"}
    for name, row in r["paged_builds"].items():
        ms = by_name[name].ms
        assert row["ms"] == ms and row["vmm_over_paged"] == pytest.approx(vmm_ms / ms)
        assert row["frac_copy_bw"] == pytest.approx(kv_bytes / (ms * 1e-3) / 1e9 / copy_gbps)
    base = r["paged_builds"]["baseline"]
    assert (r["paged_ms"], r["vmm_over_paged"], r["paged_frac_copy_bw"]) == \
        (base["ms"], base["vmm_over_paged"], base["frac_copy_bw"])
    assert r["paged_bitwise_equal"] is True
    json.dumps(r)  # the report is JSON


def test_render_summary_shows_each_build_and_the_ratio_ranges() -> None:
    builds = [_reference_ops("kvp_vp_base", "baseline"), _reference_ops("kvp_vp_pat", "patched")]
    hook = P.make_paged_decode(builds, CFG, L2, 4.3e12, device="cpu")
    rows = []
    for b, s, vmm_ms in [(1, 48, 0.02), (2, 64, 0.03)]:
        kv = 2 * b * s * CFG.kv_heads * CFG.head_dim * 2
        rows.append(asdict(_decode_result(b, s, vmm_ms, **P.paged_fields(hook(b, s), vmm_ms, kv,
                                                                          4300.0))))
    text = render_summary({"decode": {"copy_bandwidth": {"gbps": 4300.0, "read_gbps": 4650.0},
                                      "device": {"name": "H200"}, "results": rows}})
    ratios = [r["paged_builds"]["patched"]["vmm_over_paged"] for r in rows]
    assert f"vmm/paged[patched]: min {min(ratios):.3f}" in text
    assert "vmm/paged[baseline]" in text and "bitwise equal across builds: 2/2" in text
    row = next(line for line in text.splitlines() if line.split()[:2] == ["2", "64"]
               and "%" in line and line.endswith(" y"))
    assert f"{rows[1]['paged_builds']['baseline']['vmm_over_paged']:.4f}" in row
