"""The outside world the preflight reads, as the fields of ``DoctorProbes`` so tests can
simulate a full or read-only disk, an unreachable GitHub or a missing GPU: free disk and
whether it is writable, the disk estimates, cores and memory, the network, the GPU query, the
package index and where toolkits may live."""

from __future__ import annotations

import http.client
import os
import re
import shutil
import stat
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import FetchError
from ..machine.envs import ST_NOSYMFOLLOW
from ..machine.toolchain import DEFAULT_CUDA_ROOTS, host_resources
from ..runner import run, which
from ..sources.deadlines import within
from .estimates import DISK_ESTIMATE_GB, existing

GITHUB_URL = "https://github.com/"
CHECK_DEADLINE_TIMES = 3  # a HEAD request's whole answer may take 3 socket timeouts


def disk_free(path: Path) -> int:
    return shutil.disk_usage(existing(path)).free


def disk_read_only(path: Path) -> bool:
    """Whether the file system the work directory is (or would be made) on is mounted
    read-only: free space there says nothing about whether a build can write it."""
    return bool(os.statvfs(existing(path)).f_flag & os.ST_RDONLY)


def disk_no_symfollow(path: Path) -> bool:
    """Whether that file system is mounted ``nosymfollow``: no program follows a venv's
    ``bin/python``, a link, there, so no environment the build makes can run."""
    return bool(os.statvfs(existing(path)).f_flag & ST_NOSYMFOLLOW)


def check_url(url: str = GITHUB_URL, *, timeout: float = 5.0,
              environ: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """(reachable, detail): one HEAD request, through the proxies of ``environ``; any HTTP
    answer, even an error status, means the host is reachable. The answer has a deadline in
    all (``within``: a server or proxy sending its headers a line every few seconds meets every
    socket timeout), and a ``file://`` URL is only looked at (``stat``), never opened: urllib's
    own file handler opened a FIFO there (``PIP_INDEX_URL``, ``UV_INDEX_URL`` or
    ``KVPREFETCH_DEBIAN_MIRROR`` at ``file:///…/fifo``) and ``doctor --mode overlay`` waited for
    good (issue 41, the thirtieth hostile pass)."""
    environ = os.environ if environ is None else environ
    proxies = {k.lower()[:-6]: v for k, v in environ.items()
               if k.lower() in ("http_proxy", "https_proxy") and v}
    opener = urllib.request.build_opener(urllib.request.ProxyHandler(proxies))

    def head() -> int:
        try:
            with opener.open(urllib.request.Request(url, method="HEAD"),
                             timeout=timeout) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    t0 = time.monotonic()
    try:
        if urllib.parse.urlparse(url).scheme.lower() == "file":
            return _check_file_url(url)
        code = within(timeout * CHECK_DEADLINE_TIMES, head, url)
    except FetchError as exc:  # the deadline
        return False, f"{url} unreachable: {exc.cause}"
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        # HTTPException: an answer that is no HTTP, from an https_proxy that is no HTTP proxy
        # (BadStatusLine), was a traceback (issue 41, the nineteenth hostile pass)
        reason = (f"{type(exc).__name__}: {str(exc)[:300]}"
                  if isinstance(exc, http.client.HTTPException) else getattr(exc, "reason", exc))
        return False, f"{url} unreachable: {reason}"
    return True, f"{url} answered HTTP {code} in {time.monotonic() - t0:.1f} s"


def _check_file_url(url: str) -> tuple[bool, str]:
    """A ``file://`` URL is reachable where it names a folder or a regular file (``stat`` only:
    opening a FIFO waits for a writer, and a device's read never ends)."""
    path = urllib.request.url2pathname(urllib.parse.urlparse(url).path)
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError) as exc:
        return False, f"{url} unreachable: {getattr(exc, 'strerror', None) or exc}"
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        return False, (f"{url} unreachable: it is not a folder or a regular file (a FIFO, "
                       "device or socket)")
    return True, f"{url} is a local {'folder' if stat.S_ISDIR(mode) else 'file'}"


def query_gpus(environ: Mapping[str, str]) -> list[tuple[str, str]] | None:
    """[(compute_cap, name)] from nvidia-smi; None when there is no nvidia-smi."""
    if which("nvidia-smi", environ) is None:
        return None
    done = run(["nvidia-smi", "--query-gpu=compute_cap,name", "--format=csv,noheader"],
               env=environ, echo=False, check=False, timeout=30)
    if done.returncode != 0:
        return []
    rows = []
    for line in done.output.splitlines():
        parts = [p.strip() for p in line.split(",", 1)]
        if len(parts) == 2 and re.fullmatch(r"\d+\.\d+", parts[0]):
            rows.append((parts[0], parts[1]))
    return rows


@dataclass(frozen=True)
class DoctorProbes:
    """The outside world, injectable for tests."""

    disk_free: Callable[[Path], int] = disk_free
    disk_read_only: Callable[[Path], bool] = disk_read_only
    disk_no_symfollow: Callable[[Path], bool] = disk_no_symfollow
    disk_estimate_gb: Mapping[str, float] = field(default_factory=lambda: dict(DISK_ESTIMATE_GB))
    resources: Callable[[], tuple[int, float]] = host_resources
    network: Callable[[Mapping[str, str]], tuple[bool, str]] = (
        lambda env: check_url(GITHUB_URL, timeout=5.0, environ=env))
    gpus: Callable[[Mapping[str, str]], list[tuple[str, str]] | None] = query_gpus
    index: Callable[[str, Mapping[str, str]], tuple[bool, str]] = (
        lambda url, env: check_url(url, timeout=10.0, environ=env))
    cuda_roots: Sequence[Path] = DEFAULT_CUDA_ROOTS
