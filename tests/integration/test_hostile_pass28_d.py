"""Issue 41, the twenty-eighth hostile pass (tester d: the generated job scripts on a node, their
environment, the ``PIP_INDEX_URL`` submit sends, and the download deadlines). Each test fails
without its fix (checked by reverting ``src`` and running it):

- A mirror answering the sdist's download chunked (``Transfer-Encoding: chunked``) with trailer
  lines without end after its last chunk, or with a chunk's size line a byte at a time, kept
  ``fetch`` and the prepare job waiting for good (killed by ``timeout`` after 30 s with the
  deadline lowered to 2 s, 1 run of 1 each; at the real limits the same, without end): the
  download's deadline (pass 27) was looked at between reads, and http.client reads a chunked
  answer's size line and its trailer inside one read, with no byte counted. Now the socket is
  shut down at the deadline (``deadlines.stop_at``), which ends that read, and the download is
  "more slowly than 16 KiB/s" as a dribble is. The test runs a real server on a local port and
  lowers the two limits in its own process (the only thing set aside), as pass 27's does.
- An index or repository URL with an IPv6 host's bracket unpaired, or a bracketed host that is
  no address (``http://[::1``, ``https://]x/s``, ``https://[zz]/s``), was urllib's ValueError
  ("Invalid IPv6 URL"), a traceback from ``fetch --index-url``, from ``slurm submit`` with such
  a ``PIP_INDEX_URL`` (or pip's ``global.index-url``), from the prepare job given one, and from
  ``fetch --source git --repo-url 'file://[x/y'`` (1 run of 1 each). Now a URL urllib cannot
  read is refused as one that is no URL (``download.url_parts``), exit 2 with a "To fix".
- An index page of ``<`` (each one a tag begun) took Python's HTMLParser about 3 us a
  character: a page of 16 MiB of them 49 s, one of 64 MiB (the most the kit reads) about 3
  minutes of ``fetch`` or the prepare job, with nothing said (``PIP_INDEX_URL=file://<campaign>/
  idx#``, a page the campaign's writer controls, or any index or mirror). Now only the ``<a>``
  tags that name the file are parsed (``download.parse_simple_html``, a linear scan first): a
  64 MiB page of ``<`` takes under a second.

Slurm is absent here: the job scripts run with bash as a node would."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvprefetch import upstream
from kvprefetch.errors import FetchError
from kvprefetch.sources import download
from tests.integration.helpers import local_server
from tests.integration.test_hostile_pass20_d import _SRC, _plan
from tests.integration.test_hostile_pass27_d import _error_within, _run
from tests.integration.test_job_home import _env_sbatch, _submit
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


@pytest.fixture
def chunked() -> Iterator[tuple[int, list[str]]]:
    """A local HTTP/1.1 server answering chunked, one chunk of 3 bytes, then what its mode
    (``modes[0]``) says, for good: ``trailer`` (the last chunk, then trailer lines every 10 ms),
    ``size`` (a next chunk's size line of zeros, a byte every 10 ms)."""
    modes = ["trailer"]

    def serve(conn: socket.socket, stop: threading.Event) -> None:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"3\r\nabc\r\n" + (b"0\r\n" if modes[0] == "trailer" else b""))
        while not stop.is_set():
            conn.sendall(b"X-A: b\r\n" if modes[0] == "trailer" else b"0")
            time.sleep(0.01)

    with local_server(serve) as port:
        yield port, modes


