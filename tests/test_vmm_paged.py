"""``vmm bench --paged-workdir``: vLLM's paged decode beside SDPA over the VMM cache.

No GPU here, so the compiled kernels-only builds are stood in for by in-process ops with vLLM's
exact schemas that write the float64 reference (``reference.register_reference_ops``), and the
per-shape timing runs through bench kernel's eager host-clock backend (``device="cpu"``): the
inputs, the per-build graphs-or-calls, the rotated rounds, NaN poisoning, the bitwise comparison
and the JSON fields are the real code; the times are host-clock and mean nothing, so no test
reads them for anything but consistency. Where the CLI would start the GPU run its ``main`` is
replaced by a recorder (the real one needs CUDA). The GPU parts are at the bottom, ``gpu``-marked.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvprefetch.cli.vmm import vmm
from kvprefetch.errors import BenchError
from kvprefetch.kernels import ops
from kvprefetch.vmm import paged as P
from kvprefetch.vmm.bench import DecodeConfig, DecodeResult, render_summary

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


def _decode_result(batch: int, context: int, vmm_ms: float, **paged: Any) -> DecodeResult:
    return DecodeResult(
        batch=batch, context=context, layers=2, kv_bytes_per_call=2 * batch * context * 2 * 64 * 2,
        backend="CUDNN_ATTENTION", vmm_ms=vmm_ms, malloc_ms=vmm_ms, vmm_spread=0.01,
        malloc_spread=0.01, ratio=1.0, within_3pct=True, vmm_gbps=1.0, malloc_gbps=1.0,
        vmm_frac_copy_bw=0.9, malloc_frac_copy_bw=0.9, bitwise_equal=True, **paged)


def test_paged_shape_is_the_vmm_shape_with_vllms_kernel_choice() -> None:
    cfg = DecodeConfig()
    for b, s in [(1, 512), (1, 4096), (32, 4096), (8, 16384)]:
        shape = P.paged_shape(cfg, b, s)
        a = shape.attn
        assert (a.num_seqs, a.max_seq_len, a.num_heads, a.num_kv_heads, a.head_size, a.dtype) == \
            (b, s, cfg.q_heads, cfg.kv_heads, cfg.head_dim, "float16")
        assert a.block_size == 16 and a.kv_cache_dtype == "auto"
        assert shape.kernel == ops.choose_kernel(s, b, cfg.q_heads)
        # the paged kernel reads exactly the K+V bytes the VMM side counts
        from kvprefetch.kernels.kvinputs import kv_bytes_read
        from kvprefetch.vmm.bench import plan_shapes

        plan = plan_shapes(DecodeConfig(batches=(b,), contexts=(s,)), 60 << 20, None)[0][0]
        assert kv_bytes_read(a) == plan.kv_bytes_per_call
    assert [P.paged_shape(cfg, b, s).kernel for b, s in [(1, 512), (1, 4096), (32, 4096),
                                                          (8, 16384)]] == ["v1", "v2", "v1", "v2"]


def test_hook_times_every_build_and_checks_bitwise_equality_on_cpu() -> None:
    builds = [_reference_ops("kvp_vp_base", "baseline"), _reference_ops("kvp_vp_pat", "patched")]
    hook = P.make_paged_decode(builds, CFG, l2_bytes=L2, copy_bytes_per_s=4.3e12,
                               device="cpu")
    t = hook(2, 100)
    assert t.status == "measured" and t.error == ""
    assert t.kernel == ops.choose_kernel(100, 2, CFG.q_heads)
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


def test_without_a_workdir_the_paged_columns_say_not_measured() -> None:
    r = _decode_result(1, 512, 0.01, **P.paged_fields(None, 0.01, 1 << 20, 4300.0))
    assert r.paged_status == "not measured" and r.paged_ms is None
    report = {"decode": {"copy_bandwidth": {"gbps": 4300.0, "read_gbps": 4650.0},
                         "device": {"name": "H200"}, "results": [asdict(r)]}}
    text = render_summary(report)
    assert "vLLM paged decode: not measured (no --paged-workdir given)" in text


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


# ---- the CLI option ----------------------------------------------------------------------
def _fake_build(workdir: Path, tree: str) -> None:
    """A manifest as `build --kernels-only` writes it, beside a placeholder library file (find_builds
    only needs the file to exist; nothing here loads it)."""
    d = workdir / "build" / tree / "k1"
    d.mkdir(parents=True)
    (d / f"kvprefetch_{tree}_C.so").write_bytes(b"not a library")
    (d / "manifest.json").write_text(json.dumps({
        "tree": tree, "variant": "prefetch" if tree == "patched" else "none",
        "namespace": f"kvprefetch_{tree}", "so_path": f"kvprefetch_{tree}_C.so",
        "so_sha256": "0" * 64, "head_sizes": [128], "block_sizes": [16], "kv_dtypes": ["fp16"]}))


def test_cli_dry_run_lists_the_paged_builds_stock_first(tmp_path: Path) -> None:
    _fake_build(tmp_path, "patched")
    _fake_build(tmp_path, "baseline")
    r = CliRunner().invoke(vmm, ["bench", "--dry-run", "--json", "--batches", "1,32",
                                 "--contexts", "512,4k", "--paged-workdir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert [b["tree"] for b in plan["paged"]["builds"]] == ["baseline", "patched"]
    assert plan["paged"]["block_size"] == 16
    assert {(s["batch"], s["context"], s["paged_kernel"]) for s in plan["shapes"]} == \
        {(b, c, ops.choose_kernel(c, b, 32)) for b in (1, 32) for c in (512, 4096)}


def test_cli_dry_run_without_a_workdir_says_not_measured() -> None:
    r = CliRunner().invoke(vmm, ["bench", "--dry-run", "--json", "--batches", "1",
                                 "--contexts", "512"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["paged"] == {"builds": [], "not_measured": P.NO_WORKDIR}


@pytest.mark.parametrize("trees", [(), ("patched",)])
def test_cli_refuses_a_workdir_without_a_baseline_build(tmp_path: Path,
                                                        trees: tuple[str, ...]) -> None:
    for t in trees:
        _fake_build(tmp_path, t)
    r = CliRunner().invoke(vmm, ["bench", "--dry-run", "--paged-workdir", str(tmp_path)])
    assert r.exit_code != 0 and isinstance(r.exception, BenchError)
    assert "To fix:" in str(r.exception)
    assert ("no baseline" if trees else "no kernels-only builds") in str(r.exception)


def test_cli_passes_the_workdir_to_the_gpu_run(tmp_path: Path, monkeypatch: Any) -> None:
    """The real ``run_bench`` needs CUDA, so it is replaced by a recorder that writes a report;
    the command calls it directly (no argv round trip)."""
    import kvprefetch.vmm.bench as vb

    _fake_build(tmp_path, "baseline")
    seen: list[dict[str, Any]] = []

    def fake_run_bench(out: Path, cfg: Any, **kw: Any) -> Any:
        seen.append({"out": out, "cfg": cfg, **kw})
        out.write_text("{}")
        return vb.BenchRun({}, ("decode: boom",) if len(seen) > 1 else ())

    monkeypatch.setattr(vb, "run_bench", fake_run_bench)
    out = tmp_path / "r.json"
    args = ["bench", "--skip-steps", "--out", str(out), "--paged-workdir", str(tmp_path),
            "--batches", "1,8"]
    r = CliRunner().invoke(vmm, args)
    assert r.exit_code == 0, r.output
    call = seen[0]
    assert call["paged_workdir"] == tmp_path and call["steps"] is False and call["decode"]
    assert call["out"] == out and call["cfg"].batches == (1, 8)
    r = CliRunner().invoke(vmm, args)      # a failed part fails the command
    assert isinstance(r.exception, BenchError) and "FAILED decode: boom" in r.output


def test_main_takes_the_paged_workdir_option(capsys: Any) -> None:
    import kvprefetch.vmm.bench as vb

    with pytest.raises(SystemExit) as exc:
        vb.main(["--help"])
    assert exc.value.code == 0 and "--paged-workdir" in capsys.readouterr().out


# ---- GPU (the H200) ------------------------------------------------------------------------
@pytest.mark.gpu
def test_copy_figure_comes_from_bench_device() -> None:
    from kvprefetch.vmm.bench import measure_copy_bandwidth

    c = measure_copy_bandwidth(1 << 28, iters=5)
    assert c["gbps"] == pytest.approx(2 * c["bytes"] / (c["median_ms"] * 1e-3) / 1e9)
    assert c["gbps"] > 100 and c["read_gbps"] > 100 and c["read_spread"] >= 0


@pytest.mark.gpu
def test_one_shape_against_the_builds_on_this_machine() -> None:
    """Needs kernels-only builds made on this GPU machine: KVPREFETCH_PAGED_WORKDIR=DIR."""
    workdir = os.environ.get("KVPREFETCH_PAGED_WORKDIR")
    if not workdir:
        pytest.skip("set KVPREFETCH_PAGED_WORKDIR to a workdir with kernels-only builds")
    from kvprefetch.vmm.bench import measure_copy_bandwidth, plan_shapes, run_decode_shape

    builds = P.load_paged_ops(Path(workdir))
    cfg = DecodeConfig(batches=(8,), contexts=(1024,), rounds=3)
    plan = plan_shapes(cfg, 50 << 20, None)[0][0]
    copy = measure_copy_bandwidth(1 << 28, iters=5)
    hook = P.make_paged_decode(builds, cfg, 50 << 20, copy["gbps"] * 1e9)
    r = run_decode_shape(cfg, plan, copy["gbps"], hook, copy["read_gbps"])
    assert r.paged_status == "measured", r.paged_error
    # vLLM's own choice: b8 x 32 heads = 256 <= 512 and two 512-token partitions -> v2
    assert r.paged_bitwise_equal is True and r.paged_kernel == ops.choose_kernel(1024, 8, 32) == "v2"
    assert next(iter(r.paged_builds)) == "baseline" and r.paged_ms and r.vmm_over_paged
