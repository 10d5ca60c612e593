"""Issue 41, the nineteenth hostile pass (a): the work directory's commands, a full fresh pass.

- An index, a mirror or a proxy that answers with something that is no HTTP was a traceback.
  ``urllib`` raises ``URLError`` or ``OSError`` for a network that fails, but ``http.client``'s
  ``HTTPException`` for an answer it cannot read (a status line of garbage: ``BadStatusLine``;
  a body cut short or badly chunked: ``IncompleteRead``; more than 100 headers; a URL an index
  lists with a port that is no number or a space: ``InvalidURL``), and ``os.open`` a
  ``ValueError`` for a ``file://`` URL with ``%00``. ``fetch --source sdist`` (the index page
  and the download), the CUDA 12 assembly's download and ``doctor``'s network line caught only
  the first two: a local server answering so had ``fetch`` end with a traceback (12 kinds of
  answer, 12 of 12 runs), and so did ``fetch`` and ``doctor`` with ``https_proxy`` naming a
  port that is no HTTP proxy (a careless user). Each is now one FetchError naming the server's
  answer, with a To fix that names the proxy variables (exit 3), and doctor's network line says
  the host is unreachable (``download.NETWORK_ERRORS``), nothing left in ``downloads/``.

- A build's up-to-date check (``builds.plan.manifest_matches``) hashed every output its
  manifest names whole, by path: a sparse 15 TB file at ``build/<tree>/<key>/
  kvprefetch_<tree>_C.so`` (whoever writes the work directory) had ``build --kernels-only
  --dry-run`` hash zeros for hours (2 of 2 killed by a 40 s timeout), and the bench's check of
  a manifest's library before loading it (``kernels.ops.sha256_file``: ``open`` by path) did
  the same, and blocked for good on a FIFO swapped in after its ``is_file``. Outputs are now
  hashed through one never-blocking descriptor and only up to 4 GiB
  (``hashing.sha256_file(limit=MAX_LIBRARY_BYTES)``, merged with tester b's same fix): a
  larger file is no match (the build runs again), and the bench names it (BenchError).

- A work directory copied with ``cp -a`` (a careless user making a second one) kept build
  manifests naming the original's outputs by absolute path. ``build`` checked those (still
  there, same hashes) and called the copy's trees up to date, while ``verify-kernel`` refused
  the copy's manifests (an interpreter outside its ``envs/``) with the fix "rebuild the tree
  with ``kvprefetch build``", which then did nothing (a real narrowed build copied and checked
  by hand; ``build --force`` made it pass). A manifest's outputs must now be in the plan's own
  folders (its build folder, environment or tree), else it matches nothing and the build runs.

Each test fails without its fix (checked with the fix reverted)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: the outside folder is byte-identical afterwards

_SRC = str(Path(__file__).resolve().parents[2] / "src")
_SDIST = "vllm-0.10.2.tar.gz"
_PROXY_VARS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy",
               "ALL_PROXY", "no_proxy", "NO_PROXY", "PIP_INDEX_URL")

# What the server answers, by the first folder of the path asked for. "<mode>/vllm/" is the
# index page: for the index-* modes the page itself is the bad answer; for the others it
# lists the sdist at "<mode>/dl/vllm-0.10.2.tar.gz", whose answer is the bad one.
_STATUS_GARBAGE = b"HTTP/1.1 abc garbage\r\n\r\n"
_ANSWERS = {
    "index-badstatus": _STATUS_GARBAGE,
    "index-chunked": (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\nZZZ\r\n"),
    "index-headers": b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 200 + b"\r\n",
    "badstatus": _STATUS_GARBAGE,
    "nostatus": b"garbage without a status line\n",
    "badchunk": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"10\r\n0123456789abcdef\r\nXYZ\r\n"),
    "headers": b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 200 + b"\r\n",
}
# URLs an index may list that urllib refuses with an InvalidURL or ValueError
_LISTED = {
    "port": "http://127.0.0.1:ab/" + _SDIST,
    "space": "/sp ace/" + _SDIST,
    "nul": "file:///tmp/%00/" + _SDIST,
}


def _page(href: str) -> bytes:
    body = f'<html><body><a href="{href}">{_SDIST}</a></body></html>'.encode()
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n"
            % len(body)) + body


def _answer(request: bytes) -> bytes:
    if request.startswith((b"CONNECT", b"HEAD")):  # asked as a proxy, or doctor's HEAD
        return _STATUS_GARBAGE
    path = request.split(b" ", 2)[1].decode()
    mode = path.strip("/").split("/")[0]
    if path.endswith("/vllm/"):
        if mode.startswith("index-"):
            return _ANSWERS[mode]
        return _page(_LISTED.get(mode, f"/{mode}/dl/{_SDIST}"))
    return _ANSWERS.get(mode, b"HTTP/1.1 404 NF\r\nContent-Length: 0\r\n\r\n")


def _serve(sock: socket.socket) -> None:
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:  # closed: the test is over
            return
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                data = conn.recv(4096)
                if not data:
                    break
                request += data
            if request:
                conn.sendall(_answer(request))


@pytest.fixture
def no_http_server() -> Iterator[str]:
    """A local server whose every answer is no HTTP a client can read (see _ANSWERS)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    thread = threading.Thread(target=_serve, args=(sock,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in _PROXY_VARS and k != "KVPREFETCH_WORKDIR"}
    env["PYTHONPATH"] = _SRC + os.pathsep + env.get("PYTHONPATH", "")
    env["HOME"] = str(tmp_path / "home")
    env.update(extra)
    return env


def _kit(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("mode", [*_ANSWERS, *_LISTED])
def test_an_index_or_mirror_answering_no_http_is_one_message(
        tmp_path: Path, no_http_server: str, mode: str) -> None:
    work = tmp_path / "work"
    res = _kit(_env(tmp_path, PIP_INDEX_URL=f"{no_http_server}/{mode}"),
               "fetch", "--source", "sdist", "--workdir", str(work))
    text = res.stdout + res.stderr
    assert "Traceback" not in text, text
    assert res.returncode == 3 and "To fix:" in text, (res.returncode, text)
    downloads = work / "downloads"
    assert not downloads.exists() or not any(downloads.iterdir()), list(downloads.iterdir())


def test_fetch_and_doctor_behind_a_proxy_that_answers_no_http_are_no_traceback(
        tmp_path: Path, no_http_server: str) -> None:
    env = _env(tmp_path, https_proxy=f"{no_http_server}/", http_proxy=f"{no_http_server}/")
    res = _kit(env, "fetch", "--source", "sdist", "--workdir", str(tmp_path / "work"))
    text = res.stdout + res.stderr
    assert "Traceback" not in text, text
    assert res.returncode == 3 and "https_proxy" in text, (res.returncode, text)
    res = _kit(env, "doctor", "--mode", "full", "--workdir", str(tmp_path / "nowork"))
    text = res.stdout + res.stderr
    assert "Traceback" not in text, text
    assert "BadStatusLine" in text, text  # the network line says what answered


def test_a_cuda12_mirror_answering_no_http_is_one_fetch_error(
        tmp_path: Path, no_http_server: str) -> None:
    from kvprefetch.errors import FetchError
    from kvprefetch.overlay import cuda12

    work = tmp_path / "work"
    work.mkdir()
    downloads = work / "downloads" / "cuda"
    for mode in ("badstatus", "badchunk", "headers"):
        part = cuda12.Part("stand-in", "stand-in.whl", f"{no_http_server}/{mode}/x.whl",
                           "0" * 64, 1000, ())
        with pytest.raises(FetchError) as err:
            cuda12._download(part, downloads, cuda12._urlopen, work)
        assert err.value.fix, mode
        assert not downloads.exists() or not any(downloads.iterdir())


# In a child with a timeout: without the fix each blocks (hashing 15 TB of zeros, or opening
# a FIFO with no writer) far past it.
_HUGE_OUTPUT = r"""
import json, os, sys, types
from pathlib import Path
from kvprefetch.builds import plan

d = Path(sys.argv[1])
so = d / "kvprefetch_patched_C.so"
so.touch()
os.truncate(so, 15 << 40)  # sparse: no disk used
(d / "manifest.json").write_text(json.dumps(
    {"key": "k", "tree": "patched", "so_path": str(so), "so_sha256": "0" * 64,
     "outputs": [{"path": str(so), "sha256": "0" * 64}]}))
print("match", plan.manifest_matches(types.SimpleNamespace(
    build_dir=str(d), key="k", env_path=str(d / "env"), source_tree=str(d / "tree"))))
"""

_BENCH_LIBRARY = r"""
import os, sys
from pathlib import Path
from kvprefetch.errors import BenchError
from kvprefetch.hashing import MAX_LIBRARY_BYTES, sha256_file
from kvprefetch.kernels import ops

d = Path(sys.argv[1])
huge, fifo = d / "huge.so", d / "fifo.so"
huge.touch()
os.truncate(huge, 15 << 40)
os.mkfifo(fifo)
try:  # the bench's check of a manifest's library before it loads it
    ops.load_build(ops.BuiltOps("patched", "patched", "kvprefetch_patched", huge, "0" * 64,
                                (128,), (16,), ("auto",), d / "manifest.json"))
except BenchError as exc:
    print("refused", huge.name, exc.fix is not None)
try:  # what that check meets when a FIFO is swapped in after its is_file
    sha256_file(fifo, limit=MAX_LIBRARY_BYTES)
except OSError:
    print("refused", fifo.name, True)
"""


def _child(script: str, folder: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KVPREFETCH_WORKDIR"}
    env["PYTHONPATH"] = _SRC + os.pathsep + env.get("PYTHONPATH", "")
    try:
        return subprocess.run([sys.executable, "-c", script, str(folder)], env=env,
                              capture_output=True, text=True, timeout=20, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("hashed a 15 TB sparse file (or waited on a FIFO) for more than 20 s")


def test_a_huge_sparse_file_at_a_build_output_is_no_match_never_hashed(tmp_path: Path) -> None:
    build_dir = tmp_path / "work" / "build" / "patched" / "k"
    build_dir.mkdir(parents=True)
    res = _child(_HUGE_OUTPUT, build_dir)
    assert res.returncode == 0 and res.stdout.strip() == "match None", res.stderr


def test_a_bench_library_that_is_huge_or_a_fifo_is_one_bench_error(tmp_path: Path) -> None:
    res = _child(_BENCH_LIBRARY, tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[:2] == ["refused huge.so True", "refused fifo.so True"], \
        res.stdout


def test_a_manifest_naming_outputs_of_another_work_directory_is_no_match(tmp_path: Path) -> None:
    """What a copied work directory's manifest looks like: its outputs, by absolute path, are
    the original's, intact. A manifest whose outputs are in the plan's own folders still
    matches."""
    import hashlib
    import json
    import types

    from kvprefetch.builds import plan

    def planned(work: Path) -> types.SimpleNamespace:
        return types.SimpleNamespace(
            key="k", build_dir=str(work / "build" / "patched" / "k"),
            env_path=str(work / "envs" / "patched"), source_tree=str(work / "trees" / "patched"))

    def manifest(tp: types.SimpleNamespace, outputs_of: types.SimpleNamespace) -> None:
        lib = Path(outputs_of.build_dir) / "kvprefetch_patched_C.so"
        lib.parent.mkdir(parents=True, exist_ok=True)
        lib.write_bytes(b"library")
        Path(tp.build_dir).mkdir(parents=True, exist_ok=True)
        (Path(tp.build_dir) / "manifest.json").write_text(json.dumps(
            {"key": "k", "so_path": str(lib), "so_sha256": hashlib.sha256(b"library").hexdigest(),
             "outputs": [{"path": str(lib),
                          "sha256": hashlib.sha256(b"library").hexdigest()}]}))

    original, copy = planned(tmp_path / "original"), planned(tmp_path / "copy")
    manifest(original, original)
    manifest(copy, original)
    assert plan.manifest_matches(original) is not None  # its own outputs: up to date
    assert plan.manifest_matches(copy) is None  # another work directory's: built again
