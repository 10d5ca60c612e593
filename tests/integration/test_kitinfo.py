"""``kit_info``'s commit is the kit checkout's own (issue 41, left open by the twenty-eighth
hostile pass and closed after it): a user's ``GIT_DIR``/``GIT_WORK_TREE`` made ``git
rev-parse HEAD`` answer for another repository, and a kit installed in a venv inside the
user's own git project was recorded at the project's commit. Real git, a real copy of the
package; each case runs in a fresh interpreter (``kit_info`` is cached per process)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import kvprefetch

SRC = Path(kvprefetch.__file__).resolve().parent.parent
CHECKOUT = SRC.parent
PROBE = "from kvprefetch.kitinfo import kit_info; print(kit_info().commit)"


def _git(*args: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def _other_repo(path: Path) -> str:
    path.mkdir(parents=True)
    _git("init", "-q", cwd=path)
    (path / "f").write_text("x\n")
    _git("add", "f", cwd=path)
    _git("commit", "-q", "-m", "other", cwd=path)
    return _git("rev-parse", "HEAD", cwd=path)


def _commit_seen(pythonpath: Path, cwd: Path, **extra: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(pythonpath), **extra)
    res = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_a_users_git_dir_never_names_the_kits_commit(tmp_path: Path) -> None:
    if not (CHECKOUT / ".git").exists():
        import pytest
        pytest.skip(f"the kit at {CHECKOUT} is not a git checkout (an installed copy)")
    other = tmp_path / "other"
    other_sha = _other_repo(other)
    own = _git("rev-parse", "HEAD", cwd=CHECKOUT)
    seen = _commit_seen(SRC, tmp_path, GIT_DIR=str(other / ".git"),
                        GIT_WORK_TREE=str(other))
    assert seen == own != other_sha


def test_a_kit_installed_inside_a_users_project_has_no_commit(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project_sha = _other_repo(project)
    site = project / ".venv" / "lib" / "site-packages"
    shutil.copytree(SRC / "kvprefetch", site / "kvprefetch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    assert _commit_seen(site, tmp_path) == "None" != project_sha
