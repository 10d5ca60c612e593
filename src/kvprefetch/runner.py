"""The one door for subprocesses. ``run`` echoes ``+ cmd``, tees the full output into a log
file, resolves the program on the *child's* PATH, and raises ``CommandError`` with the command,
exit code, log path and last lines on failure. No other module imports ``subprocess``.

It stays one module past the ~500-line mark: it is that one door, and what makes a child stop
(a Ctrl-C, the kit's signals, a ``timeout``) shares its table of live children and pidfds. How a
tree of processes below a child is found and stopped lives in ``proctree``."""

from __future__ import annotations

import errno
import os
import re
import select
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TextIO

from . import proctree
from .console import escaped
from .errors import CommandError, ConfigError
from .oserrors import not_forked

_NINJA_PROGRESS = re.compile(r"^\[(\d+)/(\d+)\]")


@dataclass(frozen=True)
class Completed:
    argv: list[str]
    returncode: int
    output: str
    log: Path | None


# Where a Python child runs when it reads no path relative to the caller's folder: ``python -c``
# and ``python -m`` put their working folder first on ``sys.path``, and the kit's is the user's,
# often the work directory itself (``--workdir .``): a ``json/`` or ``pip/`` planted there ran in
# the kit's own interpreter's probe (build) and pip (fetch) (issue 41, the twenty-fourth pass).
class _Neutral(str):
    """``NEUTRAL_CWD``'s type: ``run`` knows it by it, and starts the child in a new empty
    folder of its own in its place."""


NEUTRAL_CWD: str = _Neutral("/")
# ... and `/` is no neutral folder where a work directory or campaign is one of its folders (a
# campaign at `/pip`, whose writer put an `__init__.py` there, ran it in submit's `python -m
# pip config get`, and still did through an empty PYTHONPATH entry (`PYTHONPATH=/x:`, the
# working folder): issue 41, the twenty-sixth hostile pass). Nor for a Python child started
# there: with the work directory at `/json`, its writer's `json/__init__.py` ran in the base
# interpreter's probe (`python -c 'import json, ...'`, `build --kernels-only`), as a `/venv`,
# `/ensurepip` or `/pip` would in `-m venv`, `-m ensurepip` or pip (the twenty-seventh pass).
# So ``run`` starts a child given ``NEUTRAL_CWD`` in a new empty folder only this user can
# enter, outside every work directory (``ownership.private_dir``), removed when it ends.
@contextmanager
def _temporary_dir(prefix: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix=f"kvprefetch-{prefix}-") as made:
        yield Path(made)


# The maker of ``NEUTRAL_CWD``'s folder: ``ownership.private_dir`` once the workspace layer is
# imported (it also refuses a system temp folder inside a work directory), else a plain one.
PRIVATE_DIR: list[Callable[[str], AbstractContextManager[Path]]] = [_temporary_dir]


def absolute_path(path: str) -> str:
    """``PATH`` less its relative entries (``.``, empty, ``bin``)."""
    return os.pathsep.join(e for e in path.split(os.pathsep) if os.path.isabs(e))


# The PATH the kit was started with, before ``leave_out_relative_path`` (``slurm plan`` names
# what the jobs' PATH leaves out of it).
CALLER_PATH: list[str | None] = [None]


def leave_out_relative_path() -> None:
    """At start-up: this process's own PATH without its relative entries, for what runs in it
    and starts programs by a bare name on its own (``platform.platform()``'s ``uname -p``,
    GitPython, ``ctypes.util``): with ``cd W`` and ``PATH=:$PATH``, the build's manifest ran a
    ``uname`` planted in the work directory (issue 41, the twenty-sixth pass; ``which`` says
    more). An unset PATH becomes ``os.defpath``, the one ``which`` searched: children got none,
    and nvcc's gcc, started by a bare name, found no ``cc1plus`` ("use a CUDA toolkit >= 12.8";
    issue 41, the thirty-fourth pass: ``env -i``)."""
    CALLER_PATH[0] = os.environ.get("PATH")
    os.environ["PATH"] = absolute_path(os.environ.get("PATH", os.defpath))


