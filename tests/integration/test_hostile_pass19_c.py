"""Issue 41, the nineteenth hostile pass (tester c: every command, option and input, for
tracebacks, hangs, wrong messages and wrong writes). Each test fails without its fix (checked by
reverting ``src`` and running it):

- The sdist download (and the CUDA 12 assembly's) said "check the network and run the command
  again" for every OSError, the ones that only writing the local file raises too: a full work
  directory (``No space left on device``), a read-only one (``slurm prepare`` on a campaign
  mounted read-only), a quota or the file-size limit (``ulimit -f``). The rerun fails the same
  way. Now such a failure names the download folder and gives the disk's fix
  (``oserrors.local_write_failure``); the network's fix stays for the network.
"""

from __future__ import annotations

import http.server
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from kvprefetch.errors import FetchError
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: nothing outside the test's folders changes

_REPO = Path(__file__).resolve().parents[2]
SDIST_NAME = "vllm-0.10.2.tar.gz"


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KVPREFETCH_WORKDIR"}
    env.update(PYTHONPATH=str(_REPO / "src"), TMPDIR=str(tmp_path), HOME=str(tmp_path))
    return env


class _Index:
    """An index on 127.0.0.1 whose vllm page links the sdist at ``/sdist/``, served as
    ``size`` bytes of zeros (the download fails before its hash matters)."""

    def __init__(self, size: int) -> None:
        page = f'<a href="/sdist/{SDIST_NAME}">{SDIST_NAME}</a>'.encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                if self.path.startswith("/vllm/"):
                    self.wfile.write(page)
                    return
                try:
                    for _ in range(size >> 16):
                        self.wfile.write(b"\0" * (1 << 16))
                except OSError:  # the kit stopped reading
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _small_files() -> None:
    """The child may write files of at most 1 MiB (``ulimit -f 1024``): the 4 MiB download
    fails on this machine's side (EFBIG; Python ignores SIGXFSZ), as on a full disk."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


def test_a_download_that_fails_on_the_local_disk_is_not_blamed_on_the_network(
        tmp_path: Path) -> None:
    index = _Index(4 << 20)
    wd = tmp_path / "wd"
    try:
        res = subprocess.run([sys.executable, "-m", "kvprefetch", "fetch", "--source", "sdist",
                              "--workdir", str(wd), "--index-url", index.url],
                             env=_env(tmp_path), capture_output=True, text=True, timeout=60,
                             check=False, preexec_fn=_small_files)
    finally:
        index.close()
    text = res.stderr
    assert res.returncode == FetchError.exit_code, (res.returncode, text)
    assert "Traceback" not in text and "To fix:" in text, text
    assert "check the network" not in text, text
    assert "file-size limit" in text and str(wd / "downloads") in text, text
    assert not any((wd / "downloads").iterdir())
