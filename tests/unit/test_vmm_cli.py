"""``kvprefetch vmm``: help, the fake-driver selftest and the bench dry run (no GPU needed)."""

from __future__ import annotations

import json
import sys

from click.testing import CliRunner

from kvprefetch.cli.vmm import vmm


def test_help_lists_the_commands_without_importing_torch_or_cuda() -> None:
    before = {m for m in sys.modules if m.startswith(("torch", "cuda"))}
    r = CliRunner().invoke(vmm, ["--help"])
    assert r.exit_code == 0
    assert "selftest" in r.output and "bench" in r.output
    after = {m for m in sys.modules if m.startswith(("torch", "cuda"))}
    assert after == before


def test_selftest_with_the_fake_driver_reports_no_leaks() -> None:
    r = CliRunner().invoke(vmm, ["selftest", "--driver", "fake", "--ops", "800", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[r.output.index("{"):])
    assert out["leaks"] == {} and out["driver"] == "fake"
    assert out["report"]["ops"] == 800 and out["report"]["steps"] > 400


def test_selftest_sync_tensor_slicing_table() -> None:
    r = CliRunner().invoke(vmm, ["selftest", "--driver", "fake", "--ops", "300", "--sync",
                                 "--layout", "tensor-slicing"])
    assert r.exit_code == 0, r.output
    assert "vmm selftest" in r.output and "none" in r.output


def test_bench_dry_run_plans_the_issue_shapes() -> None:
    r = CliRunner().invoke(vmm, ["bench", "--dry-run", "--json", "--contexts", "512,16k"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    shapes = {(s["batch"], s["context"]) for s in plan["shapes"]}
    assert shapes == {(b, c) for b in (1, 8, 32, 64, 128) for c in (512, 16384)}
    for s in plan["shapes"]:   # each replay reads at least 4x a 60 MB L2, or is capped
        assert s["layers"] * s["kv_bytes_per_call"] >= 4 * 60 * 2**20 or s["layers"] == 128


def test_bench_rejects_bad_sizes() -> None:
    r = CliRunner().invoke(vmm, ["bench", "--dry-run", "--contexts", "12x"])
    assert r.exit_code != 0 and "not a size" in r.output
