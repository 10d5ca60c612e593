"""What ``submit`` and ``resubmit`` hold and make around each sending (``cluster.py`` sends):
the campaign's lock, and the new folder of each submission for Slurm's own job output."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import SlurmError
from .campaign import Campaign

# Slurm opens each job's --output itself, by path and through a link, as the job's user, when
# the job starts: a link planted at the next job id's name in logs/ (the ids are sequential) had
# Slurm truncate and write the file it points to (issue 41, the eleventh hostile pass, on a real
# Slurm: three files outside the campaign overwritten by prepare's and two builds' output). So
# each submit or resubmit sends its jobs' output into a folder of its own that it has just made
# (mkdir: nothing can be planted in it ahead, its name is not guessable, and only its owner may
# write in it), never into a name anyone could have prepared.
LOG_DIR_PREFIX = "sbatch-"
DRY_RUN_LOG_DIR = f"{LOG_DIR_PREFIX}<made by submit>"


def new_log_dir(c: Campaign) -> Path:
    """A new folder ``logs/sbatch-<UTC time>-<random>`` (mode 0755) for Slurm's output of the
    jobs one submit or resubmit sends; made relative to a descriptor of ``logs/`` opened
    without following a link (SlurmError for a link on the way)."""
    import os
    import secrets

    from ..workspace.confine import ensure_dir, open_dir

    root = Path(c.root)  # the folder named, resolved (load_record checked it is this one)
    ensure_dir(c.logs, root=root, family=SlurmError)
    fd = open_dir(c.logs, root=root, what="make Slurm's log folder in", family=SlurmError)
    try:
        for _ in range(20):
            name = f"{LOG_DIR_PREFIX}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-" \
                + secrets.token_hex(4)
            try:
                os.mkdir(name, 0o755, dir_fd=fd)
            except FileExistsError:  # anything at the name, a link included: another name
                continue
            return c.logs / name
    finally:
        os.close(fd)
    raise SlurmError(f"could not make a new folder for Slurm's logs in {c.logs}: every name "
                     "tried was taken", f"look at what fills {c.logs}, then submit again")


LOCK_FILE = ".kvprefetch-campaign.lock"


@contextmanager
def campaign_lock(root: Path) -> Iterator[None]:
    """Held by ``submit``, ``resubmit`` and ``plan`` (of a campaign already planned) while each
    reads campaign.json, sends and records: two submits at once each read "not submitted" and
    sent every job, twice, and the last to save its record lost the other's ids (issue 41, the
    eleventh hostile pass: 4 of 4 races on a real Slurm). A second one is refused (LockError),
    naming the first's pid. ``root`` is the campaign's resolved folder."""
    from ..workspace.locks import locked

    with locked(Path(root) / LOCK_FILE, f"the campaign {root} (submit, resubmit or plan)",
                place="campaign"):
        yield
