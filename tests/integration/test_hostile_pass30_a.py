"""Issue 41, the thirtieth hostile pass, tester a (the work directory's commands, and the
newest code: ``machine/uvconfig.py``, partial downloads, ``kitinfo``). Each test fails without
its fix (checked by reverting ``src`` and running it):

- **A hang**: uv reads its configuration file whole, waiting on it. A ``UV_CONFIG_FILE``
  naming a FIFO, ``/proc/kmsg`` or ``/dev/zero`` (uv's own setting, which the kit leaves to
  uv) kept ``build --mode overlay`` in its first ``uv venv`` for ever, with no output (75 s
  by hand, then killed); a user's ``~/.config/uv/uv.toml`` linked to ``/proc/kmsg`` was
  passed to uv by the kit itself (``--config-file``). Such a file is now refused before uv
  starts, with the fix (``machine.uvconfig.check_readable``).
- **A wrong-way message**: a relative ``UV_CONFIG_FILE`` (``myuv.toml``, in the folder the
  user ran the kit from) made ``build --mode overlay`` stop on uv's "failed to open file
  `myuv.toml`: No such file or directory" with "read the log above": the kit starts uv in an
  empty folder of its own, where the file is not. It is now named to uv from the user's folder,
  absolute (``--config-file``, which wins over the variable; ``machine.uvconfig``).
- **A record lost inside the work directory** (found under a swap loop: ``fetch --force
  --only patched`` while ``trees/`` was exchanged with a link, 10 runs): the twenty-ninth
  pass's fix keeps a temporary's record when a link is on the way as the failed run ends, but
  the look came before the remove and the "is it gone" check after it, by path: ``trees/``
  swapped in between made ``trees/.patched.tmp-PID``, still in place, look gone through the
  link, and its record was forgotten; ``clean --what all --discard-edits`` then kept it as "not
  created by kvprefetch". Gone is now judged in its folder opened without following a link
  (``confine.absent``, from ``ownership.temporary``).

Real uv (the kit's ``test`` extra), a real FIFO, a real ``uv venv`` through the kit's
``make_env``; nothing is mocked.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvprefetch.overlay.install import find_uv

SCRIPT = r"""
import os, sys
import kvprefetch.workspace.ownership  # the runner's private folders, as every command has
from kvprefetch.errors import KvprefetchError
from kvprefetch.machine.envs import make_env
from kvprefetch.overlay.install import find_uv

try:
    make_env("uv", os.path.join(sys.argv[1], "env"), python=sys.executable, uv=find_uv()).create()
except KvprefetchError as exc:
    print("REFUSED", exc)
    sys.exit(3)
print("MADE")
"""


# trees/ exchanged with a link to a folder outside, as fast as it goes; on SIGTERM it ends
# with the two names where they were
SWAP = r"""
import ctypes, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
a, b = sys.argv[1].encode(), sys.argv[2].encode()
n = [0]
def stop(*_):
    if n[0] % 2:
        libc.renameat2(-100, a, -100, b, 2)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
while True:
    time.sleep(0.001)
    if libc.renameat2(-100, a, -100, b, 2) == 0:  # RENAME_EXCHANGE
        n[0] += 1
