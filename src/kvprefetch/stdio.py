"""The command line's standard streams, made safe before any command runs (issue 41, the ninth
hostile pass).

- A closed stream (``kvprefetch … >&-``, ``2>&-``, ``<&-``): Python starts with ``sys.stdout``
  (``sys.stderr``, ``sys.stdin``) set to ``None``, and ``emit_json``, ``step`` and ``build``'s
  question stopped on an ``AttributeError`` traceback (``clean --json >&-``), or silently
  (``fetch 2>&-``, exit 1, nothing done). Each closed descriptor is now ``/dev/null``, opened
  in its place before anything else: no file the kit opens later can take the number 0, 1 or
  2 and receive what is meant for a standard stream.
- Text a stream cannot encode (``PYTHONIOENCODING=utf-8`` with a work directory whose name is
  not UTF-8, a latin-1 locale with a ``€`` in a path) was a ``UnicodeEncodeError`` traceback.
  Both streams now write such characters escaped (``\\u20ac``; a byte of a non-UTF-8 file name
  as itself, as Python's ``surrogateescape`` does), never failing.
- A stdout that cannot be written (``> /dev/full``, an I/O error): the command's message said
  "fetch failed: No space left on device … write to a larger one (the --workdir, -o/--out …
  folder): partial files of this run were removed", sending the user to the work directory;
  ``--help > /dev/full`` was a traceback. Such a failure is now ``StreamWriteError``, which
  the command line reports as what it is (its output could not be written), once.
- A stderr that cannot be written (``2> /dev/full``, a reader gone): progress and notices are
  dropped, never the command's own work (``fetch --dry-run 2>/dev/full`` stopped with exit 1
  at its first progress line).

A broken pipe on stdout stays click's (a quiet exit 1, the seventh pass)."""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import sys
from typing import IO

ERRORS = "kvprefetch-output"


class StreamWriteError(OSError):
    """Writing the command's standard output failed (not a path the command acts on)."""


def _escape(exc: UnicodeError) -> tuple[str | bytes, int]:
    """The encode error handler of both streams: a lone surrogate of ``surrogateescape`` (a
    byte of a file name that is not UTF-8) is written as that byte; any other character the
    encoding lacks as a backslash escape. Never raises for an encode error."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    bad = exc.object[exc.start:exc.end]
    if all(0xDC80 <= ord(c) <= 0xDCFF for c in bad):
        return bytes(ord(c) - 0xDC00 for c in bad), exc.end
    return codecs.backslashreplace_errors(exc)


codecs.register_error(ERRORS, _escape)


class _StdRaw(io.FileIO):
    """Descriptor 1 or 2 as a raw stream. stdout: a failed write is ``StreamWriteError``,
    raised once (later writes are dropped, so the interpreter's last flush says nothing more);
    a broken pipe stays ``BrokenPipeError`` (click's quiet exit). stderr: a failed write is
    dropped."""

    def __init__(self, fd: int, label: str, *, drop: bool) -> None:
        super().__init__(fd, "wb", closefd=False)
        self._label = label
        self._drop = drop
        self._failed = False

    def write(self, b: bytes) -> int:  # type: ignore[override]
        if self._failed:
            return len(b)
        try:
            n = super().write(b)
        except OSError as exc:
            if self._drop:
                self._failed = True
                return len(b)
            if isinstance(exc, BrokenPipeError):
                raise
            self._failed = True
            raise StreamWriteError(exc.errno, exc.strerror, f"<{self._label}>") from None
        return len(b) if n is None else n


def _text(fd: int, old: IO[str] | None, label: str, *, drop: bool) -> IO[str]:
    encoding = getattr(old, "encoding", None) or "utf-8"
    line_buffering = bool(getattr(old, "line_buffering", True))
    write_through = bool(getattr(old, "write_through", drop))
    raw = _StdRaw(fd, label, drop=drop)
    return io.TextIOWrapper(io.BufferedWriter(raw),  # type: ignore[type-var]
                            encoding=encoding, errors=ERRORS,
                            line_buffering=line_buffering, write_through=write_through)


def standard_streams() -> None:
    """Open ``/dev/null`` on every closed standard descriptor and give ``sys.stdin``,
    ``sys.stdout`` and ``sys.stderr`` streams that never raise ``UnicodeEncodeError`` (above).
    Called once by the command line before any command runs."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stdin is None:
        sys.stdin = open(0, encoding="utf-8", errors="surrogateescape",  # noqa: SIM115
                         closefd=False)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    sys.stdout = _text(1, sys.stdout, "stdout", drop=False)
    sys.stderr = _text(2, sys.stderr, "stderr", drop=True)
