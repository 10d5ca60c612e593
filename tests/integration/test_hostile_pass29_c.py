"""Issue 41, the twenty-ninth hostile pass (tester c: the process around every command, and the
twenty-eighth pass's new code). Each test fails without its fix (checked by reverting ``src``
and running it):

- **A user's process limit (``ulimit -u``) was a traceback, or sent the user the wrong way.**
  ``RLIMIT_NPROC`` counts every process and thread of the real user's, and binds every user but
  root. Under ``ulimit -u 2`` every command that starts a thread (``runner.run`` with a timeout:
  doctor's probes; ``deadlines.within``: fetch's index page; the build's progress) ended in
  "RuntimeError: can't start new thread", a traceback. Under ``ulimit -u 1`` the fork of a
  program said "cannot run /usr/bin/gcc: Resource temporarily unavailable (it is not an
  executable program) / To fix: pass the path of an executable in place of /usr/bin/gcc"
  (doctor, apply, export-header, build), and GitPython's import, whose ``git version`` could not
  be forked, said git "is not a working git / install git" (fetch). Under ``ulimit -u 3`` to
  ``5`` nvcc, whose own children could not start ("Failed to preprocess host compiler
  properties", "vfork: Resource temporarily unavailable"), had doctor and the build's preflight
  say "use a CUDA toolkit >= 12.8". Now each names the limit and how to raise it
  (``oserrors.process_limit``, ``no_thread``, and ``child_limit_fix`` when this user runs
  within a few tasks of the limit).

Nothing is mocked: the limit is real. Root is exempt from ``RLIMIT_NPROC``, so each child runs
with another real user id and no capabilities (``setpriv --ruid``; the effective user stays
root, so the kit's interpreter stays reachable where it lives in a folder only root may enter);
skipped where setpriv or prlimit is missing or the tests do not run as root. The ld.so drops
``TMPDIR`` in such a child (a secure-mode exec), so its private folders are made in /tmp."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

SRC = str(Path(__file__).resolve().parents[2] / "src")
UID = "4000029"  # a user id no process of this machine runs as: its count starts at 0

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("prlimit"),
    reason="needs root, setpriv and prlimit to run a child under another user's process limit")


def _limited(tmp_path: Path, nproc: int, *args: str, **extra: str
             ) -> subprocess.CompletedProcess[str]:
    """``args`` run with ``ulimit -u nproc`` as the real user UID (no capabilities)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(PYTHONPATH=SRC, **extra)
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    argv = [shutil.which("setpriv") or "setpriv", "--ruid", UID, "--bounding-set", "-all",
            "--inh-caps", "-all", shutil.which("prlimit") or "prlimit", f"--nproc={nproc}",
            *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120,
                          check=False, cwd=cwd)


def _kv(tmp_path: Path, nproc: int, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return _limited(tmp_path, nproc, sys.executable, "-m", "kvprefetch", *args, **extra)


def _says_the_limit(res: subprocess.CompletedProcess[str]) -> None:
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "Traceback" not in out, out
    assert "`ulimit -u`: now" in out, out
    assert "not an executable program" not in out, out
    assert "install git" not in out, out


def test_a_fork_refused_names_the_process_limit(tmp_path: Path) -> None:
    # doctor's first program (gcc, git, nvcc: whichever it starts first) cannot be forked
    res = _kv(tmp_path, 1, "doctor", "--workdir", str(tmp_path / "w"))
    _says_the_limit(res)
    assert "cannot start /" in res.stderr, res.stderr


def test_a_thread_refused_is_no_traceback(tmp_path: Path) -> None:
    # fetch's index page is asked for in a thread of its own (deadlines.within) before any
    # program is started: "RuntimeError: can't start new thread" was a traceback
    res = _kv(tmp_path, 1, "fetch", "--source", "sdist", "--workdir", str(tmp_path / "w"),
              PIP_INDEX_URL="http://127.0.0.1:1/")
    _says_the_limit(res)
    assert "can't start new thread" in res.stderr, res.stderr


def test_gitpython_not_forked_is_not_a_missing_git(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("no git")
    res = _kv(tmp_path, 1, "fetch", "--workdir", str(tmp_path / "w"),
              PIP_INDEX_URL="http://127.0.0.1:1/")
    _says_the_limit(res)
    assert "not a working git" not in res.stderr, res.stderr


def test_a_child_that_failed_near_the_limit_is_sent_to_it(tmp_path: Path) -> None:
    # nvcc under `ulimit -u 3`: its own children were not started, and it says only this
    probe = ("from kvprefetch.oserrors import child_limit_fix; print(child_limit_fix("
             "'nvcc fatal   : Failed to preprocess host compiler properties.'))")
    res = _limited(tmp_path, 4, sys.executable, "-c", probe)
    assert res.returncode == 0, res.stderr
    assert "`ulimit -u`: now 4" in res.stdout, res.stdout
    # far from any limit (root, or no limit), the same output keeps the caller's own fix
    free = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": SRC},
                          capture_output=True, text=True, timeout=60, check=False)
    assert free.stdout.strip() == "None", free.stdout + free.stderr
