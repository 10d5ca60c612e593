"""Issue 41, the twenty-seventh hostile pass, tester a (the work directory's commands: pass 26's
own fixes attacked, Python children started from ``/``, swaps during long commands). Each test
fails without its fix (checked by reverting ``src`` and running it):

- **Code was taken from a work directory at ``/``** (``runner.NEUTRAL_CWD``): the kit starts
  its Python children (the interpreter probe ``python -c 'import json, sys, sysconfig ...'``,
  ``-m venv``, ``-m ensurepip``, pip, the overlay's installed-versions check) in ``/``, so that
  the user's folder is not first on their ``sys.path``; but ``-c`` and ``-m`` put ``/`` there,
  and a work directory at ``/json`` is one of its folders: its writer's ``json/__init__.py``
  ran in ``build --kernels-only``'s base-interpreter probe (1 of 1 by hand; then "module
  'json' has no attribute 'dumps'"). A child given ``NEUTRAL_CWD`` now starts in a new empty
  folder of its own (``ownership.private_dir``), removed when it ends.
- **A traceback**: ``python -m kvprefetch`` run in a folder deleted after the shell entered it
  (``__main__``): pass 26's drop of the working folder from ``sys.path`` called
  ``os.getcwd()``, a FileNotFoundError traceback before any command ran (``-m`` puts nothing
  first there). Now the command runs, and one that needs the folder says to ``cd`` elsewhere.
- **A hang**: ``fetch --source DIR`` of a clone whose git folder reaches a FIFO through what
  pass 26's walk of ``.git`` does not enter (``sources.local_repo``, was
  ``sources.fetch._check_local_repo``): a folder of it that is a link (``.git/refs`` -> a
  folder holding a FIFO ``heads/main``), the git folder a ``.git`` *file* names (``gitdir:
  /elsewhere``, a worktree's or submodule's) with a FIFO ``HEAD``, and an object folder its
  ``objects/info/alternates`` lists: ``git clone`` waited for ever (both first ones past 60 s
  by hand). These are walked too, each folder once (a loop of links ends).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvprefetch.runner import NEUTRAL_CWD, run
from tests.integration.test_hostile_pass20_a import _env

ROOT_WRITABLE = os.access("/", os.W_OK)


def _plant_at_root(name: str) -> Path:
    """A package ``name`` in a folder at ``/`` (a work directory there, its writer's file)."""
    top = Path("/") / name
    top.mkdir()
    (top / "__init__.py").write_text(
        "import os\nraise SystemExit('planted ' + __name__ + ' ran in ' + os.getcwd())\n")
    return top


@pytest.mark.skipif(not ROOT_WRITABLE, reason="needs a folder at / (run as root)")
def test_a_python_child_from_the_neutral_folder_imports_nothing_from_a_folder_at_root() -> None:
    name = f"kvp27a_{secrets.token_hex(4)}"
    top = _plant_at_root(name)
    try:
        for argv in ([sys.executable, "-c", f"import {name}"], [sys.executable, "-m", name]):
            res = run(argv, cwd=NEUTRAL_CWD, echo=False, check=False, timeout=60)
            assert "planted" not in res.output, res.output
            assert "No module named" in res.output, res.output
            assert res.returncode == 1
    finally:
        shutil.rmtree(top)


@pytest.mark.skipif(not ROOT_WRITABLE or os.path.lexists("/json"),
                    reason="needs /json free and / writable (run as root)")
def test_the_interpreter_probe_ignores_a_work_directory_at_slash_json() -> None:
    """``build --kernels-only``'s first step (the base interpreter's probe) with the work
    directory at ``/json``: the probe asked the planted package, not the standard library."""
    from kvprefetch.machine.envs import _base_python_info

    top = _plant_at_root("json")
    try:
        info = _base_python_info(sys.executable)
        assert info["executable"]
        assert os.listdir(top) == ["__init__.py"]
    finally:
        shutil.rmtree(top)


def test_the_neutral_folder_is_empty_private_and_gone_afterwards() -> None:
    res = run([sys.executable, "-c", "import os; print(os.getcwd()); print(os.listdir('.'))"],
              cwd=NEUTRAL_CWD, echo=False, timeout=60)
    folder, listing = res.output.splitlines()[-2:]
    assert listing == "[]"
    assert folder != "/" and "kvprefetch-cwd-" in folder
    assert not os.path.exists(folder)


def test_python_m_kvprefetch_in_a_deleted_folder_is_no_traceback(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    for args in ("--help", f"export-header --workdir {tmp_path / 'w'} -o hdr"):
        res = subprocess.run(
            ["bash", "-c", f'cd "$1" && rmdir "$1" && exec "$2" -m kvprefetch {args}', "-",
             str(gone), sys.executable], env=env, capture_output=True, text=True, timeout=60,
            check=False)
        gone.mkdir()
        out = res.stdout + res.stderr
        assert "Traceback" not in out, out
        assert res.returncode == 0 if args == "--help" else "cd into an existing folder" in out


def _repo(at: Path) -> Path:
    (at / ".git" / "refs" / "heads").mkdir(parents=True)
    (at / ".git" / "objects" / "info").mkdir(parents=True)
    (at / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return at


def test_a_fifo_the_git_folder_reaches_through_a_link_a_gitdir_or_alternates_is_named(
        tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "heads").mkdir(parents=True)
    os.mkfifo(elsewhere / "heads" / "main")
    linked = _repo(tmp_path / "linked")
    shutil.rmtree(linked / ".git" / "refs")
    (linked / ".git" / "refs").symlink_to(elsewhere)
    gitdir = tmp_path / "gitdir"
    (gitdir / "refs").mkdir(parents=True)
    os.mkfifo(gitdir / "HEAD")
    pointer = tmp_path / "pointer"
    pointer.mkdir()
    (pointer / ".git").write_text(f"gitdir: {gitdir}\n")
    alternate = _repo(tmp_path / "alternate")
    (tmp_path / "objects" / "pack").mkdir(parents=True)
    os.mkfifo(tmp_path / "objects" / "pack" / "x.idx")
    (alternate / ".git" / "objects" / "info" / "alternates").write_text(
        f"{tmp_path / 'objects'}\n")
    for repo, fifo in ((linked, linked / ".git" / "refs" / "heads" / "main"),
                       (pointer, gitdir / "HEAD"),
                       (alternate, tmp_path / "objects" / "pack" / "x.idx")):
        res = subprocess.run([sys.executable, "-m", "kvprefetch", "fetch", "--source", str(repo),
                              "--workdir", str(tmp_path / f"work-{repo.name}")],
                             env=_env(tmp_path), capture_output=True, text=True, timeout=20,
                             check=False)
        assert res.returncode == 3 and "Traceback" not in res.stderr, res.stderr
        assert f"{fifo}, which is a FIFO" in res.stderr, res.stderr


def test_a_loop_of_links_in_the_git_folder_ends(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    (repo / ".git" / "refs" / "loop").symlink_to(repo / ".git")
    (repo / ".git" / "objects" / "info" / "alternates").write_text(f"{repo / '.git' / 'objects'}\n")
    os.mkfifo(repo / ".git" / "objects" / "info" / "late")
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "fetch", "--source", str(repo),
                          "--workdir", str(tmp_path / "work")], env=_env(tmp_path),
                         capture_output=True, text=True, timeout=20, check=False)
    assert res.returncode == 3 and "Traceback" not in res.stderr, res.stderr
    assert "which is a FIFO" in res.stderr, res.stderr
