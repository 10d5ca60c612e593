"""Helpers for the integration layer: run the kit's CLI in a child process, compare work
directories byte for byte, seed and copy fetched work directories, and kill a build's whole
session. The fixtures that use them (the real sdist, fetched trees, a git repository, the
session's real build) are in tests/integration/conftest.py."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.conftest import _STEERING_VARS

__all__ = ["NARROW_BUILD_ARGS", "SDIST_CACHE_ENV", "_STEERING_VARS", "_kill_session",
           "_session_pids", "copy_workdir", "kvprefetch_cli", "kvprefetch_cli_split",
           "seed_downloads", "tree_bytes"]

SDIST_CACHE_ENV = "KVPREFETCH_TEST_CACHE"


def kvprefetch_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
                   timeout: float | None = 600) -> Any:
    """Run ``python -m kvprefetch ARGS`` through the kit's own runner; never raises on a
    non-zero exit (tests look at ``returncode`` and ``output``: stdout and stderr merged)."""
    from kvprefetch.runner import run

    return run([sys.executable, "-m", "kvprefetch", *args], cwd=cwd, env=env, echo=False,
               check=False, timeout=timeout)


def kvprefetch_cli_split(*args: str, env: dict[str, str] | None = None,
                         timeout: float = 600, cwd: Path | None = None) -> Any:
    """Like kvprefetch_cli but with stdout and stderr apart (for --json parsing and checking
    that notices go to stderr). Uses subprocess directly because the runner merges the two."""
    import subprocess

    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=False)


def tree_bytes(root: Path) -> dict[str, str]:
    """sha256 of EVERY file and symlink target under ``root`` (nothing skipped), for
    "byte-identical afterwards" checks; unlike kvprefetch.hashing.inventory it includes state,
    locks, build outputs and dot-files."""
    import hashlib

    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames + [d for d in dirnames if Path(dirpath, d).is_symlink()]):
            p = Path(dirpath, name)
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        for d in dirnames:
            if not any(Path(dirpath, d).iterdir()):
                out[Path(dirpath, d).relative_to(root).as_posix() + "/"] = "empty dir"
    return out


def seed_downloads(workdir: Path, sdist: Path) -> None:
    """Put a copy of the cached sdist where ``fetch --source sdist`` looks first, so the test
    exercises the real verify + unpack path without a second download. The directory is
    tagged as a kvprefetch work directory, as an earlier `fetch` that downloaded the sdist
    would have left it: fetch refuses to take over a non-empty directory it did not create."""
    import shutil

    from kvprefetch.workspace.workdir import Workdir

    Workdir(workdir).ensure()
    (workdir / "downloads").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(sdist, workdir / "downloads" / sdist.name)


def copy_workdir(template: Path, dest: Path) -> Path:
    """A private copy of a fetched work directory. The trees, state and everything a test may
    edit are real copies; pristine/ and downloads/, which no test writes into (they are only
    read, or removed whole by `clean`), are hard links to save copying ~3000 files per test
    where ``dest`` is on the template's file system (a quick test's tmp_path is in RAM, where
    copies cost little: tests/conftest.py, RAM_TMP)."""
    import shutil

    shared = ("pristine", "downloads")
    shutil.copytree(template, dest, symlinks=True,
                    ignore=lambda d, names: [n for n in names
                                             if Path(d) == template and n in shared])
    for name in shared:
        if (template / name).is_dir():
            link_tree(template / name, dest / name)
    return dest


def link_tree(src: Path, dest: Path) -> Path:
    """``src`` copied to ``dest`` as hard links where both are on one file system, else as
    copies (a quick test's tmp_path is in RAM: tests/conftest.py, RAM_TMP)."""
    import shutil

    dest.parent.mkdir(parents=True, exist_ok=True)
    link = os.stat(dest.parent).st_dev == os.stat(src).st_dev
    shutil.copytree(src, dest, symlinks=True, copy_function=os.link if link else shutil.copy2)
    return dest


# The one real kernels-only build of the test run: narrowed instantiation set (4 kernels per
# launcher source), baseline + patched, compiled for sm_90 with the machine's nvcc.
def deps_skip_reason(candidates: list[Path]) -> str:
    """Why the tests of ``--deps-dir`` skip, in words a user of the repository can act on: a
    plain clone has no ``../shared/deps`` (the project machines' copy of these archives)."""
    where = ", ".join(str(p) for p in candidates)
    return ("no offline copies of vLLM 0.10.2's three FetchContent dependencies (cutlass "
            "v4.0.0, vllm-project/flash-attention ee4d25bd, vllm-project/FlashMLA a757314c) at "
            f"{where}: only a full build without GitHub needs them. To run these tests, set "
            "KVPREFETCH_DEPS_DIR to a folder of <name>-<commit12>.tar.gz archives of them plus "
            "SHA256SUMS (docs/building.md, 'Offline full builds')")


NARROW_BUILD_ARGS = ("--kernels-only", "--arch", "9.0a", "--head-sizes", "128",
                     "--block-sizes", "16", "--kv-dtypes", "fp16,fp32")


def _session_pids(sid: int) -> list[int]:
    """Live processes in session ``sid`` (the build we started with start_new_session)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat_text = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat_text.rsplit(")", 1)[1].split()
        if int(fields[3]) == sid and fields[0] != "Z":  # fields[3] = session id
            pids.append(int(d.name))
    return pids


def _kill_session(sid: int) -> int:
    """SIGKILL every process of the session we started (by pid, never by name). Returns how
    many processes were still alive outside the build's own process group when it was killed."""
    import signal
    import time

    with contextlib.suppress(ProcessLookupError):
        os.killpg(sid, signal.SIGKILL)
    time.sleep(0.2)
    # ninja starts each compiler in its own process group, so killing ours leaves them running
    # (they would finish and rename their .o); a machine losing power or a terminal closing
    # takes them too, so take them here: every process of the session, by pid.
    leftovers = _session_pids(sid)
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while _session_pids(sid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return len(leftovers)


_REPO = Path(__file__).resolve().parents[2]


def kit_copy(tmp_path: Path) -> Path:
    """A copy of the kit in a checkout's shape (src, csrc, patches, setup.py, pyproject.toml:
    what upstream.kit_root takes for a checkout) whose own files a test may alter."""
    import shutil

    kit = tmp_path / "kit"
    for part in ("src", "csrc", "patches"):
        shutil.copytree(_REPO / part, kit / part, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "pyproject.toml"):
        shutil.copy2(_REPO / name, kit / name)
    return kit


def run_kit(kit: Path, *args: str, timeout: float = 120) -> Any:
    """``python -m kvprefetch ARGS`` from the kit copy ``kit`` (its src/ first on PYTHONPATH,
    which pytest's base environment would drop), without KVPREFETCH_WORKDIR; a run past
    ``timeout`` fails the test as a hang."""
    import subprocess

    import pytest

    env = {k: v for k, v in os.environ.items() if k != "KVPREFETCH_WORKDIR"}
    env["PYTHONPATH"] = str(kit / "src")
    try:
        return subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=env,
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"kvprefetch {' '.join(args)} hung")


def signal_until_exit(proc: Any, signums: Sequence[int]) -> str:
    """Send ``signums`` to ``proc`` one after another, 50 ms apart, until it exits; then its
    stderr (the caller kills a process still running, in its ``finally``)."""
    for signum in signums:
        if proc.poll() is not None:
            break
        proc.send_signal(signum)
        time.sleep(0.05)
    _, err = proc.communicate(timeout=30)
    return str(err)


@contextlib.contextmanager
def local_server(serve: Callable[[socket.socket, threading.Event], None]) -> Iterator[int]:
    """A server on a local port whose every connection is handed to ``serve(conn, stop)`` in a
    thread of its own; yields the port. On exit ``stop`` is set, the socket closed, and the
    kit's URL threads (``deadlines.within``) given up on are waited for, so that what they
    close is closed before the test ends."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop = threading.Event()

    def handle(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            serve(conn, stop)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        srv.close()
        for t in threading.enumerate():
            if t.name == "kvprefetch-url":
                t.join(5)

