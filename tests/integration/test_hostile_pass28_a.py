"""Issue 41, the twenty-eighth hostile pass, tester a (the work directory's commands: pass 27's
own fixes attacked, Python children and the work directory's name, swaps during long
commands). Each test fails without its fix (checked by reverting ``src`` and running it):

- **A hang**: ``fetch --source DIR`` of a clone whose objects are in an alternate object store
  that pass 27's walk (``sources.local_repo``) does not reach: an alternate named by the
  alternate's own ``info/alternates`` (git follows them in turn), and a line of
  ``objects/info/alternates`` that git reads C-quoted (``"/store"``, which the walk took as a
  relative folder named with the quotes). A FIFO loose object there made ``git clone`` wait
  (both past 40 s by hand, with a real repository whose only copy of the commit was there).
  Now each alternate's own alternates are walked, and a quoted line is unquoted as git does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.integration.test_hostile_pass20_a import _env
from tests.integration.test_hostile_pass27_a import _repo


def _fetch(repo: Path, work: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvprefetch", "fetch", "--source", str(repo),
                           "--workdir", str(work)], env=_env(work.parent), capture_output=True,
                          text=True, timeout=20, check=False)


def test_a_fifo_in_an_alternate_of_an_alternate_or_a_quoted_alternate_is_named(
        tmp_path: Path) -> None:
    store = tmp_path / "store"
    (store / "7c").mkdir(parents=True)
    fifo = store / "7c" / ("1" * 38)
    os.mkfifo(fifo)
    (tmp_path / "mid" / "info").mkdir(parents=True)
    (tmp_path / "mid" / "info" / "alternates").write_text(f"{store}\n")
    nested = _repo(tmp_path / "nested")
    (nested / ".git" / "objects" / "info" / "alternates").write_text(f"{tmp_path / 'mid'}\n")
    quoted = _repo(tmp_path / "quoted")
    # git's C-quoting: "\163" is an 's'
    (quoted / ".git" / "objects" / "info" / "alternates").write_text(
        '"' + str(tmp_path / "\\163tore") + '"\n')
    for repo in (nested, quoted):
        res = _fetch(repo, tmp_path / f"work-{repo.name}")
        assert res.returncode == 3 and "Traceback" not in res.stderr, res.stderr
        assert f"{fifo}, which is a FIFO" in res.stderr, res.stderr
        # the FIFO is in the alternate store, not in the repository: the fix names it alone
        assert f"remove or replace {fifo}," in res.stderr and f"from {repo}" not in res.stderr


def test_a_loop_of_alternates_ends(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    (tmp_path / "a" / "info").mkdir(parents=True)
    (tmp_path / "a" / "info" / "alternates").write_text(f"{repo / '.git' / 'objects'}\n")
    (repo / ".git" / "objects" / "info" / "alternates").write_text(
        '"' + str(tmp_path / "a") + '"\n' + "\n".join(["../../a"] * 10_000) + "\n")
    res = _fetch(repo, tmp_path / "work")
    assert "Traceback" not in res.stderr, res.stderr
    assert "FIFO" not in res.stderr, res.stderr