def which(program: str, env: Mapping[str, str] | None = None) -> str | None:
    """Resolve ``program`` on the PATH of ``env`` (the child's), not the parent's, to an
    absolute path, the PATH's relative entries (``.``, empty, ``bin``) left out. Such an entry
    names the current folder, and the caller's is often the work directory (``cd W && kvprefetch
    doctor --workdir .``): with a careless trailing ``:`` (``PATH=$PATH:$UNSET``) a
    ``nvidia-smi``, ``cuobjdump``, ``uv`` or ``ccache`` planted there, which the host lacks,
    ran as the user (issue 41, the twenty-sixth hostile pass; the job side has left them out
    since the seventeenth). The result was made absolute before (the seventh pass: ``./git``
    checked here ran inside the tree)."""
    path = (env if env is not None else os.environ).get("PATH", os.defpath)
    found = shutil.which(program, path=absolute_path(path))
    return os.path.abspath(found) if found is not None else None


def quote(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(str(a)) for a in argv)


# Set by the workspace layer (``confine.open_log_dir``): a descriptor of a log's folder opened
# from the work directory holding it down, or None for a folder in no work directory (issue 41,
# the thirteenth hostile pass: a build folder swapped for a link had logs appended outside).
LOG_DIR_OPENER: Callable[[Path], int | None] | None = None


def open_log(path: Path) -> TextIO:
    """The log, opened to append, never through a symlink: the log file (``O_NOFOLLOW``) and
    its folder must not be links, and only a regular file is appended to (a FIFO is never
    waited on). A log lives in a build folder of the work directory, which anyone who writes
    there may have changed (issue 41, third pass: a link planted at ``logs/NN-step.log`` had
    the build's output appended to the file it pointed at)."""
    if path.parent.is_symlink():
        raise ConfigError(f"refusing to write the log {path}: its folder {path.parent} is a "
                          "symlink, and kvprefetch never writes through one",
                          f"replace the symlink {path.parent} by a real directory, then rerun")
    dfd = None
    try:
        # inside a work directory: its folder made and opened from the work directory down,
        # never through a folder swapped for a link (the workspace layer's LOG_DIR_OPENER)
        dfd = LOG_DIR_OPENER(path.parent) if LOG_DIR_OPENER is not None else None
        if dfd is None:
            path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path if dfd is None else path.name, os.O_WRONLY | os.O_APPEND | os.O_CREAT
                     | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644, dir_fd=dfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"refusing to write the log {path}: it is a symlink, and "
                              "kvprefetch never writes through one",
                              f"move the symlink {path} away, then rerun") from None
        if exc.errno != errno.ENXIO:  # ENXIO: a FIFO nobody reads (O_NONBLOCK); opened by
            # its name in its folder's descriptor: named by its whole path
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        fd = -1
    finally:
        if dfd is not None:
            os.close(dfd)
    if fd < 0 or not stat.S_ISREG(os.fstat(fd).st_mode):
        if fd >= 0:
            os.close(fd)
        raise ConfigError(f"refusing to write the log {path}: it is not a regular file (a "
                          "FIFO, device or socket)", f"move {path} away, then rerun")
    links = os.fstat(fd).st_nlink
    if links > 1:  # a hard link: appending would write the file under its other name too,
        os.close(fd)  # perhaps outside the work directory (issue 41, ninth pass)
        raise ConfigError(f"refusing to write the log {path}: it has {links} hard links (the "
                          "same file under another name, perhaps outside the work directory)",
                          f"move {path} away (kvprefetch makes a new log), then rerun")
    os.set_blocking(fd, True)
    # a byte of a path that is not UTF-8 (a work directory named so) is written as that byte:
    # the log's first line, the command as it ran, was a UnicodeEncodeError traceback (issue
    # 41, the twenty-third hostile pass)
    return open(fd, "a", encoding="utf-8", errors="surrogateescape", closefd=True)


def check_child_tmpdir(child_env: Mapping[str, str]) -> None:
    """Refuse a child ``TMPDIR`` that is set but not an absolute path to a writable directory.
    nvcc, gcc and ninja's compilers write their temporaries under it by plain concatenation:
    an empty one put ``/tmpxft_*`` files into ``/``, a relative one into the command's
    folder, and a FIFO or a file made doctor blame the CUDA toolkit (issue 41, sixth pass)."""
    tmp = child_env.get("TMPDIR")
    if tmp is None:
        return
    if not (os.path.isabs(tmp) and os.path.isdir(tmp) and os.access(tmp, os.W_OK | os.X_OK)):
        raise ConfigError(
            f"TMPDIR={tmp!r} is not an absolute path to a writable directory; the compilers the "
            "kit runs write their temporary files under it (an empty TMPDIR puts them in /)",
            "unset TMPDIR, or set it to a writable directory (e.g. export TMPDIR=/tmp)",
        )
    TEMP_CHECK[0](tmp)


