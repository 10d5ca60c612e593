"""Deadlines for reading from a server (an index, a mirror, a proxy): each wait on a socket has
its own timeout, but a server that sends a byte now and then never meets it, and one read of
http.client's may take many waits (a chunked answer's size line, its trailer). So a page has a
deadline in all (``within``), and a download's socket is shut down at its own (``stop_at``)."""

from __future__ import annotations

import os
import socket
import stat
import threading
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from ..errors import FetchError


def within(seconds: float, fn: Callable[[], Any], url: str) -> Any:
    """``fn()``, run in a thread of its own and given up after ``seconds``: a server that
    sends too slowly to meet any socket timeout is a FetchError then (the thread, blocked on
    its socket, ends with the process)."""
    box: dict[str, Any] = {}
    lock = threading.Lock()

    def work() -> None:
        try:
            value = fn()
        except BaseException as exc:  # noqa: BLE001 -- handed to the caller as it is
            box["error"] = exc
            return
        with lock:
            box["value"] = value
            late = "late" in box
        if late and hasattr(value, "close"):  # an answer given up on: its socket closed
            value.close()

    t = threading.Thread(target=work, name="kvprefetch-url", daemon=True)
    t.start()
    t.join(seconds)
    with lock:
        if "value" not in box and "error" not in box:
            box["late"] = True
    if "late" in box:
        raise FetchError(f"{url} did not answer within {seconds:g} s (the server sends too "
                         "slowly, or never ends its answer)",
                         "check the network (and https_proxy/http_proxy, if set) or point "
                         "PIP_INDEX_URL at a reachable mirror")
    if "error" in box:
        raise box["error"]
    return box["value"]


def stop_at(src: Any, seconds: float) -> tuple[threading.Event, Callable[[], None]]:
    """A timer that shuts down the socket under ``src`` (a copy of its descriptor: that acts on
    the connection, and wakes a read waiting on it) after ``seconds``, the event it sets then,
    and what cancels it; nothing for a source that is no socket (a file:// URL's file)."""
    fired = threading.Event()
    try:
        fd = os.dup(src.fileno())
    except (AttributeError, OSError, ValueError):
        return fired, lambda: None
    if not stat.S_ISSOCK(os.fstat(fd).st_mode):
        os.close(fd)
        return fired, lambda: None
    sock = socket.socket(fileno=fd)

    def stop() -> None:
        fired.set()
        with suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    timer = threading.Timer(seconds, stop)
    timer.daemon = True
    timer.start()

    def cancel() -> None:
        timer.cancel()
        sock.close()
    return fired, cancel
