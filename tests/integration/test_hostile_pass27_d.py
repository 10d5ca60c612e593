"""Issue 41, the twenty-seventh hostile pass (tester d: the generated job scripts on a node, their
environment, and the prepare job end to end with the ``PIP_INDEX_URL`` submit now sends). Each
test fails without its fix (checked by reverting ``src`` and running it):

- The prepare job read a ``file://`` index's page with urllib's own file handler, which opens a
  FIFO and waits for it: ``PIP_INDEX_URL=file://<campaign>/idx#`` (the fragment holds the
  ``/vllm/`` the kit appends, so the page is ``idx`` itself), with a FIFO put at ``idx`` by
  whoever writes the campaign, had the prepare job wait until Slurm's time limit (killed by
  ``timeout`` after 60 s, 1 run of 1; ``fetch --index-url`` the same). Submit checks the URL as
  an http(s):// or file:// URL, which it is. Now a ``file://`` page is opened as the sdist
  link already was (``download.open_url``: a regular file only, without blocking), and
  ``open_url`` reads the scheme in any case, as urllib does (``FILE://`` had gone to urllib's
  file handler too).
- A ``file://`` URL is opened as a regular file only, but the kernel's files in ``/proc`` and
  ``/sys`` are regular files too, and ``/proc/kmsg`` waits for the kernel's next message: a
  link in the campaign to it at the page of ``PIP_INDEX_URL=file://<campaign>/idx#`` had the
  prepare job (run as root) wait for good (killed by ``timeout`` after 10 s, 1 run of 1). Now
  a ``file://`` URL of no size is refused (an index page or a pinned file never is empty).
- An http index that answers a byte at a time (an index page of spaces, one every 5 s; or its
  status line and headers so) met no socket timeout (30 s a wait) and kept the prepare job and
  ``fetch`` waiting without bound (killed by ``timeout`` after 70 s, 1 run of 1 each); the
  sdist's download the same (120 s a wait). Now the page, and a download's answer before its
  first byte, have ``download.PAGE_DEADLINE_S`` in all (``download.within``), and the download
  ``download.MIN_RATE`` bytes a second on average after that (``copy_bounded``). The tests run
  a real dribbling server on a local port; they lower the two limits in the test's process
  (the only thing set aside), so they take seconds, not the two minutes a job would wait.

- Submit checked the jobs' ``--python`` (and the kit's checkout) as outside the campaign by its
  name, its resolved path and its identity, but not by the links met on the way: ``--python
  ~/py/bin/python`` with ``~/py`` the user's link to ``<campaign>/venv``, itself a link to the
  environment, resolved outside and was sent (``slurm submit`` exit 0); whoever writes the
  campaign then pointed ``venv`` at a folder of its own, and the merge job ran its
  ``bin/python``, which wrote a marker (1 run of 1). Passed values were checked so since the
  twenty-third pass (``job_env``); the program paths now use the same rule
  (``job_env.reaches_campaign``).

Slurm is absent here: the job scripts run with bash as a node would (``_run``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvprefetch.errors import FetchError
from kvprefetch.sources import download
from tests.integration.helpers import local_server
from tests.integration.test_hostile_pass20_d import _plan
from tests.integration.test_job_home import _env_sbatch, _submit
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


def _run(tmp_path: Path, camp: Path, script: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The job as a node runs it (test_hostile_pass20_d's), stopped after 20 s: the hang these
    tests look for would otherwise take its 120 s."""
    job_env = {"HOME": str(tmp_path), "SLURM_JOB_ID": "7", "PATH": "/usr/bin:/bin", **env}
    return subprocess.run(["bash", str(camp / "scripts" / script)], env=job_env,
                          capture_output=True, text=True, timeout=20, check=False, cwd="/")


@pytest.mark.parametrize("scheme", ["file", "FILE"])
def test_prepare_job_refuses_a_fifo_as_a_file_index_page(tmp_path: Path, scheme: str) -> None:
    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    os.mkfifo(camp / "idx")
    res = _run(tmp_path, camp, "00-prepare.sbatch", TMPDIR=str(tmp_path),
               PIP_INDEX_URL=f"{scheme}://{camp}/idx#")
    assert res.returncode == 3, res.stdout + res.stderr
    assert "is not a regular file" in res.stderr and "To fix" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr



@pytest.fixture
def dribbler() -> Iterator[tuple[int, list[str]]]:
    """A local HTTP server that sends what its mode (``modes[0]``) says a byte or a line at a
    time, every 0.2 s, for good: ``body`` (the status line and headers, then spaces), ``headers``
    (the status line, then headers without end)."""
    modes = ["body"]

    def serve(conn: socket.socket, stop: threading.Event) -> None:
        conn.recv(65536)
        if modes[0] == "body":
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/html\r\n\r\n")
        else:
            conn.sendall(b"HTTP/1.0 200 OK\r\n")
        while not stop.is_set():
            conn.sendall(b" " if modes[0] == "body" else b"X: y\r\n")
            time.sleep(0.2)

    with local_server(serve) as port:
        yield port, modes


def _error_within(seconds: float, fn: Callable[[], object]) -> BaseException:
    """What ``fn()`` raised, asserted to have come within ``seconds`` (without the fix it never
    comes: the thread is left to the dribbler, which stops with the fixture)."""
    box: list[BaseException] = []

    def work() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 -- asserted on below
            box.append(exc)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still waiting on the dribbling server after {seconds} s"
    assert box, "no error"
    return box[0]


@pytest.mark.parametrize("mode", ["body", "headers"])
def test_a_dribbling_index_page_is_given_up(dribbler: tuple[int, list[str]], mode: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    port, modes = dribbler
    modes[0] = mode
    monkeypatch.setattr(download, "PAGE_DEADLINE_S", 2.0, raising=False)
    err = _error_within(10, lambda: download.locate_sdist(f"http://127.0.0.1:{port}/simple"))
    assert isinstance(err, FetchError) and "did not answer within 2 s" in str(err), err


@pytest.mark.parametrize("mode", ["body", "headers"])
def test_a_dribbling_download_is_given_up(dribbler: tuple[int, list[str]], mode: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    port, modes = dribbler
    modes[0] = mode
    monkeypatch.setattr(download, "PAGE_DEADLINE_S", 2.0, raising=False)
    monkeypatch.setattr(download, "MIN_RATE", 1 << 40, raising=False)

    def fetch() -> None:
        with download.open_url(f"http://127.0.0.1:{port}/x.tar.gz", timeout=30) as resp:
            download.copy_bounded(resp, lambda _b: None, 1 << 20, "the url")
    err = _error_within(10, fetch)
    assert isinstance(err, FetchError), err
    assert "did not answer within" in str(err) or "more slowly than" in str(err), err


def test_prepare_job_refuses_a_link_to_a_kernel_file_as_a_file_index_page(
        tmp_path: Path) -> None:
    if os.geteuid() != 0 or not os.access("/proc/kmsg", os.R_OK):
        pytest.skip("needs root: /proc/kmsg is readable by root only")
    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    (camp / "idx").symlink_to("/proc/kmsg")
    res = _run(tmp_path, camp, "00-prepare.sbatch", TMPDIR=str(tmp_path),
               PIP_INDEX_URL=f"file://{camp}/idx#")
    assert res.returncode == 3, res.stdout + res.stderr
    assert "is empty (or a kernel's file" in res.stderr and "To fix" in res.stderr, res.stderr


def test_submit_refuses_a_python_reached_through_a_link_in_the_campaign(tmp_path: Path) -> None:
    camp, py = tmp_path / "camp", tmp_path / "py"
    env_root = Path(sys.prefix)  # this interpreter's environment
    py.symlink_to(env_root)
    python = py / "bin" / Path(sys.executable).name
    _plan(tmp_path, camp, python=str(python))
    # the user points their link at a link kept in the campaign, to the same environment
    (camp / "venv").symlink_to(env_root)
    py.unlink()
    py.symlink_to(camp / "venv")
    bin_dir, got = _env_sbatch(tmp_path)
    res = _submit(tmp_path, bin_dir, tmp_path / "h", "submit", str(camp),
                  PIP_INDEX_URL="https://pypi.org/simple")
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"--python {python} is in the campaign" in res.stderr, res.stderr
    assert "To fix" in res.stderr and "Traceback" not in res.stderr
    assert not got.exists(), "sbatch was run"