# The check of a child's TMPDIR that only the workspace layer can make (``foreign
# .refuse_foreign_temp``: no link of another user's on the way, no folder above it of another
# user's, the folder itself not another user's nor writable by others without the sticky bit),
# set by ``workspace/ownership`` as it is imported, as ``PRIVATE_DIR`` is. A ``TMPDIR`` through
# ``nobody``'s link had doctor's probe (nvcc, gcc, as) and apply's ``git apply`` write in the
# folder nobody chose (issue 41, the thirty-ninth hostile pass).
TEMP_CHECK: list[Callable[[str], None]] = [lambda tmp: None]


# The children running now (any thread's), so that an interrupt stops them all at once: a
# build runs each tree's ninja in a worker thread, which no exception of the main thread
# reaches; it read ninja's output until the build ended while the main thread waited for it
# (issue 41, the ninth hostile pass: SIGTERM, or SIGINT sent to the kit alone, hung a build
# for its whole compile). Each with its pidfd (opened before anything can reap it), or None
# where the kernel has none.
_LIVE: dict[subprocess.Popen[str], int | None] = {}
_LIVE_LOCK = threading.RLock()  # a pidfd is closed only while no stop is using it
_STOPPING = threading.Event()
# While the main thread is inside ``Popen`` (the child forked, its exec awaited), an exception
# raised by a signal handler leaves the child running with no object to stop it by (the
# standard library closes the pipes and lets it be): the kit then exited and the child ran on
# (issue 41, the eleventh hostile pass: about one stop in five that came as a child started).
# The handlers call ``raise_when_safe``, which keeps that exception here until the child is
# listed, then ``run`` raises it and stops the child as any interrupted one.
_MAIN_STARTING = [False]
_DEFERRED: list[BaseException] = []


# Blocks that a stop must not break into (``stops_held``), nested: their count.
_HELD = [0]


def raise_when_safe(exc: BaseException) -> None:
    """Raise ``exc`` (a signal handler's ``KeyboardInterrupt``) now, or, while the main thread
    is starting a child, as soon as that child is listed among the live ones, or, inside
    ``stops_held``, when that block ends."""
    if _MAIN_STARTING[0] or _HELD[0]:
        _DEFERRED.append(exc)
        return
    raise exc


