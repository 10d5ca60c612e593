"""What identifies the running kit: its version, where its sources are, and the git commit they
were checked out at. Recorded in bench results and campaign plans so that results from several
machines can be merged only when they come from the same kit."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from . import __version__


@dataclass(frozen=True)
class KitInfo:
    version: str
    root: str            # the folder that holds the ``kvprefetch`` package (put on PYTHONPATH)
    commit: str | None   # None when the sources are not a git checkout (an installed wheel)
    dirty: bool | None   # uncommitted changes to tracked files; None when unknown

    def to_dict(self) -> dict[str, object]:
        return {"version": self.version, "root": self.root, "commit": self.commit,
                "dirty": self.dirty}


@lru_cache(maxsize=1)
def kit_info() -> KitInfo:
    from .runner import run, which

    root = Path(__file__).resolve().parent.parent
    commit = dirty = None
    # A read only: `git status` refreshes the checkout's index (.git/index) as it reads it,
    # taking index.lock, so `slurm plan`, `bench kernel` and every bench task of a campaign
    # rewrote a file of the kit's checkout, outside any work directory or campaign, and a
    # user's `git commit` there at that moment failed on the lock (issue 41, the twenty-fourth
    # hostile pass). GIT_OPTIONAL_LOCKS=0 has git skip that write (git(1)).
    # The commit is the kit's checkout's alone: a user's GIT_DIR or GIT_WORK_TREE named another
    # repository's, and so did a kit installed in a venv inside the user's own project (git
    # found the project around site-packages; issue 41, the twenty-eighth pass left it open).
    # So the names that place a repository are left out, and the top folder git finds must be
    # the one holding the kit's sources (src/ -> its parent).
    from .gitenv import REPO_ENV

    env = {k: v for k, v in os.environ.items() if k not in REPO_ENV}
    env["GIT_OPTIONAL_LOCKS"] = "0"
    if which("git", env) is not None:
        head = run(["git", "-C", str(root), "rev-parse", "--show-toplevel", "HEAD"], env=env,
                   echo=False, check=False)
        lines = head.output.split("\n") if head.returncode == 0 else []
        if len(lines) >= 2 and lines[1].strip() and _same(lines[0], root.parent):
            commit = lines[1].strip()
            st = run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                     env=env, echo=False, check=False)
            dirty = bool(st.output.strip()) if st.returncode == 0 else None
    return KitInfo(__version__, str(root), commit, dirty)


def _same(top: str, folder: Path) -> bool:
    try:
        return os.path.samefile(top, folder)
    except OSError:
        return False
