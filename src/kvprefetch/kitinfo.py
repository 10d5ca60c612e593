"""What identifies the running kit: its version, where its sources are, and the git commit they
were checked out at. Recorded in bench results and campaign plans so that results from several
machines can be merged only when they come from the same kit."""

from __future__ import annotations

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
    if which("git") is not None:
        head = run(["git", "-C", str(root), "rev-parse", "HEAD"], echo=False, check=False)
        if head.returncode == 0 and head.output.strip():
            commit = head.output.strip()
            st = run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                     echo=False, check=False)
            dirty = bool(st.output.strip()) if st.returncode == 0 else None
    return KitInfo(__version__, str(root), commit, dirty)
