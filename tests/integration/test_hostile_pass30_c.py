"""Issue 41, the thirtieth hostile pass (tester c: every option of every command, the
``KVPREFETCH_*`` variables, and the process around the kit). Each test fails without its fix
(checked by reverting ``src`` and running it):

- **doctor's reachability probe waited for good.** ``probes.check_url`` (doctor's network,
  package-index and CUDA 12 mirror checks) sent its HEAD request through urllib as it is. A
  ``file://`` URL went to urllib's own file handler, which opens the file: ``doctor --mode
  overlay`` with ``PIP_INDEX_URL``, ``UV_INDEX_URL`` or ``KVPREFETCH_DEBIAN_MIRROR`` at
  ``file:///…/fifo`` waited for a writer for good (a hang). An http index, mirror or proxy
  that sends its headers a line every few seconds met every socket timeout, and http.client
  reads up to 100 header lines: at one line each 9 s, doctor waited 15 minutes. The download
  (``sources.download.open_url``) had both fixed since passes 17 and 27; the probe had not. Now
  a ``file://`` URL is only ``stat``-ed (a folder or regular file is reachable; a FIFO, device
  or socket is not), and the whole answer has a deadline of three socket timeouts
  (``sources.deadlines.within``).
- **A ``--workdir`` that is a file** (or a device, a FIFO, a link to nothing) had apply,
  diff-upstream, export-header and build say "no tree ... run `kvprefetch fetch` first", which
  fetch then refused: a wrong-way message, found by this pass and fixed by the lead (the
  option's callback refuses it for every command).

Nothing is mocked: a real FIFO, a real local server that dribbles its headers, the real CLI."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from kvprefetch.doctor.probes import check_url
from tests.integration.helpers import local_server
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _in_thread(fn: object, seconds: float) -> dict[str, object]:
    """``fn()``'s result under ``box["value"]``, or an empty box when it is still waiting."""
    box: dict[str, object] = {}

    def work() -> None:
        box["value"] = fn()  # type: ignore[operator]

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(seconds)
    return box


def _release(fifo: Path) -> None:
    """A writer for a FIFO a reader waits on (the unfixed probe), so its thread ends."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    os.close(fd)


def test_the_probe_never_opens_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "simple"
    os.mkfifo(fifo)
    try:
        for url in (f"file://{fifo}", f"FILE://{fifo}"):
            box = _in_thread(lambda u=url: check_url(u, timeout=2, environ={}), 10)
            assert "value" in box, f"check_url({url!r}) still waits on the FIFO after 10 s"
            ok, detail = box["value"]  # type: ignore[misc]
            assert not ok and "FIFO" in detail, detail
    finally:
        _release(fifo)
    # a local folder or file is what a file:// index or mirror is: reachable
    assert check_url(f"file://{tmp_path}/", timeout=2, environ={})[0]
    assert not check_url(f"file://{tmp_path}/none", timeout=2, environ={})[0]


def test_the_probe_gives_up_on_a_server_that_dribbles_its_headers() -> None:
    def serve(conn: socket.socket, stop: threading.Event) -> None:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        while not stop.wait(0.3):  # one header line per 0.3 s: within every 1 s timeout
            conn.sendall(b"X-Slow: yes\r\n")

    with local_server(serve) as port:
        t0 = time.monotonic()
        ok, detail = check_url(f"http://127.0.0.1:{port}/simple/", timeout=1, environ={})
        took = time.monotonic() - t0
    assert not ok and "did not answer within" in detail, detail
    assert took < 10, f"the probe took {took:.0f} s"


def test_doctor_overlay_with_a_fifo_index_ends_with_the_check_failed(tmp_path: Path) -> None:
    fifo = tmp_path / "index"
    os.mkfifo(fifo)
    env = {k: v for k, v in os.environ.items()
           if k not in ("UV_INDEX_URL", "PIP_INDEX_URL", "KVPREFETCH_DEBIAN_MIRROR")}
    env.update(PYTHONPATH=SRC, PIP_INDEX_URL=f"file://{fifo}")
    try:
        res = subprocess.run([sys.executable, "-m", "kvprefetch", "doctor", "--mode", "overlay",
                              "--json", "--workdir", str(tmp_path / "w")],
                             env=env, capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        raise AssertionError("doctor --mode overlay waited 60 s on a FIFO index") from None
    finally:
        _release(fifo)
    assert "Traceback" not in res.stderr, res.stderr
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    index = checks["package-index"]
    assert index["status"] == "fail" and "FIFO" in index["detail"], index


def test_a_workdir_that_is_no_folder_is_named_as_such_by_every_command(tmp_path: Path) -> None:
    """``--workdir FILE`` (and a link to nothing): each command names the option and says a
    work directory is a folder, where apply, diff-upstream, export-header and build sent the
    user to ``fetch``, which refused the same path."""
    afile = tmp_path / "afile"
    afile.write_text("the user's file\n")
    nothing = tmp_path / "nothing"
    nothing.symlink_to(tmp_path / "missing")
    env = {k: v for k, v in os.environ.items() if k != "KVPREFETCH_WORKDIR"}
    env["TMPDIR"] = str(tmp_path)
    for workdir, what in ((afile, "is not a folder"), (nothing, "a symlink to nothing")):
        for command in (["apply"], ["diff-upstream"], ["build", "--dry-run", "--kernels-only"],
                        ["export-header", "-o", str(tmp_path / "h.cuh")], ["clean"]):
            res = subprocess.run([sys.executable, "-m", "kvprefetch", *command, "--workdir",
                                  str(workdir)], capture_output=True, text=True, env=env,
                                 timeout=120, check=False)
            assert res.returncode == 2, (command, res.stderr)
            assert what in res.stderr and "Traceback" not in res.stderr, (command, res.stderr)
            assert "run `kvprefetch fetch` first" not in res.stderr, (command, res.stderr)
    assert afile.read_text() == "the user's file\n"
    assert {p.name for p in tmp_path.iterdir()} - {"outside"} == {"afile", "nothing"}
