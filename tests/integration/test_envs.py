"""Tests for kvprefetch.machine.envs with real venvs (stdlib venv without pip: fast) and real child
processes: isolation, reuse rules, interrupted creation, the lock, the precompiled refusal."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from kvprefetch.errors import ConfigError, LockError
from kvprefetch.machine.envs import (
    MARKER,
    CondaEnv,
    UvEnv,
    VenvEnv,
    available_backends,
    make_env,
    refuse_precompiled,
)
from kvprefetch.runner import run
from kvprefetch.workspace.locks import locked

PRINT_STATE = ("import json, os, sys; print(json.dumps({'prefix': sys.prefix, 'path': sys.path, "
               "'env': {k: os.environ.get(k) for k in ('PYTHONPATH', 'VIRTUAL_ENV', "
               "'CONDA_PREFIX', 'VLLM_USE_PRECOMPILED', 'PYTHONNOUSERSITE')}}))")


def child_state(env: VenvEnv, base: dict[str, str]) -> dict:  # type: ignore[type-arg]
    done = run([str(env.python), "-c", PRINT_STATE], env=env.environ(base), echo=False)
    return json.loads(done.output.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_two_real_venvs_are_isolated(tmp_path: Path, base_environ: dict[str, str]) -> None:
    a = VenvEnv(tmp_path / "envs" / "baseline", with_pip=False).create()
    b = VenvEnv(tmp_path / "envs" / "patched", with_pip=False).create()
    assert a.exists() and b.exists()
    # A bogus PYTHONPATH and another env's activation in the parent must not reach the child.
    bogus = tmp_path / "bogus-pythonpath"
    bogus.mkdir()
    parent = dict(base_environ, PYTHONPATH=str(bogus), VIRTUAL_ENV=str(b.path),
                  CONDA_PREFIX="/opt/elsewhere", VLLM_USE_PRECOMPILED="1",
                  PATH=os.pathsep.join([str(b.bin_dir), base_environ["PATH"]]))
    sa, sb = child_state(a, parent), child_state(b, parent)
    assert os.path.realpath(sa["prefix"]) == os.path.realpath(a.path)
    assert os.path.realpath(sb["prefix"]) == os.path.realpath(b.path)
    assert sa["prefix"] != sb["prefix"]
    assert str(bogus) not in sa["path"]
    assert sa["env"] == {"PYTHONPATH": None, "VIRTUAL_ENV": str(a.path), "CONDA_PREFIX": None,
                         "VLLM_USE_PRECOMPILED": None, "PYTHONNOUSERSITE": "1"}
    # b's bin was dropped from PATH for a (it is a foreign VIRTUAL_ENV); a's is first.
    path_a = a.environ(parent)["PATH"].split(os.pathsep)
    assert path_a[0] == str(a.bin_dir) and str(b.bin_dir) not in path_a
    # Control: without environ(), the bogus PYTHONPATH does reach the child.
    raw = run([str(a.python), "-c", PRINT_STATE], env=parent, echo=False)
    assert str(bogus) in json.loads(raw.output.strip().splitlines()[-1])["path"]
    # The site-packages each env reports is inside it.
    assert a.site_packages().is_relative_to(a.path)
    marker = json.loads((a.path / MARKER).read_text())
    assert marker["kind"] == "venv" and marker["state"] == "ready"


def test_system_site_packages_inherits_creator(tmp_path: Path,
                                               base_environ: dict[str, str]) -> None:
    """A kernels-only env sees the packages of the interpreter that created it (this test's
    interpreter has click), while its own prefix stays inside the env."""
    env = VenvEnv(tmp_path / "k", system_site_packages=True, with_pip=False).create()
    code = "import click, sys; print(click.__file__); print(sys.prefix)"
    out = run([str(env.python), "-c", code], env=env.environ(base_environ), echo=False).output
    click_file, prefix = out.strip().splitlines()[-2:]
    assert os.path.realpath(prefix) == os.path.realpath(env.path)
    import click
    assert os.path.realpath(click_file) == os.path.realpath(click.__file__)
    # The creator's scripts (pip's ninja, cmake) stay reachable, last on PATH, even when the
    # creator is an activated venv whose bin environ() drops as a foreign prefix.
    import sys
    import sysconfig
    scripts = sysconfig.get_paths()["scripts"]
    parent = dict(base_environ, VIRTUAL_ENV=sys.prefix,
                  PATH=os.pathsep.join([scripts, base_environ["PATH"]]))
    path = env.environ(parent)["PATH"].split(os.pathsep)
    assert path[0] == str(env.bin_dir) and path[-1] == scripts and path.count(scripts) == 1
    # Without it, the same import fails: the env really is isolated by default.
    iso = VenvEnv(tmp_path / "iso", with_pip=False).create()
    done = run([str(iso.python), "-c", "import click"], env=iso.environ(base_environ),
               echo=False, check=False)
    assert done.returncode != 0
    assert scripts not in iso.environ(parent)["PATH"].split(os.pathsep)


def test_reuse_same_kind_and_refuse_other_kind(tmp_path: Path) -> None:
    path = tmp_path / "env"
    env = VenvEnv(path, with_pip=False).create()
    before = env.python.stat().st_ino
    VenvEnv(path, with_pip=False).create()  # reused, not rebuilt
    assert env.python.stat().st_ino == before
    marker = json.loads((path / MARKER).read_text())
    marker["kind"] = "conda"
    (path / MARKER).write_text(json.dumps(marker))
    with pytest.raises(ConfigError) as exc:
        VenvEnv(path, with_pip=False).create()
    assert "'conda'" in exc.value.cause and "--force" in (exc.value.fix or "")
    VenvEnv(path, with_pip=False).create(force=True)
    assert json.loads((path / MARKER).read_text())["kind"] == "venv"


def test_refuse_different_options_and_foreign_dirs(tmp_path: Path) -> None:
    VenvEnv(tmp_path / "env", with_pip=False).create()
    with pytest.raises(ConfigError, match="options"):
        VenvEnv(tmp_path / "env", with_pip=False, system_site_packages=True).create()
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("user data")
    with pytest.raises(ConfigError) as exc:
        VenvEnv(foreign, with_pip=False).create(force=True)
    assert "not created by kvprefetch" in exc.value.cause
    assert (foreign / "precious.txt").read_text() == "user data"


def test_partial_create_is_not_reused(tmp_path: Path) -> None:
    path = tmp_path / "env"
    # Debris of a creation killed while building in its temp dir (pid 999999 is long gone).
    debris = tmp_path / "env.tmp-999999"
    (debris / "bin").mkdir(parents=True)
    (debris / "bin" / "python").write_text("not a python")
    env = VenvEnv(path, with_pip=False).create()
    assert not debris.exists()
    assert env.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".env.lock", "env"]


class _Interrupt(BaseException):
    pass


def test_create_killed_after_rename_is_redone(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Interrupt creation after the env was renamed into place but before it was checked and
    marked: the in-process cleanup removes everything. Then model a SIGKILL at the same point
    (the cleanup cannot run) by recreating the leftovers: the stamp and an unmarked env."""
    path = tmp_path / "env"

    def boom(self: VenvEnv) -> None:
        raise _Interrupt

    monkeypatch.setattr(VenvEnv, "_after_build", boom)
    with pytest.raises(_Interrupt):
        VenvEnv(path, with_pip=False).create()
    assert not path.exists() and not (tmp_path / ".env.creating").exists()
    monkeypatch.undo()

    # SIGKILL leftovers: build a real env, then strip its marker and restore the stamp.
    VenvEnv(path, with_pip=False).create()
    (path / MARKER).unlink()
    (tmp_path / ".env.creating").write_text('{"pid": 999999, "kind": "venv"}')
    assert not VenvEnv(path, with_pip=False).exists()
    env = VenvEnv(path, with_pip=False).create()
    assert env.exists() and not (tmp_path / ".env.creating").exists()


