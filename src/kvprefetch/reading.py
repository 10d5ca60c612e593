"""Reading a file the kit did not write (a record, a manifest, a result, a README): a regular
file only, and only up to a size, so a FIFO, a device (a symlink to /dev/zero) or a huge file
is one ValueError, never a hang or a full memory; ``load_json`` adds that JSON nested too deep
for Python's parser is the same ValueError, never a RecursionError traceback (issue 41, the
fourth hostile pass). In the base layer: every layer reads such files (kernels' build
manifests as much as workspace's records).

Every JSON file the kit reads back goes through ``parse_json``: bounded in size (by the read),
and in depth. The kit writes JSON a few levels deep (a result, 6 at most); a record nested
deeper reached code that walks it by calling itself once per level (``json.dumps`` as it is
written back, a path rewrite, a report), where a RecursionError was a traceback: publish's
build.json 700 levels deep, report's index (issue 41, the fourth, twenty-first and twenty-second
hostile passes). One limit here, in place of a check per reader."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

MAX_RECORD_BYTES = 64 << 20
_PIECE = 1 << 20  # read_limited's reads


def read_limited(path: Path, limit: int = MAX_RECORD_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; a FIFO, device, socket,
    directory or a larger file is a ValueError (opened with O_NONBLOCK, so a FIFO never
    blocks the reader)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path} is not a regular file (a FIFO, device, socket or folder)")
        if st.st_size > limit:
            raise ValueError(f"{path} is larger than {limit} bytes")
        # in pieces: ``read(limit + 1)`` sets aside ``limit`` bytes (64 MiB) for a record of a
        # few hundred, and under ``ulimit -v`` of about 90 MB every command that read one ended
        # in a MemoryError traceback (issue 41, the twenty-eighth hostile pass)
        with os.fdopen(fd, "rb", closefd=False) as f:
            pieces: list[bytes] = []
            left = limit + 1
            while left > 0:
                piece = f.read(min(left, _PIECE))
                if piece is None:  # a kernel file that waits for data (/proc/kmsg): not JSON
                    raise ValueError(f"{path} has nothing to read without waiting (a kernel or "
                                     "device file, not a file of records)")
                if not piece:
                    break
                pieces.append(piece)
                left -= len(piece)
            data = b"".join(pieces)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"{path} is larger than {limit} bytes")
    return data


# The deepest JSON the kit reads back: ten times what it writes.
MAX_JSON_DEPTH = 64


def parse_json(data: bytes | str, what: object) -> Any:
    """The JSON value ``data`` holds (UTF-8), nested at most ``MAX_JSON_DEPTH`` lists and
    objects; anything else is a ValueError naming ``what`` (bad bytes, bad JSON, too deep)."""
    try:
        value = json.loads(data.decode("utf-8") if isinstance(data, bytes) else data)
    except RecursionError:
        raise ValueError(f"{what} holds JSON nested too deep to read") from None
    if deeper_than(value, MAX_JSON_DEPTH):
        raise ValueError(f"{what} holds JSON nested more than {MAX_JSON_DEPTH} levels deep; "
                         "kvprefetch writes a few")
    return value


def deeper_than(value: Any, limit: int) -> bool:
    """Whether the JSON value nests more than ``limit`` lists and objects (its own stack, no
    recursion)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth >= limit:
                return True
            stack.extend((v, depth + 1) for v in
                         (item.values() if isinstance(item, dict) else item))
    return False


def load_json(path: Path, limit: int = MAX_RECORD_BYTES) -> Any:
    """The JSON value in ``path``, read as ``read_limited`` reads (a regular file of at most
    ``limit`` bytes) and parsed by ``parse_json``. Anything that is not such a file holding
    UTF-8 JSON is a ValueError: a FIFO, a device, a larger file, bad bytes, bad JSON, and JSON
    nested too deep. Missing or unreadable files are the OSError ``os.open`` raises."""
    return parse_json(read_limited(path, limit), path)