"""


@pytest.fixture(autouse=True)
def _needs_uv() -> None:
    if find_uv() is None:
        pytest.skip("uv is not installed (the kit's `test` extra installs it)")


def _make_env(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("UV_", "XDG_CONFIG")) and k != "VIRTUAL_ENV"}
    (tmp_path / "t").mkdir()
    (tmp_path / "home").mkdir()
    env.update(TMPDIR=str(tmp_path / "t"), HOME=str(tmp_path / "home"),
               UV_CACHE_DIR=str(tmp_path / "uv-cache"),
               PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]))
    env.update(extra)
    # a session of its own: without the fix uv waits for ever, and is killed with its parent
    with subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path)], env=env, cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail("uv venv still waiting after 20 s on its configuration file")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_uv_config_file_uv_would_wait_on_is_refused(tmp_path: Path, kind: str) -> None:
    if kind == "fifo":
        path = tmp_path / "uv.toml"
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
    res = _make_env(tmp_path, UV_CONFIG_FILE=str(path))
    assert res.returncode == 3, res.stdout + res.stderr
    assert "REFUSED" in res.stdout and f"UV_CONFIG_FILE {path}" in res.stdout, res.stdout
    assert "To fix: point UV_CONFIG_FILE at a uv.toml file" in res.stdout, res.stdout
    assert "Traceback" not in res.stderr, res.stderr
    assert not (tmp_path / "env").exists()


def test_a_users_uv_toml_linked_to_a_kernel_file_is_refused(tmp_path: Path) -> None:
    kmsg = "/proc/kmsg"
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        pytest.skip("/proc/kmsg cannot be opened here (not root, or no CAP_SYSLOG)")
    try:
        os.read(fd, 1)
        waits = False
    except BlockingIOError:
        waits = True
    finally:
        os.close(fd)
    if not waits:
        pytest.skip("/proc/kmsg holds messages here: its read does not wait")
    config = tmp_path / "config"
    (config / "uv").mkdir(parents=True)
    (config / "uv" / "uv.toml").symlink_to(kmsg)
    res = _make_env(tmp_path, XDG_CONFIG_HOME=str(config))
    assert res.returncode == 3, res.stdout + res.stderr
    assert f"{config / 'uv' / 'uv.toml'} is a kernel file whose read waits" in res.stdout, \
        res.stdout
    assert "UV_NO_CONFIG=1" in res.stdout, res.stdout


def test_a_regular_uv_config_file_is_still_read(tmp_path: Path) -> None:
    cfg = tmp_path / "mine.toml"
    cfg.write_text("")  # empty: no settings, and no wait
    res = _make_env(tmp_path, UV_CONFIG_FILE=str(cfg))
    assert res.returncode == 0 and "MADE" in res.stdout, res.stdout + res.stderr


def test_a_relative_uv_config_file_is_read_from_the_users_folder(tmp_path: Path) -> None:
    (tmp_path / "myuv.toml").write_text("")  # in the folder the kit is started from
    res = _make_env(tmp_path, UV_CONFIG_FILE="myuv.toml")
    assert res.returncode == 0 and "MADE" in res.stdout, res.stdout + res.stderr


def test_a_temporary_left_behind_a_swapped_link_stays_recorded(tmp_path: Path) -> None:
    from kvprefetch.errors import KvprefetchError
    from kvprefetch.workspace import confine, ownership
    from kvprefetch.workspace.workdir import Workdir

    root = tmp_path / "wd"
    Workdir(root).ensure()
    trees, victim, link = root / "trees", tmp_path / "victim", root / "tl"
    trees.mkdir()
    victim.mkdir()
    link.symlink_to(victim)
    # another process (a thread would share the interpreter's lock, and rarely swap mid-step)
    swapper = subprocess.Popen([sys.executable, "-c", SWAP, str(trees), str(link)])
    try:
        end, i = time.monotonic() + 4, 0
        while time.monotonic() < end:
            i += 1
            path = trees / f".t{i}.tmp-{os.getpid()}"
            try:
                with ownership.temporary(root, path):
                    fd = confine.open_dir(trees, root=root)
                    try:
                        os.mkdir(path.name, dir_fd=fd)  # in the real trees/, never a link's
                    finally:
                        os.close(fd)
                    raise RuntimeError("the step fails")
            except (KvprefetchError, OSError, RuntimeError):
                pass
    finally:
        swapper.send_signal(signal.SIGTERM)  # it stops with the two names as they were
        swapper.wait()
    libc = ctypes.CDLL(None, use_errno=True)
    if trees.is_symlink():
        libc.renameat2(-100, bytes(trees), -100, bytes(link), 2)
    assert not trees.is_symlink() and link.is_symlink()
    assert list(victim.iterdir()) == []
    left = sorted(p for p in trees.iterdir() if p.name.startswith(".t"))
    lost = [p.name for p in left if ownership.owned(root, p) is None]
    assert not lost, f"{len(lost)} of {len(left)} temporaries left in trees/ were forgotten"
