"""Issue 41, the twenty-fifth hostile pass, tester a (the work directory's commands: two kit
processes at once, hard links, xattrs and ACLs, every git the kit runs). Each test fails
without its fix (checked by reverting ``src`` and running it):

- **A ``git`` planted in ``pristine/git/`` ran on every ``fetch``** (``sources.fetch._gitpython``).
  GitPython runs a bare ``git`` in the repository it reads, and Python's ``subprocess`` looks
  a relative PATH entry up in the child's folder: with an empty entry in ``PATH`` (``PATH=:$PATH``,
  what ``PATH=$EXTRA:$PATH`` gives with ``EXTRA`` unset), ``fetch`` of a work directory fetched
  from git ran ``<workdir>/pristine/git/git cat-file --batch-check`` (1 of 1 by hand; also
  ``fetch --repair``), the kit started in another folder. The seventh pass's rule for ``git
  apply`` (``runner.which``: a relative entry looked up from the kit's own folder, made
  absolute) now holds for GitPython too.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.integration.test_hostile_pass20_a import _env
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: nothing outside the test's folders changes


def _kv(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args],
                          env=env or _env(tmp_path), cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


def test_a_git_planted_in_the_pristine_clone_never_runs(
        tmp_path: Path, vllm_git_repo: tuple[Path, str]) -> None:
    repo, sha = vllm_git_repo
    wd = tmp_path / "work"
    made = _kv(tmp_path, "fetch", "--workdir", str(wd), "--source", str(repo),
               "--allow-commit", sha)
    assert made.returncode == 0, made.stdout + made.stderr
    assert (wd / "pristine" / "git" / ".git").is_dir()
    marker = tmp_path / "planted-git-ran"
    planted = wd / "pristine" / "git" / "git"
    real = shutil.which("git")
    assert real is not None
    planted.write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\nexec {real} \"$@\"\n")
    planted.chmod(0o755)
    env = _env(tmp_path)
    env["PATH"] = ":" + env["PATH"]  # an empty entry: the current folder, as a shell reads it
    home = tmp_path / "elsewhere"  # the kit started in a folder of the user's, not the work dir
    home.mkdir()
    for args in (("fetch",), ("fetch", "--repair")):
        res = _kv(tmp_path, *args, "--workdir", str(wd), env=env, cwd=home)
        assert "Traceback" not in res.stderr, res.stderr
        assert not marker.exists(), f"{args}: ran {marker.read_text()!r}"
