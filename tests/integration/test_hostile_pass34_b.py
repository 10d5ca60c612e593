"""Issue 41, the thirty-fourth hostile pass (tester b: the process environment as input; its
resource limits are inherited like its variables). Each test fails without its fix (checked by
reverting ``src`` and running it):

- **a traceback from ``clean`` under a small ``ulimit -n``.** The fix for "Too many open files"
  (``oserrors._too_many_open``) imported ``resource`` when it was needed, which is when no file
  can be opened: ``clean`` under ``ulimit -n 9`` ended in ``ImportError: ...resource...so:
  cannot open shared object file: Too many open files``. ``resource`` is imported with the
  module now.
- **apply under ``ulimit -n 9`` sent the user the wrong way.** git could not be started (its
  exec failed with EMFILE) and apply said "cannot run /usr/bin/git: Too many open files (it is
  not an executable program) / To fix: pass the path of an executable in place of
  /usr/bin/git". ``oserrors.not_forked`` now names the limit for EMFILE/ENFILE, as it did the
  process limit for EAGAIN.
- **build under ``ulimit -n 10`` sent the user to another toolkit.** An ``nvcc`` that is a
  ``/bin/sh`` wrapper (this machine's ``/usr/local/bin/nvcc``, a common install) fails with
  "/bin/sh: 0: 3: Invalid argument" when the shell cannot move its script's descriptor past
  the limit, and ``nvcc --version``'s failure said "fix or replace that CUDA toolkit".
  ``oserrors.child_limit_fix`` names a ``ulimit -n`` under 64 (or "Too many open files" in a
  child's output), and ``toolchain.nvcc_version`` asks it first.
- **doctor and build with no PATH at all (``env -i``) sent the user to another toolkit.** The
  kit searched ``os.defpath`` for its programs but passed its children no PATH; nvcc started
  ``gcc`` by a bare name, which then could not find its own ``cc1plus`` ("Failed to preprocess
  host compiler properties"), and the probe said "use a CUDA toolkit >= 12.8 whose nvcc
  supports every --arch you pass". An unset PATH is now ``os.defpath`` in the kit's
  environment from start-up (``runner.leave_out_relative_path``), the one ``which`` searched.

Nothing is mocked: the CLI runs for real, under a real ``RLIMIT_NOFILE``, on a work directory
fetched from the real sdist; the nvcc wrapper is written here as the machine's own is (``exec``
of the real nvcc)."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import kvprefetch_cli_split
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


def _cli_limited(files: int, *args: str, env: dict[str, str] | None = None) -> Any:
    """``python -m kvprefetch ARGS`` under ``ulimit -n FILES`` (soft and hard)."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))

    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False,
                          preexec_fn=limit)


def test_clean_under_a_tiny_open_file_limit_says_so_without_traceback(
        fetched_workdir: Path) -> None:
    res = _cli_limited(9, "clean", "--workdir", str(fetched_workdir), "--what", "all")
    out = res.stdout + res.stderr
    assert "Traceback" not in out, out
    assert res.returncode == 2, out
    assert "Too many open files" in out and "`ulimit -n`" in out, out


def test_apply_that_cannot_start_git_for_the_open_file_limit_names_the_limit(
        fetched_workdir: Path) -> None:
    res = _cli_limited(9, "apply", "--workdir", str(fetched_workdir))
    out = res.stdout + res.stderr
    assert "Traceback" not in out, out
    assert res.returncode == 2, out
    assert "not an executable program" not in out and "in place of" not in out, out
    assert "limit of open files (now 9, `ulimit -n`)" in out, out


@pytest.mark.skipif(shutil.which("nvcc") is None or not Path("/bin/sh").exists(),
                    reason="needs an nvcc and /bin/sh")
def test_an_nvcc_wrapper_failing_under_the_open_file_limit_is_not_blamed_on_the_toolkit(
        fetched_workdir: Path, tmp_path: Path) -> None:
    real = os.path.realpath(shutil.which("nvcc") or "")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    wrapper = bindir / "nvcc"
    wrapper.write_text(f'#!/bin/sh\nexec "{real}" "$@"\n')
    wrapper.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', os.defpath)}"
    assert kvprefetch_cli_split("apply", "--workdir", str(fetched_workdir)).returncode == 0
    res = _cli_limited(10, "build", "--workdir", str(fetched_workdir), "--dry-run",
                       "--arch", "9.0a", "--mode", "kernels-only", env=env)
    out = res.stdout + res.stderr
    assert "Traceback" not in out, out
    assert str(wrapper) in out, out  # the wrapper was the nvcc that failed
    assert "replace that CUDA toolkit" not in out, out
    assert "`ulimit -n`" in out, out


@pytest.mark.skipif(not Path("/usr/local/cuda/bin/nvcc").exists()
                    or shutil.which("gcc", path=os.defpath) is None,
                    reason="needs the toolkit at its default place and gcc on os.defpath")
def test_doctor_with_no_path_at_all_finds_the_host_compiler(fetched_workdir: Path) -> None:
    env = {"PYTHONPATH": os.environ.get("PYTHONPATH", ""), "TMPDIR": str(fetched_workdir.parent)}
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "doctor", "--mode",
                          "kernels-only", "--workdir", str(fetched_workdir), "--json"],
                         env=env, capture_output=True, text=True, timeout=300, check=False)
    assert "Traceback" not in res.stderr, res.stderr
    assert "cc1plus" not in res.stdout and "use a CUDA toolkit" not in res.stdout, res.stdout
    assert res.returncode == 0, res.stdout + res.stderr
