"""Issue 41, the forty-second hostile pass (tester a: the original pass redone against HEAD).
Each test fails without its fix (checked by reverting ``src`` and running it):

- **A planted ``pristine/git/.git/config`` ran a program on a plain ``fetch``.** The work
  directory is data, ``pristine/git``'s git configuration included. ``fetch`` (``--source
  auto``, the default) read the kept clone's HEAD with GitPython's ``repo.head.commit``, which
  runs ``git cat-file``; a config that made the clone a partial one (``extensions.
  partialClone``, ``remote.origin.promisor``) with HEAD naming a missing commit had git fetch it
  lazily through the program ``remote.origin.uploadpack`` names: it ran as the user and wrote
  outside the work directory (and the error blamed the git module). The HEAD is now read from
  the refs by GitPython itself, with no git run (``sources/gitpython.head``)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from kvprefetch import upstream
from tests.integration.test_reliability import cli, outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_a_planted_clone_config_runs_no_program_on_fetch(fetched_workdir: Path,
                                                         tmp_path: Path) -> None:
    work = fetched_workdir
    marker = tmp_path / "ran"
    clone = work / "pristine" / "git"
    (clone / "csrc" / "attention").mkdir(parents=True)
    shutil.copy(work / "pristine" / "sdist" / upstream.ATTENTION_HEADER,
                clone / upstream.ATTENTION_HEADER)
    _git(clone, "init", "-q")
    for key, value in (("core.repositoryformatversion", "1"),
                       ("extensions.partialClone", "origin"),
                       ("remote.origin.url", str(clone)),
                       ("remote.origin.promisor", "true"),
                       ("remote.origin.uploadpack", f"sh -c 'touch {marker}; exit 1' x")):
        _git(clone, "config", key, value)
    head = (clone / ".git" / "HEAD").read_text().split("ref: ", 1)[1].strip()
    (clone / ".git" / head).parent.mkdir(parents=True, exist_ok=True)
    (clone / ".git" / head).write_text(upstream.GIT_COMMIT_PREFIX.ljust(40, "0") + "\n")
    record = work / ".kvprefetch-owned.json"
    owned = json.loads(record.read_text())
    owned["paths"]["pristine/git"] = {"kind": "pristine", "digest": "0" * 64}
    record.write_text(json.dumps(owned))

    res = cli("fetch", "--workdir", str(work))
    assert "Traceback" not in res.stderr, res.stderr
    assert not marker.exists(), "fetch ran the program the work directory's git config names"