@contextmanager
def stops_held() -> Iterator[None]:
    """Run the block whole: a stop signal's exception that comes meanwhile (its handler still
    counts it and stops the children) is raised when the block ends, the first one. For
    removals that must not be broken off: ``shutil.rmtree``'s descriptor walk broken by a
    ``KeyboardInterrupt`` closed a folder's descriptor twice, and the ``EBADF`` it then raised
    ended the removal of a private folder, left in the system temp (issue 41, the fifteenth
    hostile pass: a signal storm left ``kvprefetch-sdist-*``, up to 130 MB each, after 3 of
    14 stopped fetches).

    The main thread's only: a signal's handler, and the exception it raises, run in the main
    thread alone, so a worker thread has nothing to hold; a worker's block counted here (two
    trees built at once, each with its private folder) held the main thread's stop until the
    worker's block ended and then raised it in the worker instead."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _HELD[0] += 1
    try:
        yield
    finally:
        _HELD[0] -= 1
        if not _HELD[0] and not _MAIN_STARTING[0] and _DEFERRED:
            first = _DEFERRED[0]
            _DEFERRED.clear()
            raise first


def _popen(args: list[str], **kwargs: Any) -> subprocess.Popen[str]:
    """``subprocess.Popen``, during which the main thread's signal exceptions wait
    (``raise_when_safe``)."""
    if threading.current_thread() is not threading.main_thread():
        return subprocess.Popen(args, **kwargs)
    _MAIN_STARTING[0] = True
    try:
        return subprocess.Popen(args, **kwargs)
    finally:
        _MAIN_STARTING[0] = False  # a plain store: no signal handler runs before the return


def _raise_deferred() -> None:
    if _DEFERRED and not _HELD[0]:  # inside ``stops_held``, raised when that block ends
        exc = _DEFERRED.pop()
        _DEFERRED.clear()
        raise exc


def _signal_tree(proc: subprocess.Popen[str], signum: int, *, whole: bool = False,
                 pidfd: int | None = None) -> None:
    """``signum`` to the child and to every process below it in the kit's own process group:
    what a terminal's Ctrl-C reaches (nvcc leaves cicc running, and its ``tmpxft_*`` files,
    when only it is signalled). A process in a group of its own below (ninja starts each
    command so) is left to its parent, which forwards the signal and cleans up after it, as
    under a terminal; ``whole`` (SIGKILL) takes every process below. The child stays in the
    kit's group and session, so a ``kill -- -PGID`` or a session's end still takes them all.

    Only the kit's own processes are ever signalled (issue 41, the tenth hostile pass): a
    child already reaped (its ``wait`` returned in a worker thread, or ``_stop``'s poll, while
    it was still listed) had its number signalled, and every process whose parent had that
    number, though the system may have given the number to another program (a second Ctrl-C
    could then SIGKILL a stranger's tree). Each process is signalled through a pidfd, and one
    below the child only once its parent link is read again after the pidfd is open, while
    that parent is still alive: a number reused in between names another process, which is
    skipped. Where the kernel has no pidfd, a reaped child (and what /proc shows below its
    number) is skipped, and the rest is signalled by number as before."""
    if pidfd is None:
        pidfd = _LIVE.get(proc)
    if pidfd is None:
        _signal_tree_by_number(proc, signum, whole=whole)
        return
    own = os.getpgrp()
    if not proctree.send(pidfd, 0):
        return  # reaped: its number, and what is below that number, may be anyone's now
    below = proctree.below(proc.pid, pidfd)
    try:
        if whole and signum == signal.SIGKILL:
            tree = {proc.pid: pidfd, **below}
            proctree.kill_all(tree)
            below = {pid: fd for pid, fd in tree.items() if fd != pidfd}
            return
        for pid, fd in {proc.pid: pidfd, **below}.items():
            with suppress(OSError):
                if whole or pid == proc.pid or os.getpgid(pid) == own:
                    proctree.send(fd, signum)
                    if signum not in (signal.SIGKILL, signal.SIGCONT):
                        proctree.send(fd, signal.SIGCONT)  # a stopped one (Ctrl-Z) acts on it now
    finally:
        for fd in below.values():
            os.close(fd)


def _signal_tree_by_number(proc: subprocess.Popen[str], signum: int, *, whole: bool) -> None:
    """Without pidfds: a child whose ``returncode`` is set has been reaped, and one whose
    ``/proc`` parent is no longer this process has too (a worker thread's ``wait`` between its
    ``waitpid`` and setting ``returncode``, where a stop in the main thread can run; issue 41,
    the eleventh hostile pass: its number, perhaps another program's by then, was signalled,
    and everything below it): neither is signalled."""
    if proc.returncode is not None or proctree.parent_of(proc.pid) != os.getpid():
        return
    own = os.getpgrp()
    for pid in [proc.pid, *proctree.descendants(proc.pid)]:
        with suppress(OSError):
            if whole or pid == proc.pid or os.getpgid(pid) == own:
                os.kill(pid, signum)
                if signum not in (signal.SIGKILL, signal.SIGCONT):
                    os.kill(pid, signal.SIGCONT)


def stop_children(signum: int | None = None) -> None:
    """The command is stopping (Ctrl-C, SIGTERM, SIGHUP; called from the signal handler): send
    every running child and all below it SIGINT, what a Ctrl-C in a terminal sends them, and
    start no new child in a worker thread (the main thread's own cleanups still may).
    ``signum`` SIGKILL: a second interrupt, which takes every process below at once."""
    _STOPPING.set()
    signum = proctree.stop_signal() if signum is None else signum
    with _LIVE_LOCK:
        for proc, fd in list(_LIVE.items()):
            _signal_tree(proc, signum, whole=signum == signal.SIGKILL, pidfd=fd)


@contextmanager
def others_stopped() -> Iterator[None]:
    """Around a library call that starts processes of its own (GitPython's ``git clone``): on
    a stop or an error, ``stop_others``, sparing every process that was there before the
    call: its children then, and any that becomes one meanwhile. A process whose parent ends is
    given to the nearest subreaper above it, which is this one when it is PID 1 of a namespace
    or was made one before an ``exec`` of the kit (``PR_SET_CHILD_SUBREAPER`` survives it): a
    wrapper's helper that ended while ``fetch --source git`` cloned left its own child to the
    kit, which then stopped it as its clone's (issue 41, the thirty-eighth hostile pass)."""
    before = proctree.every()
    try:
        yield
    except BaseException:
        stop_others(spare=before)
        raise


def stop_others(spare: Collection[tuple[int, int]] = ()) -> None:
    """Stop every process below this one that ``run`` did not start (a library's own child:
    GitPython's ``git clone``), and wait until each has ended. No stop signal reaches those
    (``stop_children`` knows ``run``'s alone): a stopped ``fetch --source`` of a git
    repository removed its private folder while git was still checking files out into it, and
    left the half-made clone (up to the whole checkout) in the system temp folder, 5 runs of
    6 (issue 41, the thirty-sixth hostile pass). For the main thread's cleanup of a stop or
    an error, before it removes what such a child writes in.

    The processes in ``spare`` (pid, ``proctree.start_time``), and all below them, are left:
    they are not the kit's. A process inherits the children of the one it replaced
    (``sleep 300 & exec kvprefetch fetch ...``, a wrapper's monitor), and every fetch of a
    git repository that failed, a bad URL included, sent them SIGINT, waited 10 s for one that
    ignores it (a shell's background job does) and killed it (issue 41, the thirty-seventh
    hostile pass)."""
    me = proctree.pidfd_of(os.getpid())
    if me is None:
        return
    try:
        tree = proctree.below(os.getpid(), me)
    finally:
        os.close(me)
    with _LIVE_LOCK:
        ours = {proc.pid for proc in _LIVE}
    # the spared below this one only (``spare`` may hold every process of the system)
    ours |= {pid for pid, started in spare
             if pid in tree and proctree.start_time(pid) == started}
    for pid in ours:  # run's own children, the spared, and all below them: not stopped here
        for p in (pid, *proctree.descendants(pid)):
            fd = tree.pop(p, None)
            if fd is not None:
                os.close(fd)
    try:
        proctree.stop_tree(tree)
    finally:
        for fd in tree.values():
            os.close(fd)


def _stop(proc: subprocess.Popen[str]) -> None:
    """Stop a child the kit is leaving (Ctrl-C, SIGTERM, SIGHUP, a timeout, an error) as a
    Ctrl-C in a terminal stops it: SIGINT to it and every process below it. nvcc then removes its
    ``tmpxft_*`` files and stops cicc and ptxas, ninja stops its own commands (each in a
    process group of its own) and removes their partial outputs; a SIGKILL of the child alone
    had left them compiling, into the build folder after the kit had released its lock and
    into TMPDIR (issue 41, the ninth hostile pass). SIGKILL to them all after
    ``STOP_GRACE_S`` or at a second interrupt.

    Every process below the child when the stop began is waited for too, though the child has
    ended: ninja forwards the stop to its commands and exits, and nvcc, its ``sh`` and
    ``cudafe++`` (each command's group) outlived the kit by up to 2 s, reparented to init, after
    the build's lock was released (issue 41, the twenty-ninth hostile pass).
    ``proctree.end_below`` ends them, after the child's own grace: a stop whose child and
    processes below all ignore it takes up to ``STOP_GRACE_S + BELOW_GRACE_S + STOP_GRACE_S``
    (``proctree``'s). A process that left the tree before the stop (a daemon's double fork,
    reparented to init) is not seen."""
    fd = _LIVE.get(proc)
    below = proctree.below(proc.pid, fd) if fd is not None and proctree.send(fd, 0) else {}
    try:
        _stop_child(proc)
    finally:
        try:
            proctree.end_below(below)
        finally:
            for fd in below.values():
                os.close(fd)


def _stop_child(proc: subprocess.Popen[str]) -> None:
    """``_stop``'s part for the child itself and what its parent links still reach."""
    try:
        _signal_tree(proc, proctree.stop_signal())
        # the child's last lines may fill the pipe no one reads now: drain it while waiting
        deadline = time.monotonic() + proctree.STOP_GRACE_S
        while proc.poll() is None and time.monotonic() < deadline:
            if not _drain(proc.stdout):
                time.sleep(0.05)  # the end of its output: only its exit is left to wait for
    except BaseException:
        _signal_tree(proc, signal.SIGKILL, whole=True)
        proc.wait()
        raise
    if proc.poll() is None:
        _signal_tree(proc, signal.SIGKILL, whole=True)
    proc.wait()


def _drain(out: IO[str] | None) -> bool:
    """Read and drop what ``out`` holds now (for 0.1 s at most); False at its end, or where it
    is closed, also by the reader thread as ``_stop`` reads it."""
    try:
        if out is None or out.closed:
            return False
        return not select.select([out], [], [], 0.1)[0] or bool(os.read(out.fileno(), 65536))
    except (OSError, ValueError):
        return False


# What a child that outlived its ``timeout`` exits with, where it ended 0 once stopped (or a
# process below it kept its output open): timeout(1)'s status, so no caller reads it as done.
TIMED_OUT = 124


LINE_BYTES = 1 << 16  # the most a run with a timeout reads of a line at once
MAX_TIMED_OUTPUT = 16 << 20  # the most output a run with a timeout keeps (characters)


def _reader(out: IO[str], take: Callable[[str], None]) -> threading.Thread:
    """A thread giving ``out``'s lines to ``take``, started."""
    def read() -> None:
        with suppress(OSError, ValueError):
            # at most LINE_BYTES at a time: a line without end was read whole first
            for line in iter(lambda: out.readline(LINE_BYTES), ""):
                take(line)
        # closed here, not left to the garbage collector: a reader the run left blocked (a
        # process below the child kept the output) ended later, and its stream, unclosed,
        # raised a ResourceWarning in whatever ran then (CI's real-Slurm test, 60 s after)
        with suppress(OSError, ValueError):
            out.close()

    reader = threading.Thread(target=read, name="kvprefetch-output", daemon=True)
    reader.start()
    return reader


def _within(proc: subprocess.Popen[str], timeout: float, reader: threading.Thread) -> bool:
    """Wait for ``proc`` and its output (``reader``) for ``timeout`` seconds of wall time; past
    that, stop it as a Ctrl-C stops it (``_stop``) and return False. The timeout was
    ``proc.wait``'s, which began only once the child had closed its output: an ``scontrol``
    that never answered held ``slurm status`` for ever, and so would any probe whose child hangs
    with its output open (issue 41, the twenty-first and twenty-second passes left it open).
    The output is read in a thread of its own so that the wait can end; a process below the
    child that keeps the output open after the stop leaves that thread blocked, a daemon, and
    the command goes on."""
    deadline = time.monotonic() + timeout
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout)
    reader.join(max(0.0, deadline - time.monotonic()))
    if proc.returncode is not None and not reader.is_alive():
        return True
    _stop(proc)
    reader.join(1.0)
    return False


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    log: str | os.PathLike[str] | None = None,
    echo: bool = True,
    check: bool = True,
    capture: bool = True,
    timeout: float | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    fix: str | None = None,
    max_output: int | None = None,
) -> Completed:
    """Run ``argv`` (never through a shell). Output goes to ``log`` (appended) and, when
    ``capture``, is returned. ``on_progress`` receives ninja's ``[n/N]`` counters. Past
    ``max_output`` characters (``MAX_TIMED_OUTPUT`` for a run with a ``timeout``: a question to
    Slurm, a probe) the child is stopped, as a timeout stops it: an ``scontrol`` printing
    without end filled memory for its whole minute, and under a memory limit ``slurm status``
    ended in a MemoryError traceback (issue 41, the twenty-fifth pass)."""
    if isinstance(cwd, _Neutral):  # an empty folder of its own (NEUTRAL_CWD says why)
        with PRIVATE_DIR[0]("cwd") as empty:
            return run(argv, env=env, cwd=str(empty), log=log, echo=echo, check=check,
                       capture=capture, timeout=timeout, on_progress=on_progress, fix=fix,
                       max_output=max_output)
    if max_output is None and timeout is not None:
        max_output = MAX_TIMED_OUTPUT
    args = [str(a) for a in argv]
    child_env = dict(env) if env is not None else dict(os.environ)
    check_child_tmpdir(child_env)
    if "PATH" in child_env:  # nor for the child's own look-ups, in its folder (which says why)
        child_env["PATH"] = absolute_path(child_env["PATH"])
    # a relative program path is the caller's (``--torch-from venv/bin/python``), not one
    # under ``cwd``
    resolved = os.path.abspath(args[0]) if os.sep in args[0] else which(args[0], child_env)
    if resolved is None:
        raise ConfigError(
            f"'{args[0]}' was not found on the PATH of the command's environment",
            fix or f"install {args[0]} or put it on PATH",
        )
    args[0] = resolved
    if echo:
        # escaped: a path with ESC in it (a work directory's) reached the terminal raw (issue
        # 41, the thirteenth hostile pass); the log below keeps the command as it ran
        print(f"+ {escaped(quote(args))}", file=sys.stderr, flush=True)
    log_path = Path(log) if log is not None else None
    logf = open_log(log_path) if log_path is not None else None
    tail: deque[str] = deque(maxlen=25)
    chunks: list[str] = []
    reader: threading.Thread | None = None
    try:
        if logf:
            logf.write(f"+ {quote(args)}\n")
            logf.flush()
        if _STOPPING.is_set() and threading.current_thread() is not threading.main_thread():
            raise ConfigError(f"{args[0]} was not started: the command is stopping (it was "
                              "interrupted)", "rerun the command; finished work is kept")
        try:
            proc = _popen(
                args, env=child_env, cwd=cwd, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                errors="replace", bufsize=1,
            )
        except OSError as exc:
            _raise_deferred()  # a stop while it failed to start: the stop is what happened
            not_forked(exc, args[0])  # `ulimit -u`: the program is fine
            cwd_gone = cwd is not None and not os.path.isdir(cwd)
            if exc.filename not in (args[0], None) or cwd_gone or exc.errno == errno.ENOENT:
                raise  # a missing program or working directory: the caller's OSError
            # the program itself cannot be run (`--torch-from /dev/null`, a folder, a file
            # without x): the generic EACCES fix said "make /dev writable" (issue 41, the
            # fourth hostile pass)
            raise ConfigError(f"cannot run {args[0]}: {exc.strerror or exc} (it is not an "
                              "executable program)",
                              f"pass the path of an executable in place of {args[0]}"
                              ) from None
        try:
            # listed, then the stop looked for: a stop that ran while the child was starting
            # (Popen forks and waits for the exec, with the lock free) did not list it, and
            # the child ran to its end (a worker's: the build waited for its whole compile)
            # or outlived the kit (the main thread's: the interrupt raised before it was
            # listed; issue 41, the eleventh hostile pass)
            _LIVE[proc] = proctree.pidfd_of(proc.pid)
            _raise_deferred()
            if _STOPPING.is_set() and threading.current_thread() is not threading.main_thread():
                raise ConfigError(f"{args[0]} was stopped as it started: the command is "
                                  "stopping (it was interrupted)",
                                  "rerun the command; finished work is kept")
            assert proc.stdout is not None

            kept = [0]

            def take(line: str) -> None:
                if max_output is not None and kept[0] > max_output:
                    return  # stopped below, its note kept
                kept[0] += len(line)
                if max_output is not None and kept[0] > max_output:
                    line = f"\n(stopped by the kit: it printed more than {max_output} characters)\n"
                    _signal_tree(proc, signal.SIGKILL, whole=True)  # and all below it
                if logf:
                    logf.write(line)
                if capture:
                    chunks.append(line)
                tail.append(line.rstrip("\n"))
                if on_progress is not None:
                    m = _NINJA_PROGRESS.match(line)
                    if m:
                        on_progress(int(m.group(1)), int(m.group(2)))

            if timeout is None:
                for line in proc.stdout:
                    take(line)
                returncode = proc.wait()
            else:
                reader = _reader(proc.stdout, take)
                if _within(proc, timeout, reader):
                    returncode = proc.returncode
                else:
                    returncode = proc.returncode or TIMED_OUT
                    take(f"(stopped by the kit: it had not finished after {timeout:g} s)\n")
        except BaseException:
            _stop(proc)
            raise
        finally:
            with _LIVE_LOCK:
                fd = _LIVE.pop(proc, None)
                if fd is not None:
                    os.close(fd)
            if proc.stdout is not None and (reader is None or not reader.is_alive()):
                proc.stdout.close()  # a reader still blocked on it holds its lock: left open
    finally:
        if logf:
            logf.close()
    if check and returncode != 0:
        raise CommandError(args, returncode, str(log_path) if log_path else None,
                           "\n".join(tail), fix)
    return Completed(args, returncode, "".join(chunks), log_path)
