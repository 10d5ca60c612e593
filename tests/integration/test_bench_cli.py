"""The `bench` CLI in a fresh interpreter: loading its command modules imports no torch, and
`python -m kvprefetch.cli.bench` reports an error without a traceback (tests/unit/test_bench_cli.py
covers the options, plans and refusals in-process)."""

from __future__ import annotations

from pathlib import Path

from kvprefetch.errors import BenchError


def test_command_modules_do_not_import_torch() -> None:
    import subprocess
    import sys

    code = ("import sys, kvprefetch.cli.bench, kvprefetch.cli.report, "
            "kvprefetch.bench.matrix, kvprefetch.bench.report, kvprefetch.bench.ncu, "
            "kvprefetch.bench.e2e, kvprefetch.bench.kernel, kvprefetch.verify.numerics, "
            "kvprefetch.kernels.ops; "
            "assert 'torch' not in sys.modules, 'torch imported at import time'")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr


def test_module_entry_point_reports_errors_without_traceback(tmp_path: Path) -> None:
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "kvprefetch.cli.bench", "kernel",
                          "--workdir", str(tmp_path)], capture_output=True, text=True, check=False)
    assert res.returncode == BenchError.exit_code
    assert "error: no kernels-only builds" in res.stderr and "Traceback" not in res.stderr


def test_module_entry_point_has_every_bench_command() -> None:
    """`python -m kvprefetch.cli.bench decode` is `kvprefetch bench decode` (the entry point
    once ran before the later commands were defined and said "No such command")."""
    import subprocess
    import sys

    for cmd in ("kernel", "decode", "ncu", "e2e"):
        res = subprocess.run([sys.executable, "-m", "kvprefetch.cli.bench", cmd, "--help"],
                             capture_output=True, text=True, check=False)
        assert res.returncode == 0, res.stderr
        assert f"Usage: kvprefetch bench {cmd}" in res.stdout
