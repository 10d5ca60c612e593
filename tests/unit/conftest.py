"""The unit layer: pure tests that run in seconds, with no process and no network.

Every test under ``tests/unit`` runs under an autouse guard, as cibuildwheel's ``unit_test/``
blocks ``Popen``: starting a process (``subprocess``, ``os.fork``/``exec*``/``spawn*``/
``posix_spawn``/``system``/``popen``, ``multiprocessing``) or connecting to a non-local address
raises ``UnitTestIsolationError`` naming the test. The error derives from ``BaseException`` so
that an ``except Exception`` in the code under test cannot swallow it, and the guard also fails
the test at teardown if something swallowed it anyway. A test that needs a real process or the
network belongs in ``tests/integration``."""

from __future__ import annotations

import ipaddress
import multiprocessing.process
import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest


class UnitTestIsolationError(BaseException):
    """A unit test started a process or reached the network."""


_PROCESS_FUNCTIONS = ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "popen",
                      "execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp",
                      "execvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve",
                      "spawnvp", "spawnvpe")
_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", ""}


def _is_local(address: Any) -> bool:
    """True for a Unix socket path or a loopback host (by address or by the name localhost)."""
    if not isinstance(address, tuple) or not address:
        return True  # AF_UNIX path (str/bytes) or abstract socket
    host = address[0]
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if not isinstance(host, str):
        return False
    if host.lower() in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False  # another host name: resolving it is already reaching out


@dataclass
class IsolationGuard:
    """What the guard caught in one test: ``violations`` (each a sentence). A test of the guard
    itself clears it after checking, so that the teardown check passes."""

    who: str  # "unit test <nodeid>", or the module being imported
    violations: list[str] = field(default_factory=list)

    def refuse(self, what: str) -> UnitTestIsolationError:
        message = (f"{self.who} {what}. Unit tests start no process and reach no "
                   "network; move the test to tests/integration/, or fake the call.")
        self.violations.append(message)
        return UnitTestIsolationError(message)


def install_guard(monkeypatch: pytest.MonkeyPatch, guard: IsolationGuard) -> None:
    """Patch every way to start a process or reach the network so that it raises."""

    def popen_init(self: subprocess.Popen[Any], args: Any, *a: Any, **k: Any) -> None:
        raise guard.refuse(f"started a process: subprocess.Popen({args!r})")

    monkeypatch.setattr(subprocess.Popen, "__init__", popen_init)

    def blocked(name: str) -> Callable[..., Any]:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            shown = ", ".join(repr(a) for a in args[:2])
            raise guard.refuse(f"started a process: os.{name}({shown})")
        return refuse

    for name in _PROCESS_FUNCTIONS:
        if hasattr(os, name):
            monkeypatch.setattr(os, name, blocked(name))

    def process_start(self: multiprocessing.process.BaseProcess) -> None:
        raise guard.refuse(f"started a process: multiprocessing {type(self).__name__}.start()")

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", process_start)

    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def connect(self: socket.socket, address: Any) -> None:
        if not _is_local(address):
            raise guard.refuse(f"connected to the network: socket.connect({address!r})")
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        if not _is_local(address):
            raise guard.refuse(f"connected to the network: socket.connect_ex({address!r})")
        return real_connect_ex(self, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host is not None and not _is_local((host,)):
            raise guard.refuse(f"looked up a network host: socket.getaddrinfo({host!r})")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


_preloaded = False


def import_with_side_effects() -> None:
    """Import torch and cuda-python's driver bindings, those installed, before any guard is up:
    the first import of either runs ``ldconfig -p`` (cuda.pathfinder through
    ctypes.util.find_library). That process belongs to loading the library, not to whichever
    test or module happens to import it first. torch brings the bindings along, so where torch
    is installed its import is the one that runs it; the unit layer runs without torch too
    (tests/integration/test_unit_layer.py), and there the bindings' own import does. Neither
    is required: the unit tests never need torch."""
    global _preloaded
    if _preloaded:
        return
    _preloaded = True
    import importlib.util
    import warnings

    if importlib.util.find_spec("torch") is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch  # noqa: F401
    if importlib.util.find_spec("cuda") is not None and \
            importlib.util.find_spec("cuda.bindings") is not None:
        import cuda.bindings.driver  # noqa: F401


def check_guard(guard: IsolationGuard) -> None:
    """Fail with every violation the guard caught, even one the code under test swallowed."""
    if guard.violations:
        pytest.fail("\n".join(guard.violations), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[Any]:
    """Importing a unit test module is guarded too: a process started at import time (say, a
    module-level list read from a child's output) is a collection error naming the module."""
    if not isinstance(collector, pytest.Module):
        return (yield)
    import_with_side_effects()
    monkeypatch = pytest.MonkeyPatch()
    install_guard(monkeypatch,
                  IsolationGuard(f"unit test module {collector.nodeid}, while importing,"))
    try:
        return (yield)
    finally:
        monkeypatch.undo()


_OTHER_LAYERS = ("slow", "gpu", "slurm")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A unit test marked slow, gpu or slurm is in the wrong layer: refuse the run, naming it."""
    here = Path(__file__).parent
    wrong = [f"{item.nodeid} (marked {m})" for item in items if here in item.path.parents
             for m in _OTHER_LAYERS if item.get_closest_marker(m) is not None]
    if wrong:
        raise pytest.UsageError("tests/unit holds only fast tests; move these to tests/integration "
                                "or tests/gpu:\n  " + "\n  ".join(wrong))


@pytest.fixture(scope="session", autouse=True)
def matplotlib_ready(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """matplotlib's first use in a process builds its font cache, and to build it runs
    ``fc-list`` (``subprocess.Popen``). Under the guard that fails whichever plotting test comes
    first -- but only on a machine whose ``~/.cache/matplotlib`` is still empty: a new user's
    first run, never the developer's (issue 42). So, once per session and before any guard arms
    (a session fixture is set up before the function-scoped guard): point ``MPLCONFIGDIR`` at a
    session temporary directory, so that every run starts from the empty cache a new machine
    has and never reads or writes the user's; select Agg (no display); build the font cache.
    The process it starts belongs to loading matplotlib, as torch's ``ldconfig`` does to
    loading torch (``import_with_side_effects``). Without matplotlib (no ``plot`` extra) the
    plotting tests skip themselves and this does nothing."""
    import importlib.util
    import sys

    if importlib.util.find_spec("matplotlib") is None:
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        if "matplotlib" not in sys.modules:  # the config dir is read once, on first import
            mp.setenv("MPLCONFIGDIR", str(tmp_path_factory.mktemp("matplotlib")))
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import font_manager

        font_manager.findfont("DejaVu Sans")  # the cache is built by now (import), and usable
        yield


@pytest.fixture(autouse=True)
def isolation_guard(request: pytest.FixtureRequest,
                    monkeypatch: pytest.MonkeyPatch) -> Iterator[IsolationGuard]:
    """Fail the test if it starts a process or reaches the network (see the module docstring)."""
    guard = IsolationGuard(f"unit test {request.node.nodeid}")
    install_guard(monkeypatch, guard)
    yield guard
    check_guard(guard)
