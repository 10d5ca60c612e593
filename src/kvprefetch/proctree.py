"""The processes below a child the kit started, held by pidfd so that a stop reaches them and
never a stranger: found through ``/proc``'s parent links (``below``, ``grow``), waited for
(``ended``), asked to stop (``end_below``) and killed whole (``kill_all``). ``runner`` owns the
live children and when to stop them; this module owns how a tree of processes is stopped."""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Sequence
from contextlib import suppress

STOP_GRACE_S = 10.0  # for a stopped process to clean up and end before the SIGKILL

def pidfd_of(pid: int) -> int | None:
    """A pidfd for ``pid`` (Linux 5.3+), or None where the kernel (or a filter) has none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def send(fd: int, signum: int) -> bool:
    """``signum`` to the process ``fd`` names; False when it has been reaped (or cannot be
    signalled). The process, never whoever has its number now."""
    try:
        signal.pidfd_send_signal(fd, signum)
    except OSError:
        return False
    return True


def parents() -> dict[int, int]:
    """pid -> parent pid of every process ``/proc`` shows."""
    out: dict[int, int] = {}
    with suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                ppid = parent_of(int(entry.name))
                if ppid is not None:
                    out[int(entry.name)] = ppid
    return out


def parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """When ``pid`` started (``/proc``'s clock ticks since boot): with the number, it names one
    process, never a later one given the same number; None when it has ended."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def children(pid: int) -> set[tuple[int, int]]:
    """The live children of ``pid``, each as (pid, ``start_time``)."""
    out = set()
    for p, ppid in parents().items():
        if ppid == pid and (t := start_time(p)) is not None:
            out.add((p, t))
    return out


def every() -> set[tuple[int, int]]:
    """Every live process, each as (pid, ``start_time``): those that exist before a library
    call starts its own children, none of which can be among them."""
    out = set()
    for p in parents():
        if (t := start_time(p)) is not None:
            out.add((p, t))
    return out


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (``/proc``'s parent links), children first."""
    children: dict[int, list[int]] = {}
    for p, ppid in parents().items():
        children.setdefault(ppid, []).append(p)
    out: list[int] = []
    todo = list(children.get(pid, ()))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def below(pid: int, pidfd: int) -> dict[int, int]:
    """Every process below the live process ``pid`` (``pidfd``), each with a pidfd of its own
    that the caller closes (``grow``)."""
    tree = {pid: pidfd}
    grow(tree)
    del tree[pid]
    return tree


def grow(tree: dict[int, int]) -> bool:
    """Add to ``tree`` (pid -> pidfd, the caller's to close) every process now below one of its
    live processes; True when one was added. One is taken only once its parent link is read
    again after its pidfd is open, while that parent is still alive (a number reused in between
    names another process, which is left out)."""
    children: dict[int, list[int]] = {}
    for p, ppid in parents().items():
        children.setdefault(ppid, []).append(p)
    todo = [(c, p) for p, fd in tree.items() if send(fd, 0) for c in children.get(p, ())]
    added = False
    while todo:
        child, parent = todo.pop(0)
        old = tree.get(child)
        if (old is not None and send(old, 0)) or (fd := pidfd_of(child)) is None:
            continue
        # the pidfd holds *a* process; it is this tree's when its parent is still the one
        # found (alive now, so it had that number when the link was read)
        if parent_of(child) != parent or not send(tree[parent], 0):
            os.close(fd)
            continue
        if old is not None:
            os.close(old)  # an ended one's number, now its parent's new child
        tree[child] = fd
        added = True
        todo.extend((c, child) for c in children.get(child, ()))
    return added


def kill_all(tree: dict[int, int]) -> None:
    """SIGKILL to every process of ``tree`` (pid -> pidfd) and every one below them, each held
    first with SIGSTOP until no new one is found: one that forks in a loop had the children it
    made after the processes below were read left running, reparented to init (issue 41, the
    thirty-first hostile pass). New pidfds are added to ``tree``, the caller's to close."""
    while True:
        for fd in tree.values():
            send(fd, signal.SIGSTOP)
        time.sleep(0.01)  # for the stops to land: a fork under way finishes first
        if not grow(tree):
            break
    for fd in tree.values():
        send(fd, signal.SIGKILL)


def ended(fds: Sequence[int], until: float) -> list[int]:
    """Wait until each process of ``fds`` (pidfds) has ended, or the monotonic time
    ``until``; the pidfds of those still running."""
    left = list(fds)
    while left:
        poller = select.poll()
        for fd in left:
            poller.register(fd, select.POLLIN)
        wait_ms = max(0, int((until - time.monotonic()) * 1000))
        ended = {fd for fd, _ in poller.poll(wait_ms)}
        left = [fd for fd in left if fd not in ended]
        if not ended:
            break  # the time is up
    return left


def stop_signal() -> int:
    """The signal that asks a child to stop: SIGINT, what a terminal's Ctrl-C sends; SIGTERM
    where the kit itself inherited SIGINT ignored (a ``&`` job of a script: its children
    inherit that too, and ignored the stop's SIGINT until the SIGKILL 10 s later, which let
    none of them clean up; issue 41, the tenth hostile pass). ninja forwards either to its
    commands."""
    try:
        ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    except ValueError:
        ignored = False
    return signal.SIGTERM if ignored else signal.SIGINT


BELOW_GRACE_S = 3.0  # for a process below to end on its own parent's stop (ninja forwards it)


def end_below(below: dict[int, int]) -> None:
    """The processes of ``below`` (pid -> pidfd), below a child that has ended, and those they
    started since (added to ``below``): ``BELOW_GRACE_S`` to end, then the stop signal and
    ``STOP_GRACE_S``, then SIGKILL (at once on an interrupt meanwhile)."""
    try:
        left = ended(list(below.values()), time.monotonic() + BELOW_GRACE_S)
        if left:
            grow(below)
            left = [fd for fd in below.values() if send(fd, 0)]
        for fd in left:
            send(fd, stop_signal())
        left = ended(left, time.monotonic() + STOP_GRACE_S)
    except BaseException:
        kill_all(below)
        raise
    if left:
        kill_all(below)


def stop_tree(tree: dict[int, int]) -> None:
    """Stop every process of ``tree`` (pid -> pidfd, the caller's to close) as a Ctrl-C stops
    it, and wait until each has ended: the stop signal and ``STOP_GRACE_S``, then SIGKILL (at
    once on an interrupt meanwhile), and the kill waited for too, so none writes after this
    returns."""
    try:
        for fd in tree.values():
            send(fd, stop_signal())
        left = ended(list(tree.values()), time.monotonic() + STOP_GRACE_S)
    except BaseException:
        kill_all(tree)
        ended(list(tree.values()), time.monotonic() + 1.0)
        raise
    if left:
        kill_all(tree)
        ended(list(tree.values()), time.monotonic() + 1.0)
