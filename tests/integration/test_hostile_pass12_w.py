"""Issue 41, the twelfth hostile pass (tester w: the acts by path the eleventh pass's sweep
listed and nobody had attacked). Each test fails without its fix (checked by reverting ``src``
and running it).

Where a test calls the kit's function in this process instead of the CLI (the environment's
creation), it says so: the CLI would go on to compile for minutes after it, and the act under
test is the same function. The racing process (the swap loop) is a real process, the files
are real. The autouse ``outside`` fixture checks that a folder outside the work directory is
byte-identical afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.helpers import tree_bytes
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

# renameat2(RENAME_EXCHANGE) flips a folder and a link to the outside (pass 11 t's swapper)
_SWAPPER = r'''
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
folder, target, stop = sys.argv[1], sys.argv[2], sys.argv[3]
link = folder + ".swap"
os.symlink(target, link)
def exchange():
    if libc.renameat2(-100, folder.encode(), -100, link.encode(), 2) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")
print("ready", flush=True)
while not os.path.exists(stop):
    exchange()
    time.sleep(0.001)
    exchange()
    time.sleep(0.001)
os.unlink(link)
'''


def _work(tmp_path: Path) -> Path:
    """A work directory with an ownership record (the kit's own, written by the kit)."""
    from kvprefetch.workspace import ownership

    work = tmp_path / "work"
    (work / "envs").mkdir(parents=True)
    ownership.record(work, work / "state" / "baseline.json", "state")
    return work


def _venv(path: Path):  # type: ignore[no-untyped-def]
    from kvprefetch.machine.envs import VenvEnv

    return VenvEnv(path, python=sys.executable, system_site_packages=True, with_pip=False)


def test_a_users_folder_named_like_an_env_temporary_is_kept(tmp_path: Path) -> None:
    """Environment creation removed every ``envs/<tree>.tmp-*`` as "debris", whatever it was:
    a user's ``envs/baseline.tmp-mine/notes.txt`` was deleted by a kernels-only ``build``
    (seen with the CLI). Now only a temporary the ownership record names as a dead run's goes;
    the user's folder stays. (``VenvEnv.create`` is called as the build calls it.)"""
    from kvprefetch.workspace import ownership

    work = _work(tmp_path)
    mine = work / "envs" / "baseline.tmp-mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes\n")
    dead = work / "envs" / "baseline.tmp-999999"  # a killed creation's, recorded
    (dead / "bin").mkdir(parents=True)
    ownership.record(work, dead, "tmp", pid=999999)
    env = _venv(work / "envs" / "baseline").create(owner=work)
    assert env.exists()
    assert (mine / "notes.txt").read_text() == "my notes\n"
    assert not dead.exists()
    assert "envs/baseline.tmp-999999" not in ownership.entries(work)


def test_env_creation_under_a_swap_loop_on_envs_acts_on_nothing_outside(
        tmp_path: Path) -> None:
    """``envs/`` swapped for a link to a folder outside and back while environments are made:
    the creation looked for a killed run's stamp, removed the half-made env, the temporaries
    and the stamp, made the folder, ran venv and renamed by path, so the outside folder's own
    ``<tree>/`` (beside a ``.<tree>.creating``) was deleted in 3 runs of 11 of the CLI. Now the
    kit removes, renames and writes relative to folders opened without following a link, and
    venv builds in a private folder outside the work directory: each creation succeeds or is
    refused, and nothing outside changes (a folder outside holding them).
    (``VenvEnv.create`` is called here, 12 environments, as the build calls it.)"""
    from kvprefetch.errors import KvprefetchError, LockError

    work = _work(tmp_path)
    outside = tmp_path / "victim"
    outside.mkdir()
    names = [f"t{i}" for i in range(12)]
    for n in names:  # what a swapped-in envs/ shows the creation: a stamp and a "half-made" env
        (outside / f".{n}.creating").write_text('{"pid": 1}\n')
        (outside / n).mkdir()
        (outside / n / "keep.txt").write_text("the user's\n")
        (outside / f"{n}.tmp-1").mkdir()
        (outside / f"{n}.tmp-1" / "keep.txt").write_text("the user's\n")
    before = tree_bytes(outside)
    stop = tmp_path / "stop-swapping"
    swapper = subprocess.Popen([sys.executable, "-c", _SWAPPER, str(work / "envs"),
                                str(outside), str(stop)], stdout=subprocess.PIPE, text=True)
    made = refused = 0
    try:
        assert swapper.stdout is not None and swapper.stdout.readline().strip() == "ready"
        for n in names:
            for _ in range(400):  # a lock refused (envs/ a link at that moment) is no try
                try:
                    _venv(work / "envs" / n).create(owner=work)
                    made += 1
                except LockError:
                    time.sleep(0.005)
                    continue
                except (KvprefetchError, OSError):
                    refused += 1
                break
    finally:
        stop.touch()
        swapper.wait(timeout=30)
        if swapper.stdout is not None:
            swapper.stdout.close()
    assert swapper.returncode == 0, "the swap loop stopped early"
    assert tree_bytes(outside) == before, "the creation acted on the folder outside"
    assert made + refused == len(names), (made, refused)
    assert os.path.isdir(work / "envs") and not os.path.islink(work / "envs")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