def _wait_until_the_group_is_gone(pgid: int) -> None:
    """``join`` returns once the child is reaped; a process of its group (one forked by the
    child and not yet exec'd, which shares the lock's open file) may still be dying on a loaded
    machine and hold the env's flock a moment longer (a fresh CI rehearsal: "another
    kvprefetch process (pid N) is already working on environment ..."). The SIGKILL reached the
    whole group; wait until the kernel has ended all of it."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)
    raise AssertionError(f"process group {pgid} still alive 30 s after its SIGKILL")


def _create_in_new_group(path: str) -> None:
    os.setsid()  # so the test can kill this process and the venv/ensurepip children it starts
    VenvEnv(path, with_pip=True).create()


def test_real_sigkill_mid_create(tmp_path: Path) -> None:
    """A real SIGKILL: a child process creates an env with pip (ensurepip runs for seconds after
    the env was renamed into place) and is killed, with its whole process group, mid-way. What
    it left must not count as an env, and the next create must redo it."""
    path = tmp_path / "env"
    # spawn, not fork (as below): a fork of this multithreaded process can block on a lock
    child = multiprocessing.get_context("spawn").Process(target=_create_in_new_group,
                                                         args=(str(path),))
    child.start()
    try:
        deadline = time.monotonic() + 60
        while not path.exists() and time.monotonic() < deadline and child.is_alive():
            time.sleep(0.02)
        assert path.exists() and not (path / MARKER).exists(), (
            f"the child never reached the interruptible point (alive: {child.is_alive()}, "
            f"exit code: {child.exitcode})")
    finally:
        assert child.pid is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.join()
        _wait_until_the_group_is_gone(child.pid)
    assert (tmp_path / ".env.creating").exists()
    assert not VenvEnv(path, with_pip=True).exists()
    env = VenvEnv(path, with_pip=False).create()  # debris cleared, no --force needed
    assert env.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".env.lock", "env"]


def _hold_lock(lock: str, ready: str) -> None:
    with locked(Path(lock), "test"):
        Path(ready).write_text("held")
        time.sleep(30)


def test_concurrent_create_is_locked(tmp_path: Path) -> None:
    path = tmp_path / "env"
    env = VenvEnv(path, with_pip=False)
    ready = tmp_path / "ready"
    holder = multiprocessing.get_context("fork").Process(
        target=_hold_lock, args=(str(env.lock_path), str(ready)))
    holder.start()
    try:
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists()
        with pytest.raises(LockError) as exc:
            env.create()
        assert str(holder.pid) in exc.value.cause
        assert not path.exists()
    finally:
        holder.kill()
        holder.join()
    env.create()  # the lock dies with its holder
    assert env.exists()


@pytest.mark.parametrize(("var", "value"), [
    ("VLLM_USE_PRECOMPILED", "1"), ("VLLM_USE_PRECOMPILED", "true"),
    ("VLLM_PRECOMPILED_WHEEL_LOCATION", "/tmp/vllm.whl"),
])
def test_refuse_precompiled(var: str, value: str) -> None:
    with pytest.raises(ConfigError) as exc:
        refuse_precompiled({var: value})
    assert var in exc.value.cause and "unset" in (exc.value.fix or "")


def test_precompiled_off_is_fine() -> None:
    refuse_precompiled({"VLLM_USE_PRECOMPILED": "0", "PATH": "/usr/bin"})
    refuse_precompiled({})


def test_backends_and_factory(tmp_path: Path, base_environ: dict[str, str]) -> None:
    assert available_backends(base_environ)[0] == "venv"
    assert isinstance(make_env("venv", tmp_path / "v"), VenvEnv)
    with pytest.raises(ConfigError):
        make_env("pipenv", tmp_path / "x")
    if "uv" not in available_backends(base_environ):
        with pytest.raises(ConfigError, match="uv"):
            UvEnv(tmp_path / "u")
    if "conda" not in available_backends(base_environ):
        with pytest.raises(ConfigError, match="conda"):
            CondaEnv(tmp_path / "c")


def test_python_outside_env_is_an_error(tmp_path: Path) -> None:
    """Replace the env's python link with a link to another env's python: the check notices."""
    a = VenvEnv(tmp_path / "a", with_pip=False).create()
    b = VenvEnv(tmp_path / "b", with_pip=False).create()
    for name in ("python", "python3"):
        (a.bin_dir / name).unlink()
        (a.bin_dir / name).symlink_to(b.python)
    # Without its pyvenv.cfg, a's python (now a link to b's, which links to the base python)
    # starts as the base interpreter: sys.prefix is outside a.
    (a.path / "pyvenv.cfg").unlink()
    with pytest.raises(ConfigError) as exc:
        a.check_python_inside()
    assert "resolves outside" in exc.value.cause


class _StopsInItsTemporaryDirectory(VenvEnv):
    """A real venv build that waits once its temporary directory holds the venv, so that the
    SIGKILL lands there every time: the real build renames it into place within about 0.1 s,
    a window a polling parent missed under load."""

    def _build(self, target: Path) -> None:
        super()._build(target)
        time.sleep(600)


def _create_owned_in_new_group(path: str, owner: str) -> None:
    os.setsid()
    _StopsInItsTemporaryDirectory(path, with_pip=True).create(owner=Path(owner))


def test_killed_create_in_a_work_dir_leaves_an_orphan_the_next_run_removes(tmp_path: Path) -> None:
    """A real SIGKILL while an env inside a kit work directory is being built in its temporary
    directory: that directory was recorded as the kit's (with the dead pid) before it existed,
    so the work directory's orphan sweep (run by fetch and clean) removes it, not only the next
    creation of the same env."""
    from kvprefetch.workspace import ownership

    root = tmp_path / "work"
    path = root / "envs" / "baseline"
    # spawn, not fork: a forked copy of this multithreaded test process can block on a lock
    # another thread held at the fork
    child = multiprocessing.get_context("spawn").Process(target=_create_owned_in_new_group,
                                                         args=(str(path), str(root)))
    child.start()
    assert child.pid is not None
    tmp = path.parent / f"{path.name}.tmp-{child.pid}"
    try:
        deadline = time.monotonic() + 60
        while not tmp.exists() and time.monotonic() < deadline and child.is_alive():
            time.sleep(0.01)
        assert tmp.exists(), (f"the child never reached its temporary directory {tmp} "
                              f"(alive: {child.is_alive()}, exit code: {child.exitcode})")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.join()
        _wait_until_the_group_is_gone(child.pid)
    assert tmp.exists() and tmp in ownership.orphans(root)
    assert ownership.remove_orphans(root) == [str(tmp)]
    assert not tmp.exists() and not path.exists()
    assert VenvEnv(path, with_pip=False).create(owner=root).exists()
    assert ownership.orphans(root) == []
