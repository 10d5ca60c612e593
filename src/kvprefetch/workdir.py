"""The work directory's layout and the per-tree state records.

    <workdir>/
      .kvprefetch-workdir      tag: this directory was created by kvprefetch (clean needs it)
      downloads/               hash-checked sdist cache
      pristine/<source>/       the verified pristine source, copied into each tree
      trees/<name>/            baseline, patched (and seed): independent full copies
      state/<name>.json        how each tree was made, its file inventory, what was applied
      build/<name>/<key>/      content-addressed builds with manifest.json and logs/
      envs/<name>/             one isolated Python environment per tree
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TAG_FILE = ".kvprefetch-workdir"


@dataclass(frozen=True)
class Workdir:
    root: Path

    @property
    def downloads(self) -> Path:
        return self.root / "downloads"

    @property
    def pristine(self) -> Path:
        return self.root / "pristine"

    def tree(self, name: str) -> Path:
        return self.root / "trees" / name

    def state_file(self, name: str) -> Path:
        return self.root / "state" / f"{name}.json"

    def build_root(self, name: str) -> Path:
        return self.root / "build" / name

    def env(self, name: str) -> Path:
        return self.root / "envs" / name

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    def ensure(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tag = self.root / TAG_FILE
        if not tag.exists():
            tag.write_text("created by kvprefetch; `kvprefetch clean` may remove it\n")

    def read_state(self, name: str) -> dict[str, Any] | None:
        p = self.state_file(name)
        if not p.is_file():
            return None
        data: dict[str, Any] = json.loads(p.read_text())
        return data

    def write_state(self, name: str, state: dict[str, Any]) -> None:
        write_json_atomic(self.state_file(name), state)

    def existing_trees(self) -> list[str]:
        d = self.root / "trees"
        return sorted(p.name for p in d.iterdir() if p.is_dir() and not p.name.startswith(".")) \
            if d.is_dir() else []


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON via a temp file and rename, and only when the content changes."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    if path.is_file() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
