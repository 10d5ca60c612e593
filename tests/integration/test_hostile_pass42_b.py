"""Issue 41, the forty-second hostile pass (tester b): a careless user and a hostile machine,
through the real CLI.

``confine.open_new`` renamed every OSError of its block that named no file after the file it
streams into, so the sdist download's own network errors (a ``URLError``, a reset
connection), raised inside that block, lost their cause: a refused connection read
"download of URL failed: [Errno None] None: '<wd>/downloads/vllm-0.10.2.tar.gz'", a reset
"[Errno 104] Connection reset by peer: '<wd>/downloads/…'", naming a local file for the
network's fault; and ``ulimit -n 12`` (EMFILE opening the socket) was sent to "check the
network". Only a write's own error (a plain ``OSError``) is named after the file now, and
``oserrors.local_write_failure`` takes EMFILE (in a ``URLError`` too) as this machine's.
"""

from __future__ import annotations

import functools
import http.server
import resource
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvprefetch import upstream
from tests.integration.test_reliability import _env, outside, refused

__all__ = ["outside"]  # the fixture: nothing outside may change


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def index(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A local package index; its page for vllm is written by the test (``<folder>/simple/
    vllm/index.html``); yields (folder, the index URL)."""
    served = tmp_path / "index"
    (served / "simple" / "vllm").mkdir(parents=True)
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield served, f"http://127.0.0.1:{server.server_address[1]}/simple/"
    finally:
        server.shutdown()
        server.server_close()


def _list(served: Path, url: str) -> None:
    (served / "simple" / "vllm" / "index.html").write_text(
        f'<html><body><a href="{url}#sha256={upstream.SDIST_SHA256}">{upstream.SDIST_NAME}</a>'
        "</body></html>")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _resetting_server() -> tuple[socket.socket, int]:
    """A server that answers a download's headers and 1,000 bytes, then resets the
    connection (RST, by SO_LINGER 0)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % upstream.SDIST_SIZE
                         + b"x" * 1000)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv, int(srv.getsockname()[1])


def _fetch(wd: Path, index_url: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvprefetch", "fetch", "--workdir", str(wd),
                           "--source", "sdist", "--index-url", index_url],
                          env=_env(), capture_output=True, text=True, timeout=300, check=False)


def test_a_refused_download_says_so_and_names_no_local_file(
        tmp_path: Path, outside: Path, index: tuple[Path, str]) -> None:
    served, index_url = index
    url = f"http://127.0.0.1:{_closed_port()}/{upstream.SDIST_NAME}"
    _list(served, url)
    wd = tmp_path / "wd"
    res = _fetch(wd, index_url)
    refused(res, 3, f"download of {url} failed", "Connection refused", "check the network")
    assert "[Errno None]" not in res.stderr, res.stderr
    assert str(wd / "downloads") not in res.stderr, res.stderr
    assert [p.name for p in (wd / "downloads").iterdir()] == []  # no partial left


def test_a_download_reset_midway_blames_the_connection_not_a_local_file(
        tmp_path: Path, outside: Path, index: tuple[Path, str]) -> None:
    served, index_url = index
    srv, port = _resetting_server()
    try:
        url = f"http://127.0.0.1:{port}/{upstream.SDIST_NAME}"
        _list(served, url)
        wd = tmp_path / "wd"
        res = _fetch(wd, index_url)
    finally:
        srv.close()
    refused(res, 3, f"download of {url} failed", "Connection reset by peer",
            "check the network")
    assert str(wd / "downloads") not in res.stderr, res.stderr
    assert [p.name for p in (wd / "downloads").iterdir()] == []


def test_too_few_open_files_for_the_download_names_ulimit_not_the_network(
        tmp_path: Path, outside: Path, index: tuple[Path, str]) -> None:
    """The limits at which fetch meets EMFILE opening the download's socket (12 here): each
    such run names `ulimit -n`, none "[Errno None]" or the network."""
    served, index_url = index
    _list(served, f"{index_url.rsplit('/simple/', 1)[0]}/{upstream.SDIST_NAME}")  # never reached
    met = 0
    for n in range(8, 20):
        wd = tmp_path / f"wd{n}"

        def limit(n: int = n) -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

        res = subprocess.run([sys.executable, "-m", "kvprefetch", "fetch", "--workdir",
                              str(wd), "--source", "sdist", "--index-url", index_url],
                             env=_env(), capture_output=True, text=True, timeout=300,
                             check=False, preexec_fn=limit)
        assert "Traceback" not in res.stderr and "[Errno None]" not in res.stderr, res.stderr
        if "download of" in res.stderr and "404" not in res.stderr:  # EMFILE, not the 404
            met += 1
            refused(res, 3, "Too many open files", "ulimit -n")
            assert "check the network" not in res.stderr, res.stderr
    assert met, "no limit met EMFILE at the download"
