"""Getting the vLLM 0.10.2 sdist from a package index, hash-checked and cached.

``pip download vllm==0.10.2 --no-binary :all:`` cannot be used: pip tries to build the
sdist's metadata (which needs CUDA and torch). So we ask the index's *simple* API (PEP 691
JSON, falling back to the PEP 503 HTML page that mirrors serve) for the file's URL and hash,
honouring pip's configured index (PIP_INDEX_URL / ``pip config``), and check the sha256
against our pin before anything is unpacked."""

from __future__ import annotations

import hashlib
import http.client
import os
import secrets
import socket
import stat
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

from .. import upstream
from ..errors import ConfigError, FetchError
from ..hashing import sha256_bytes, sha256_file_of_size
from ..oserrors import local_write_failure
from ..reading import read_limited
from ..runner import NEUTRAL_CWD, run
from .deadlines import stop_at, within
from .simple_api import IndexFile, parse_simple_html, parse_simple_json

_JSON = "application/vnd.pypi.simple.v1+json"
# An index's project page: PyPI's for vllm (every release's files) is a few MB.
MAX_INDEX_PAGE_BYTES = 64 << 20

# What asking a server (an index, a mirror, a proxy) for a URL can raise besides a KvprefetchError:
# urllib's URLError and OSError, and what are neither: http.client's HTTPException for an answer
# that is no HTTP (a status line of garbage, a body cut short or badly chunked, more than 100
# headers, a port that is no number, a space or control character in a URL an index lists) and
# ValueError (a NUL in a file:// path). Each of those was a traceback: from a mirror or index
# that serves them, or an https_proxy/http_proxy that is no HTTP proxy (issue 41, the nineteenth
# hostile pass).
NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    urllib.error.URLError, OSError, ValueError, http.client.HTTPException)


