"""``python -m kvprefetch.slurm.prepare WORKDIR TREE...``: the prepare job's last step. It records
every tree's build folder in the work directory's ownership record before the build jobs start,
so that the build jobs (running at once, possibly on different nodes) never write that one shared
file: no lock has to hold across nodes (flock over NFS does not, everywhere)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..workspace import ownership
from ..workspace.workdir import Workdir


def record_builds(workdir: Path, trees: list[str]) -> list[str]:
    wd = Workdir(workdir.resolve())
    done = []
    for t in trees:
        path = wd.build_root(t)
        if ownership.owned(wd.root, path) is None:
            ownership.record(wd.root, path, "build")
            done.append(t)
    return done


if __name__ == "__main__":  # pragma: no cover -- run by the prepare job's script
    recorded = record_builds(Path(sys.argv[1]), sys.argv[2:])
    print("recorded build folders of: " + (", ".join(recorded) or "none (already recorded)"))
