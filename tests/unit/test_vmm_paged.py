"""``vmm bench --paged-workdir``: the paged shape, the columns without a work directory, and the
CLI option (dry runs, refusals, the work directory passed to the GPU run, whose ``main`` is
replaced by a recorder). The decode hook run for real on the CPU is in
tests/integration/test_vmm_paged.py; the GPU parts are in tests/gpu/test_vmm_paged_gpu.py."""

from __future__ import annotations

import json
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


def test_without_a_workdir_the_paged_columns_say_not_measured() -> None:
    r = _decode_result(1, 512, 0.01, **P.paged_fields(None, 0.01, 1 << 20, 4300.0))
    assert r.paged_status == "not measured" and r.paged_ms is None
    report = {"decode": {"copy_bandwidth": {"gbps": 4300.0, "read_gbps": 4650.0},
                         "device": {"name": "H200"}, "results": [asdict(r)]}}
    text = render_summary(report)
    assert "vLLM paged decode: not measured (no --paged-workdir given)" in text


# ---- the CLI option ----------------------------------------------------------------------
def _fake_build(workdir: Path, tree: str) -> None:
    """A manifest as `build --kernels-only` writes it, beside a placeholder library file
    (find_builds only needs the file to exist; nothing here loads it)."""
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
    # and the GPU it needs (the command refuses before any work without one)
    monkeypatch.setattr("kvprefetch.cli.vmm._require_gpu", lambda *a: None)
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