def open_url(url: str, timeout: float = 120) -> Any:
    """A readable stream of ``url``'s bytes. A ``file://`` URL (an index may list one) is
    opened as a regular file only, with ``O_NONBLOCK``: a FIFO there hung the download for
    good, and a device (``/dev/zero``) was read for ever (issue 41, the seventeenth hostile
    pass): a FetchError. Other errors are ``OSError`` or ``urllib.error.URLError``. The scheme
    is read as urllib reads it, in any case: an index ``FILE:///campaign/fifo#`` went to
    urllib's own file handler, which opens a FIFO and waits for good (issue 41, the
    twenty-seventh hostile pass)."""
    if urllib.parse.urlparse(url).scheme.lower() != "file":
        return within(PAGE_DEADLINE_S, lambda: urllib.request.urlopen(url, timeout=timeout), url)
    path = urllib.request.url2pathname(urllib.parse.urlparse(url).path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FetchError(f"{url} is not a regular file (a FIFO, device, socket or folder)",
                             "use PyPI or a faithful mirror (PIP_INDEX_URL) that serves the "
                             "pinned file itself")
        # the kernel's files (/proc, /sys) are regular files of no size, and some wait for
        # what the kernel says next: a link in the campaign to /proc/kmsg, at the page of a
        # file:// index there, had the prepare job wait for good (issue 41, the
        # twenty-seventh hostile pass); an index page or a pinned file is never empty
        if st.st_size == 0:
            raise FetchError(f"{url} is empty (or a kernel's file in /proc or /sys, which has "
                             "no size and may never end)",
                             "use PyPI or a faithful mirror (PIP_INDEX_URL) that serves the "
                             "pinned file itself")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def network_error_text(exc: BaseException) -> str:
    """What a network error says, with its kind where its text alone says little (an
    IncompleteRead or BadStatusLine's text is the bytes the server sent)."""
    if isinstance(exc, (urllib.error.URLError, OSError)):
        return str(exc)
    return f"{type(exc).__name__}: {str(exc)[:300]!s}"


# How long a server may take. Each wait on the socket has its own timeout, but a server (an
# index, a mirror, a proxy) that sends a byte now and then never meets it: an index page of
# spaces, one every 5 s, kept the prepare job and fetch waiting without bound, as would a
# status line or headers sent so (issue 41, the twenty-seventh hostile pass). So an index's page
# has PAGE_DEADLINE_S in all, and a download's answer as much before its first byte, then
# MIN_RATE bytes a second on average.
PAGE_DEADLINE_S = 120.0
MIN_RATE = 16 << 10


def copy_bounded(src: Any, write: Callable[[bytes], object], limit: int, url: str) -> None:
    """Copy ``src`` into ``write`` by chunks, refusing a source longer than ``limit`` bytes
    (the pinned file's size): an index or mirror that serves without end filled the work
    directory's disk (or, for a ``file://`` URL at a device, never ended); or slower than
    ``MIN_RATE`` on average (after ``PAGE_DEADLINE_S``), which no socket timeout catches.
    Each chunk is what one wait brings (``read1``), so the time is looked at as bytes come,
    and the socket is shut down at the deadline (``deadlines.stop_at``): http.client reads a chunked
    answer's size line and trailer whole, so trailer lines without end (or a size line a byte
    at a time) kept fetch and the prepare job in one read for good (the twenty-eighth pass)."""
    total = 0
    seconds = PAGE_DEADLINE_S + limit / MIN_RATE
    deadline = time.monotonic() + seconds
    read = getattr(src, "read1", src.read)
    fired, cancel = stop_at(src, seconds)

    def too_slow() -> FetchError:
        return FetchError(f"{url} serves more slowly than {MIN_RATE >> 10} KiB/s on average "
                          f"({total} of {limit} bytes so far); nothing of it was kept",
                          "check the network (and https_proxy/http_proxy, if set) or use "
                          "a faster mirror (PIP_INDEX_URL), then run the command again")

    try:
        while (chunk := read(1 << 20)) or fired.is_set():  # (the shutdown's end: too slow)
            total += len(chunk)
            if total > limit:
                raise FetchError(f"{url} serves more than the {limit} bytes of the pinned file; "
                                 "nothing of it was kept",
                                 "use PyPI or a faithful mirror (PIP_INDEX_URL)")
            if time.monotonic() > deadline or fired.is_set():
                raise too_slow()
            write(chunk)
    except NETWORK_ERRORS:
        if fired.is_set():  # the read the shutdown ended
            raise too_slow() from None
        raise
    finally:
        cancel()


PIP_CONFIG_TIMEOUT_S = 30.0  # `pip config get` answers in about a second


def configured_index_url(environ: dict[str, str] | None = None) -> str:
    """PIP_INDEX_URL, else ``pip config get global.index-url``, else PyPI; checked as
    ``--index-url`` is (check_index_url): a value that is no http(s):// or file:// URL is a
    ConfigError, never a traceback from urllib."""
    env = dict(os.environ if environ is None else environ)
    if env.get("PIP_INDEX_URL"):
        url = env["PIP_INDEX_URL"]
        check_index_url(url, "PIP_INDEX_URL")
        return url.rstrip("/")
    # `--log /dev/null`: pip appends a debug log to the file its `log` option names (PIP_LOG,
    # or `log =` in a pip.conf), through any link at that name; PIP_LOG=<campaign>/pip.log and
    # a link put there by whoever writes the campaign had the prepare job append pip's log to a
    # file outside (issue 41, the twenty-first hostile pass). The command line overrides both.
    # Within PIP_CONFIG_TIMEOUT_S: a pip.conf that is a FIFO (PIP_CONFIG_FILE, or one planted
    # where the user's HOME has the campaign) had `slurm submit` wait for good, and /dev/zero
    # read without end (issue 41, the twenty-sixth hostile pass).
    # pip's own options from this shell (PIP_VERBOSE=1 printed pip's file list before the
    # URL; PIP_QUIET, or a value pip refuses such as PIP_NO_CACHE_DIR=maybe, printed no URL)
    # had submit send PyPI to every job in place of the user's mirror, silently (issue 41, the
    # twenty-sixth hostile pass): pip is asked with its settings' file alone.
    # (run from NEUTRAL_CWD, an empty folder of its own: nothing to import there, and an empty
    # or relative PYTHONPATH entry names nothing either; the twenty-sixth and -seventh passes)
    child = {k: v for k, v in env.items() if not k.startswith("PIP_") or k == "PIP_CONFIG_FILE"}
    start = time.monotonic()
    try:
        done = run([sys.executable, "-m", "pip", "--log", os.devnull, "config", "get",
                    "global.index-url"], env=child, echo=False, check=False,
                   cwd=NEUTRAL_CWD, timeout=PIP_CONFIG_TIMEOUT_S)
    except Exception:  # noqa: BLE001 -- pip missing or broken: the default index still works
        done = None
    if done is not None and done.returncode != 0 and \
            time.monotonic() - start >= PIP_CONFIG_TIMEOUT_S:
        raise ConfigError(
            f"`pip config get global.index-url` did not answer within {PIP_CONFIG_TIMEOUT_S:g} s:"
            " one of pip's configuration files is not a plain file (a FIFO, a device) or never"
            " ends (PIP_CONFIG_FILE, ~/.config/pip/pip.conf, ~/.pip/pip.conf, /etc/pip.conf), or"
            " this machine is too busy to start pip",
            "make pip's configuration files plain files (unset PIP_CONFIG_FILE if it names"
            " another), or set PIP_INDEX_URL to the index's URL, which pip then need not be"
            " asked")
    out = done.output.strip() if done is not None else ""
    if out.startswith(("http://", "https://", "file://")):
        url = out.splitlines()[0]
        check_index_url(url, "pip config global.index-url")
        return url.rstrip("/")
    return upstream.DEFAULT_INDEX_URL


def check_index_url(url: str | None, option: str = "--index-url") -> str | None:
    """An http(s):// or file:// URL with a host (http) or a path (file); else a ConfigError."""
    if url is None:
        return None
    parsed = url_parts(url)
    ok = parsed is not None and (
        (parsed.scheme in ("http", "https") and bool(parsed.netloc))
        or (parsed.scheme == "file" and bool(parsed.path)))
    # a byte that is not UTF-8 (surrogateescape) was "cannot reach the package index:
    # UnicodeEncodeError / To fix: check the network" (issue 41, the twenty-third pass)
    if not ok or any(ord(c) < 0x20 or c == "\x7f" or c.isspace() or 0xDC80 <= ord(c) <= 0xDCFF
                     for c in url):
        how = ("pass" if option.startswith("--") else
               "set PIP_INDEX_URL (or unset it) to" if option == "PIP_INDEX_URL" else
               "set pip's global.index-url (`pip config set global.index-url URL`) to")
        raise ConfigError(f"{option} {url!r} is not an http://, https:// or file:// URL",
                          f"{how} the simple index's URL, e.g. https://pypi.org/simple")
    return url


def url_parts(url: str) -> urllib.parse.ParseResult | None:
    """``url`` as urllib reads it, or None where urllib cannot: a ``[`` or ``]`` of an IPv6
    host unpaired (``http://[::1``) or a bracketed host that is no address was urllib's
    ValueError, a traceback from ``--index-url``, PIP_INDEX_URL (submit, the prepare job) and
    ``--repo-url file://`` (issue 41, the twenty-eighth hostile pass)."""
    try:
        return urllib.parse.urlparse(url)
    except ValueError:
        return None


def locate_file(index_url: str, project: str, filename: str, sha256: str,
                timeout: float = 30, unreachable_fix: str = "") -> IndexFile:
    """Where the index serves ``filename`` of ``project``; refused if it advertises another
    sha256 than the pinned one."""
    page = f"{index_url.rstrip('/')}/{project}/"
    try:
        # a file:// index's page through open_url (a regular file, opened without blocking):
        # urllib's own file handler opened a FIFO at `file:///campaign/fifo#` (the fragment
        # holds the `/vllm/`) and the prepare job and fetch waited for good (issue 41, the
        # twenty-seventh hostile pass)
        if urllib.parse.urlparse(page).scheme.lower() == "file":
            with open_url(_file_page(page)) as resp:
                ctype, raw = "", resp.read(MAX_INDEX_PAGE_BYTES + 1)
        else:
            req = urllib.request.Request(page, headers={"Accept": f"{_JSON}, text/html;q=0.5"})

            def fetch_page() -> tuple[str, bytes]:
                with urllib.request.urlopen(req, timeout=timeout) as resp:
                    return (resp.headers.get("Content-Type", ""),
                            resp.read(MAX_INDEX_PAGE_BYTES + 1))
            ctype, raw = within(PAGE_DEADLINE_S, fetch_page, page)
        if len(raw) > MAX_INDEX_PAGE_BYTES:  # a page without end filled memory
            raise ValueError(f"the page is larger than {MAX_INDEX_PAGE_BYTES} bytes")
        body = raw.decode("utf-8", errors="replace")
    except NETWORK_ERRORS as exc:
        raise FetchError(f"cannot reach the package index {page}: {network_error_text(exc)}",
                         "check the network (and https_proxy/http_proxy, if set) or point "
                         "PIP_INDEX_URL at a reachable mirror"
                         + (f"; or {unreachable_fix}" if unreachable_fix else "")) from exc
    try:
        found = (parse_simple_json(body, filename, page) if "json" in ctype
                 else parse_simple_html(body, filename, page))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise FetchError(f"the index page {page} is malformed ({type(exc).__name__}: {exc})",
                         "use PyPI or a faithful mirror (PIP_INDEX_URL)") from None
    if found is None:
        raise FetchError(f"the index {page} does not list {filename}",
                         f"use an index that mirrors PyPI's {project} (PIP_INDEX_URL)")
    if found.sha256 and found.sha256 != sha256:
        raise FetchError(f"the index {page} advertises sha256 {found.sha256} for "
                         f"{filename}, but the pinned hash is {sha256}",
                         "your index serves a different file under this name; use PyPI or a "
                         "faithful mirror")
    return found


def _file_page(page: str) -> str:
    """A ``file://`` index's page: a folder's ``index.html``, as pip and uv read one (the folder
    was "not a regular file ... use a faithful mirror"; issue 41, the thirty-first pass)."""
    parts = urllib.parse.urlparse(page)
    if not os.path.isdir(urllib.request.url2pathname(parts.path)):
        return page
    return parts._replace(path=parts.path.rstrip("/") + "/index.html").geturl()


def locate_sdist(index_url: str, timeout: float = 30) -> IndexFile:
    return locate_file(index_url, "vllm", upstream.SDIST_NAME, upstream.SDIST_SHA256, timeout,
                       f"download {upstream.SDIST_NAME} yourself and pass --source PATH")


def sha256_file(path: Path) -> str | None:
    """A cached sdist's sha256; None for a file of another size than the sdist's, never read
    (``hashing.sha256_file_of_size``)."""
    return sha256_file_of_size(path, upstream.SDIST_SIZE)


def pinned_bytes(path: Path, size: int, sha256: str, name: str, again: str) -> bytes:
    """A pinned download's bytes (the sdist, a CUDA 12 archive), read once (bounded, never
    blocking) and checked against the pin, so the bytes unpacked are the bytes hashed. Each was
    hashed by path and opened again by path to unpack, so a swap loop in the work directory
    exchanging it for a FIFO hung fetch or the CUDA 12 assembly for good, and one exchanged for
    another archive had that one's files unpacked (issue 41, the eighteenth hostile pass).
    ``again``: what happens when the user moves it away and reruns."""
    try:
        data = read_limited(path, size)
    except (OSError, ValueError) as exc:
        raise FetchError(f"cannot read {path} back: {exc}",
                         f"move {path} away if it is not the pinned {name}, then rerun "
                         f"({again})") from None
    if sha256_bytes(data) != sha256:
        raise FetchError(f"{path} changed after its sha256 was checked: it is no longer the "
                         f"pinned {name}; nothing of it was unpacked",
                         f"make sure nothing else writes {path.parent}, then rerun")
    return data


def verify_sdist(path: Path, delete: bool = True, *, root: Path | None = None) -> None:
    """Refuse (and, when ``delete``, delete) a cached file whose sha256 is not the pinned one;
    a file kvprefetch did not download (``delete`` False) is left as it is. ``root``: the work
    directory (or campaign) the cache is in: the deletion is then made relative to the cache
    folder opened from it without following a link (``confine.remove_path``)."""
    # a file of another size is not the sdist, and is never read (a sparse 15 TB file there
    # was hashed for hours: the eighteenth hostile pass)
    digest = sha256_file(path)
    if digest != upstream.SDIST_SHA256:
        actual = (f"sha256 {digest}" if digest is not None else
                  f"{path.stat().st_size} bytes (the sdist has {upstream.SDIST_SIZE}), sha256 "
                  "not computed")
        if not delete:
            raise FetchError(f"{path} has {actual}, not the pinned sha256 "
                             f"{upstream.SDIST_SHA256}, and kvprefetch did not download it: it "
                             "was left as it is",
                             f"move {path} away (or replace it by the real sdist), then rerun")
        _remove(path, root)
        raise FetchError(f"{path.name} has {actual}, expected sha256 {upstream.SDIST_SHA256}; "
                         "the corrupted or tampered file was deleted and nothing was unpacked",
                         "run the command again to download a fresh copy")


def _remove(path: Path, root: Path | None) -> None:
    """Remove the file ``path``: from ``root`` down, never through a link, when ``root`` is
    given (a ``downloads/`` swapped for a link to a folder outside after the checks had the
    unlink by path delete the file of that name there: issue 41, the seventeenth hostile
    pass), else by path (a cache the caller names, outside any work directory)."""
    if root is None:
        path.unlink()
        return
    from ..workspace import confine

    confine.remove_path(root, path, family=FetchError)


def _partial_name() -> str:
    """A new partial download's name: ``.download-<pid>-<random>.<host>``. The host's tag
    (sha256 of its name, 8 hex digits) keeps a pid from being judged on another machine: the
    campaign's ``cache/`` is shared by the nodes, and a prepare job on one node removed a
    running job's partial on another as a dead pid's (issue 41, the twenty-seventh pass)."""
    return f".download-{os.getpid()}-{secrets.token_hex(4)}.{_host_tag()}"


def _host_tag() -> str:
    """This host's tag in a partial download's name: sha256 of its name, 8 hex digits."""
    name = socket.gethostname().encode("utf-8", "surrogateescape")
    return hashlib.sha256(name).hexdigest()[:8]


def _remove_dead_downloads(downloads: Path, root: Path | None = None) -> None:
    """Partial downloads of killed runs (``.download-<pid>-*`` of a pid that is gone, made on
    this host: ``_partial_name``), listed and removed relative to the folder's descriptor
    (opened from ``root`` down when given, never through a link): by path, a ``downloads/``
    swapped for a link meanwhile had a file of that name in the folder it named deleted (the
    seventeenth hostile pass)."""
    from ..workspace import confine
    from ..workspace.ownership import pid_alive, valid_pid

    dfd = confine.open_dir(downloads, root=root, what="clean up partial downloads in",
                           family=FetchError)
    host = _host_tag()
    try:
        for name in os.listdir(dfd):
            if not name.startswith(".download-") or name.count("-") < 2:
                continue
            pid = name.split("-")[1]
            tag = name.rpartition(".")[2] if name.count(".") > 1 else ""
            if tag and tag != host:
                continue  # another host's: its pid means nothing here
            if not (pid.isdigit() and valid_pid(int(pid)) and int(pid) != os.getpid()
                    and not pid_alive(int(pid))):
                continue
            with suppress(FileNotFoundError):
                if stat.S_ISREG(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode):
                    os.unlink(name, dir_fd=dfd)
    finally:
        os.close(dfd)


def ensure_sdist(downloads: Path, index_url: str | None = None, *, root: Path | None = None,
                 may_delete: Callable[[Path], bool] | None = None,
                 partials: bool = True) -> Path:
    """``_ensure_sdist``, whose fixes name the index by PIP_INDEX_URL, the setting ``fetch``
    reads when no ``--index-url`` is given: given one (``index_url``), PIP_INDEX_URL is not
    read, and `fetch --index-url http://127.0.0.1:9/simple` was told "point PIP_INDEX_URL at
    a reachable mirror", which changed nothing (issue 41, the thirty-seventh hostile pass)."""
    try:
        return _ensure_sdist(downloads, index_url, root=root, may_delete=may_delete,
                             partials=partials)
    except FetchError as exc:
        if index_url is None or "PIP_INDEX_URL" not in (exc.fix or ""):
            raise
        raise FetchError(exc.cause, (exc.fix or "").replace("PIP_INDEX_URL", "--index-url")) \
            from exc


def _ensure_sdist(downloads: Path, index_url: str | None = None, *, root: Path | None = None,
                  may_delete: Callable[[Path], bool] | None = None,
                  partials: bool = True) -> Path:
    """Return the path of a verified sdist in ``downloads``, downloading it if needed. With
    ``root`` (the work directory), ``downloads`` must be inside it with no symlink on the way;
    ``may_delete`` says whether a cached file with the wrong hash is the kit's to delete;
    ``partials``: whether killed runs' partial downloads (``.download-<pid>-*``, found by name)
    are the kit's to remove: not in a work directory adopted with the user's files in it,
    where a file of that name was the user's (issue 41, the seventeenth hostile pass)."""
    from ..workspace import confine

    if root is not None:
        confine.check_target(root, downloads / upstream.SDIST_NAME, what="download into",
                             family=FetchError)
    target = downloads / upstream.SDIST_NAME
    if os.path.lexists(target) and not confine.is_plain_file(target):
        raise FetchError(f"{target} is not a regular file (a symlink, folder, FIFO or device)",
                         f"move {target} away, then rerun")
    if target.is_file():
        verify_sdist(target, delete=may_delete(target) if may_delete is not None else True,
                     root=root)
        return target
    found = locate_sdist(index_url or configured_index_url())
    confine.ensure_dir(downloads, root=root, family=FetchError)
    if partials:
        _remove_dead_downloads(downloads, root)
    # streamed into a new temporary beside the target and renamed over it, both relative to
    # the folder opened from the work directory down without following a link
    # (confine.open_new), the hash checked before the rename: by path (mkstemp, chmod,
    # os.replace), a ``downloads/`` swapped for a link to a folder outside during the download
    # had the 10 MB partial made there and the user's own vllm-0.10.2.tar.gz there replaced
    # (issue 41, the seventeenth hostile pass)
    tmp_name = _partial_name()
    try:
        with confine.open_new(target, root=root, family=FetchError, tmp_name=tmp_name) as out, \
                open_url(found.url) as resp:
            digest = hashlib.sha256()

            def write(chunk: bytes) -> None:
                digest.update(chunk)
                out.write(chunk)

            copy_bounded(resp, write, upstream.SDIST_SIZE, found.url)
            if digest.hexdigest() != upstream.SDIST_SHA256:
                raise FetchError(f"{upstream.SDIST_NAME} as downloaded from {found.url} has "
                                 f"sha256 {digest.hexdigest()}, expected "
                                 f"{upstream.SDIST_SHA256}; the download was deleted and "
                                 "nothing was unpacked",
                                 "run the command again to download a fresh copy")
    except NETWORK_ERRORS as exc:
        local = local_write_failure(exc, downloads)
        if local is not None:  # this machine's disk, not the network
            raise FetchError(f"download of {found.url} failed: {local[0]}", local[1]) from exc
        raise FetchError(f"download of {found.url} failed: {network_error_text(exc)}",
                         "check the network (and https_proxy/http_proxy, if set) and run the "
                         "command again") from exc
    return target
