"""Issue 41, the twenty-third hostile pass (tester c: every command, option, input and
environment value, for tracebacks, hangs, wrong messages and wrong writes). Each test fails
without its fix (checked by reverting ``src`` and running it):

- ``slurm plan --scratch``, ``--source`` or ``--python`` naming a path whose name is not UTF-8
  (``$'/scratch/\\xff'``, a folder a latin-1 machine made), or a ``PATH`` entry that is not,
  passed every check and was a ``UnicodeEncodeError`` traceback half-way through writing the
  scripts (the campaign folder left with one script). Such a value is now refused before
  anything is written, naming the option (``slurm/values.check_utf8``).
- ``export-header --variant launch`` (or ``control``) said "the launch patch does not apply to
  pristine v0.10.2 / To fix: reinstall kvprefetch from a clean checkout" (exit 4) on a clean
  checkout: those variants change only the launchers, so there is no header patch, and ``git
  apply`` of no file read its standard input (/dev/null) and failed. Their header is stock, as
  the caveat the command prints says; it is now written (exit 0) with that caveat.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path, **extra: str | bytes) -> dict[str | bytes, str | bytes]:
    env: dict[str | bytes, str | bytes] = {
        k: v for k, v in os.environ.items()
        if k not in ("KVPREFETCH_WORKDIR", "KVPREFETCH_CAMPAIGN")}
    env.update(PYTHONPATH=str(_REPO / "src"), TMPDIR=str(tmp_path), HOME=str(tmp_path))
    env.update(extra)
    return env


def _kit(tmp_path: Path, *args: str | bytes,
         **extra: str | bytes) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args],
                          env=_env(tmp_path, **extra),  # type: ignore[arg-type]
                          capture_output=True, text=True, errors="replace", timeout=120,
                          check=False)


@pytest.mark.parametrize("option", ["--scratch", "--source", "--python", "PATH"])
def test_a_path_that_is_not_utf8_is_refused_by_slurm_plan_not_a_traceback(tmp_path: Path,
                                                                          option: str) -> None:
    odd = os.fsencode(tmp_path) + b"/odd\xff"
    os.mkdir(odd)
    if option == "--python":  # an interpreter under that name
        odd += b"/python"
        os.symlink(sys.executable, odd)
    campaign = tmp_path / "camp"
    args: list[str | bytes] = ["slurm", "plan", str(campaign), "--stand-in", "--no-gpu"]
    extra: dict[str, str | bytes] = {}
    if option == "PATH":
        extra["PATH"] = odd + b":" + os.fsencode(os.environ.get("PATH", "/usr/bin:/bin"))
    else:
        args += [option, odd]
    res = _kit(tmp_path, *args, **extra)
    assert "Traceback" not in res.stderr, res.stderr  # without the fix: UnicodeEncodeError
    assert res.returncode == 2, res.stderr
    assert "is not UTF-8 text" in res.stderr and option in res.stderr, res.stderr
    assert "To fix" in res.stderr
    assert not campaign.exists() or not any((campaign / "scripts").iterdir())


@pytest.mark.parametrize("variant", ["launch", "control"])
def test_export_header_of_a_launcher_only_variant_writes_the_stock_header(
        tmp_path: Path, fetched_workdir: Path, variant: str) -> None:
    out = tmp_path / "out" / "attention_kernels.cuh"
    res = _kit(tmp_path, "export-header", "--workdir", str(fetched_workdir), "--variant",
               variant, "-o", str(out))
    # without the fix: exit 4, "does not apply to pristine v0.10.2 ... reinstall kvprefetch"
    assert res.returncode == 0, res.stderr
    assert "reinstall" not in res.stderr and "header is stock" in res.stderr, res.stderr
    stock = _kit(tmp_path, "export-header", "--workdir", str(fetched_workdir), "--variant",
                 "prefetch", "-o", str(tmp_path / "prefetch.cuh"))
    assert stock.returncode == 0, stock.stderr
    text = out.read_text()
    assert "#include \"kvprefetch/" not in text and text != (tmp_path / "prefetch.cuh").read_text()
    assert "paged_attention_kernel" in text
