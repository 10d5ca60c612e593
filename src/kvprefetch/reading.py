"""Reading a file the kit did not write (a record, a manifest, a result, a README): a regular
file only, and only up to a size, so a FIFO, a device (a symlink to /dev/zero) or a huge file
is one ValueError, never a hang or a full memory. In the base layer: every layer reads such
files (kernels' build manifests as much as workspace's records)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

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