@pytest.mark.parametrize("mode", ["trailer", "size"])
def test_a_chunked_download_without_end_is_given_up(chunked: tuple[int, list[str]], mode: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    port, modes = chunked
    modes[0] = mode
    monkeypatch.setattr(download, "PAGE_DEADLINE_S", 2.0, raising=False)
    monkeypatch.setattr(download, "MIN_RATE", 1 << 40, raising=False)
    got: list[bytes] = []

    def fetch() -> None:
        with download.open_url(f"http://127.0.0.1:{port}/x.tar.gz", timeout=30) as resp:
            download.copy_bounded(resp, got.append, 1 << 20, "the url")
    err = _error_within(10, fetch)
    assert isinstance(err, FetchError) and "more slowly than" in str(err), err
    assert "To fix" in str(err) and got == [b"abc"], (err, got)


def _kit(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``kvprefetch ARGS`` with this shell's environment less its pip and kit settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "KVPREFETCH"))}
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], capture_output=True,
                          text=True, timeout=60, check=False,
                          env=env | {"PYTHONPATH": str(_SRC), "TMPDIR": str(tmp_path)})


_BAD_URLS = ["http://[::1", "https://]x/s", "https://[zz]/s"]


@pytest.mark.parametrize("url", _BAD_URLS)
def test_an_index_url_urllib_cannot_read_is_refused_not_a_traceback(tmp_path: Path,
                                                                     url: str) -> None:
    res = _kit(tmp_path, "fetch", "--workdir", str(tmp_path / "w"), "--index-url", url)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stdout + res.stderr
    assert "is not an http://" in res.stderr and "To fix" in res.stderr, res.stderr
    assert not (tmp_path / "w").exists()


def test_submit_and_the_prepare_job_refuse_such_a_pip_index_url(tmp_path: Path) -> None:
    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    bin_dir, got = _env_sbatch(tmp_path)
    for url in _BAD_URLS:
        res = _submit(tmp_path, bin_dir, tmp_path / "h", "submit", str(camp), PIP_INDEX_URL=url)
        out = res.stdout + res.stderr
        assert res.returncode == 2 and "Traceback" not in out, out
        assert f"PIP_INDEX_URL {url!r} is not an http://" in out and "To fix" in out, out
        assert not got.exists(), "sbatch was run"
    # pip's own setting, which submit sends when the shell sets none
    conf = tmp_path / "h" / ".config" / "pip" / "pip.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("[global]\nindex-url = http://[::1\n")
    res = _submit(tmp_path, bin_dir, tmp_path / "h", "submit", str(camp))
    out = res.stdout + res.stderr
    assert res.returncode == 2 and "Traceback" not in out, out
    assert "global.index-url" in out and "To fix" in out and not got.exists(), out
    # the node: a job sent by hand with one
    res = _run(tmp_path, camp, "00-prepare.sbatch", TMPDIR=str(tmp_path),
               PIP_INDEX_URL=_BAD_URLS[0])
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stdout + res.stderr
    assert "is not an http://" in res.stderr and "To fix" in res.stderr, res.stderr


def test_a_repo_url_urllib_cannot_read_is_refused_not_a_traceback(tmp_path: Path) -> None:
    res = _kit(tmp_path, "fetch", "--workdir", str(tmp_path / "w"), "--source", "git",
               "--repo-url", "file://[x/y")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stdout + res.stderr
    assert "not a URL" in res.stderr and "To fix" in res.stderr, res.stderr
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("requires", ["&gt;=3.9", ">=3.9"])  # escaped, as PEP 503 asks, or not
def test_an_index_page_of_begun_tags_is_read_in_seconds(tmp_path: Path, requires: str) -> None:
    page = tmp_path / "idx"
    link = ('<a href="../files/vllm-0.10.2.tar.gz#sha256=' + upstream.SDIST_SHA256
            + f'" data-requires-python="{requires}">vllm-0.10.2.tar.gz</a>')
    page.write_text("<html><body>" + "<" * (16 << 20) + link + "</body></html>")
    box: list[object] = []
    t = threading.Thread(target=lambda: box.append(download.locate_sdist(f"file://{page}#")),
                         daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "still parsing the page after 10 s"
    found = box[0]
    assert isinstance(found, download.IndexFile), box
    assert found.url.endswith("/files/vllm-0.10.2.tar.gz"), found
    assert found.sha256 == upstream.SDIST_SHA256, found
