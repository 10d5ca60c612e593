"""The prepare job (``kvprefetch slurm prepare CAMPAIGN``), before any build starts:

- the read-only source cache: the hash-pinned sdist downloaded once into ``<campaign>/cache/``
  (``--source auto``/``sdist``) and made read-only, or the ``--source`` path checked (an sdist
  by its sha256, never modified; a clone by its existence). Every build job then fetches from
  it into its own scratch;
- ``<campaign>/work`` made a kit work directory, and every tree's build folder recorded in its
  ownership record, so that the build jobs (running at once, possibly on different nodes) never
  write that one shared file: no lock has to hold across nodes (flock over NFS does not,
  everywhere). They publish only into their own tree's paths (publish.py)."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import FetchError
from ..workspace import ownership
from ..workspace.workdir import Workdir
from .campaign import Campaign


@dataclass(frozen=True)
class Prepared:
    source: str            # what the build jobs fetch from
    downloaded: bool       # the prepare job downloaded it (else it was there, and checked)
    recorded: tuple[str, ...]


def source_cache(c: Campaign) -> tuple[str, bool]:
    """The campaign's source, present, checked and read-only; whether it was downloaded now."""
    from .. import upstream
    from ..hashing import sha256_file
    from ..sources.download import ensure_sdist

    if c.source in ("auto", "sdist"):
        target = c.cache / upstream.SDIST_NAME
        had = target.is_file()
        path = ensure_sdist(c.cache)  # sha256-checked; written under a temp name, then renamed
        mode = path.stat().st_mode
        path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        return str(path), not had
    src = Path(c.source)
    if src.is_file():
        actual = sha256_file(src)
        if actual != upstream.SDIST_SHA256:
            raise FetchError(f"--source {src} has sha256 {actual}, not the vLLM "
                             f"{upstream.VLLM_VERSION} sdist's {upstream.SDIST_SHA256}",
                             "plan the campaign again with the right file, or --source sdist")
    elif not src.is_dir():
        raise FetchError(f"--source {src} is not there (as the jobs see the filesystem)",
                         "put the sdist or clone on a filesystem every node mounts, at the "
                         "same path, and plan again")
    return str(src), False


def record_builds(workdir: Path, trees: list[str]) -> list[str]:
    wd = Workdir(workdir.resolve())
    wd.ensure()
    done = []
    for t in trees:
        path = wd.build_root(t)
        if ownership.owned(wd.root, path) is None:
            ownership.record(wd.root, path, "build")
            done.append(t)
    return done


def prepare(c: Campaign) -> Prepared:
    source, downloaded = source_cache(c)
    os.makedirs(c.logs, exist_ok=True)
    return Prepared(source, downloaded, tuple(record_builds(c.workdir, list(c.tree_names))))
