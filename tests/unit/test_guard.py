"""The unit layer's guard (tests/unit/conftest.py) is up in every unit test: each way to start a
process, and a connection to a non-local address, raises UnitTestIsolationError naming the test;
local sockets still work; a violation that the code under test swallows still fails the test;
importing a module that starts a process is a collection error. If the guard rots, these fail."""

from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from tests.unit.conftest import IsolationGuard, UnitTestIsolationError, check_guard

ROUTES = {
    "subprocess.run": lambda: subprocess.run(["true"], check=False),
    "subprocess.Popen": lambda: subprocess.Popen([sys.executable, "-c", "pass"]),
    "os.system": lambda: os.system("true"),
    "os.popen": lambda: os.popen("true"),
    "os.fork": lambda: os.fork(),
    "os.posix_spawn": lambda: os.posix_spawn("/bin/true", ["true"], dict(os.environ)),
    "os.execv": lambda: os.execv("/bin/true", ["true"]),
    "os.spawnv": lambda: os.spawnv(os.P_WAIT, "/bin/true", ["true"]),
    "multiprocessing": lambda: multiprocessing.get_context("fork").Process(target=print).start(),
}


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_starting_a_process_raises_naming_the_test(route: str,
                                                   isolation_guard: IsolationGuard) -> None:
    with pytest.raises(UnitTestIsolationError) as exc:
        ROUTES[route]()
    assert str(exc.value).startswith(isolation_guard.who + " started a process")
    assert ("tests/unit/test_guard.py::test_starting_a_process_raises_naming_the_test"
            in isolation_guard.who)
    assert "tests/integration/" in str(exc.value)
    assert isolation_guard.violations  # recorded, so swallowing it would not help
    isolation_guard.violations.clear()  # checked: let this test pass


def test_the_error_is_not_an_exception() -> None:
    """`except Exception` in the code under test cannot swallow it."""
    assert not issubclass(UnitTestIsolationError, Exception)


@pytest.mark.parametrize("connect", [
    lambda s: s.connect(("192.0.2.1", 443)),  # TEST-NET-1: never a local address
    lambda s: s.connect_ex(("192.0.2.1", 443)),
    lambda s: socket.getaddrinfo("pypi.org", 443),
    lambda s: socket.create_connection(("pypi.org", 443), timeout=1),
], ids=["connect", "connect_ex", "getaddrinfo", "create_connection"])
def test_reaching_the_network_raises(connect, isolation_guard: IsolationGuard) -> None:  # type: ignore[no-untyped-def]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s, \
            pytest.raises(UnitTestIsolationError, match="network"):
        connect(s)
    isolation_guard.violations.clear()


def test_local_sockets_still_work(isolation_guard: IsolationGuard) -> None:
    """A loopback server (a stand-in package index, say) is not the network."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with socket.create_connection(("localhost", server.getsockname()[1]), timeout=5):
            pass
        with socket.socket() as c:
            c.connect(("127.0.0.1", server.getsockname()[1]))
    assert isolation_guard.violations == []


def test_a_swallowed_violation_still_fails_the_test() -> None:
    guard = IsolationGuard("unit test some_test")
    guard.refuse("started a process: subprocess.Popen(['git'])")
    with pytest.raises(pytest.fail.Exception, match=r"unit test some_test started a process"):
        check_guard(guard)
    check_guard(IsolationGuard("unit test clean_test"))  # nothing caught: passes


def test_guard_in_a_real_pytest_run(pytester: pytest.Pytester) -> None:
    """End to end, in an inner pytest run with this guard as its conftest: a test that starts a
    process and swallows the error fails, naming itself; a module that starts a process at
    import is a collection error; a pure test passes."""
    from pathlib import Path

    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(
        test_inner=textwrap.dedent("""
            import subprocess

            def test_swallows():
                try:
                    subprocess.run(["git", "--version"])
                except BaseException:
                    pass

            def test_pure():
                assert 1 + 1 == 2
        """),
        test_import=textwrap.dedent("""
            import os
            os.system("true")

            def test_never_collected():
                pass
        """),
    )
    res = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--continue-on-collection-errors")
    res.assert_outcomes(passed=2, errors=2)  # test_swallows passes its call, errors at teardown
    out = res.stdout.str()
    assert "unit test test_inner.py::test_swallows started a process" in out
    assert "unit test module test_import.py, while importing, started a process: os.system" in out


def test_a_slow_gpu_or_slurm_test_in_the_unit_layer_is_refused(pytester: pytest.Pytester) -> None:
    from pathlib import Path

    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makeini("[pytest]\nmarkers =\n  slow: minutes\n")
    pytester.makepyfile(test_marked="import pytest\n\n@pytest.mark.slow\ndef test_compiles():\n"
                                    "    pass\n")
    res = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    assert "test_marked.py::test_compiles (marked slow)" in res.stderr.str()
