"""Reading a file the kit did not write (a record, a manifest, a result, a README): a regular
file only, and only up to a size, so a FIFO, a device (a symlink to /dev/zero) or a huge file
is one ValueError, never a hang or a full memory; ``load_json`` adds that JSON nested too deep
for Python's parser is the same ValueError, never a RecursionError traceback (issue 41, the
fourth hostile pass). In the base layer: every layer reads such files (kernels' build
manifests as much as workspace's records)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

MAX_RECORD_BYTES = 64 << 20


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
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"{path} is larger than {limit} bytes")
    return data


def load_json(path: Path, limit: int = MAX_RECORD_BYTES) -> Any:
    """The JSON value in ``path``, read as ``read_limited`` reads (a regular file of at most
    ``limit`` bytes). Anything that is not such a file holding UTF-8 JSON is a ValueError: a
    FIFO, a device, a larger file, bad bytes, bad JSON, and JSON nested too deep to parse.
    Missing or unreadable files are the OSError ``os.open`` raises."""
    data = read_limited(path, limit)
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ValueError(f"{path} holds JSON nested too deep to read") from None
