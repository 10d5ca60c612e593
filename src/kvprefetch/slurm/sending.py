"""What ``submit`` and ``resubmit`` check and hold around each sending (``cluster.py`` sends):
the campaign's folders and job scripts as sbatch will read them, and the campaign's lock."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ..errors import SlurmError
from .campaign import Job

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


# What the jobs write in the campaign, Slurm's own logs (#SBATCH --output) included: Slurm opens
# those through a link, so a link planted at one of these folders would have the jobs write
# outside the campaign (issue 41, the fifth hostile pass: `submit` sent every job with logs/ a
# link elsewhere). The kit's own writes refuse links anyway; this refuses before any sbatch.
_JOB_FOLDERS = ("scripts", "logs", "results", "report", "cache", "work", "scratch")


def check_job_folders(root: Path) -> None:
    """Refuse (SlurmError) a campaign whose folder the jobs write in is a symlink."""
    for name in _JOB_FOLDERS:
        if (root / name).is_symlink():
            raise SlurmError(f"{root / name} is a symlink: the jobs (and Slurm's own logs) "
                             "would write through it, outside the campaign",
                             f"move {root / name} away (`kvprefetch slurm plan {root}` makes "
                             "the folders again), then submit")


# sbatch reads a whole script before it sends it, and no job script the plan writes is near
# this size (a few KiB)
MAX_SCRIPT_BYTES = 1 << 20


def check_job_scripts(root: Path, jobs: Sequence[Job]) -> None:
    """Refuse (SlurmError), before any sbatch, a job script of ``jobs`` that is not a regular
    file of at most MAX_SCRIPT_BYTES (``lstat``: a FIFO, a device or a link to one, a folder,
    a socket): sbatch opens and reads it, and waits on a FIFO for ever or reads a device
    without end. A FIFO at scripts/20-verify.sbatch had submit send prepare and both builds,
    then stop at verify's sbatch (a real one waits there for a writer), and its fix sent the
    user to a login node (issue 41, the twenty-second hostile pass)."""
    import stat

    from ..workspace.confine import kind_of

    for job in jobs:
        path = root / job.script
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            what = "missing"
        except OSError as exc:
            what = f"unreadable ({exc.strerror})"
        else:
            if stat.S_ISREG(st.st_mode):
                if st.st_size <= MAX_SCRIPT_BYTES:
                    continue
                what = f"{st.st_size} bytes, more than any script kvprefetch writes"
            elif stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode):
                kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "a folder"
                what = f"{kind}, not a regular file"
            else:
                what = f"{kind_of(st.st_mode)}, not a regular file"
        raise SlurmError(f"the job script {path} is {what}: it is not the script `kvprefetch "
                         "slurm plan` wrote, and sbatch would read it (waiting on a FIFO for "
                         "ever, a device without end); nothing was sent",
                         f"move {path} away and run `kvprefetch slurm plan {root}` again with "
                         "the options the campaign was planned with (it writes a missing "
                         "script again), or plan a new campaign into a new folder")
