"""``clean``: removes only directories that kvprefetch created and tagged. The work directory
must carry ``.kvprefetch-workdir``; environments must carry their kvprefetch marker; nothing
outside the work directory is touched."""

from __future__ import annotations

import shutil
from contextlib import ExitStack
from pathlib import Path

from .errors import ConfigError
from .locks import locked
from .workdir import TAG_FILE, Workdir


def clean(workdir: Path, what: str = "builds", *, dry_run: bool = False) -> list[str]:
    wd = Workdir(workdir)
    if not (wd.root / TAG_FILE).is_file():
        raise ConfigError(f"{workdir} is not a kvprefetch work directory (no {TAG_FILE})",
                          "pass the --workdir that kvprefetch created; clean never removes "
                          "directories it did not create")
    targets: list[Path] = []
    if what in ("builds", "all"):
        targets += [p for p in (wd.root / "build").glob("*") if p.is_dir()]
    if what in ("envs", "all"):
        targets += [p for p in (wd.root / "envs").glob("*")
                    if p.is_dir() and (p / ".kvprefetch-env.json").is_file()]
    if what in ("trees", "all"):
        targets += [wd.tree(n) for n in wd.existing_trees() if wd.read_state(n) is not None]
        targets += [p for p in (wd.root / "state").glob("*.json")]
        targets += [p for p in (wd.root / "pristine", wd.root / "backup") if p.exists()]
    removed = []
    with ExitStack() as stack:
        stack.enter_context(locked(wd.lock, f"the work directory {workdir}"))
        # A build holds build/<tree>/.lock while it compiles, an env creation its env lock:
        # take them too, so nothing is pulled from under a running build (LockError if held).
        for t in targets:
            if t.parent == wd.root / "build":
                stack.enter_context(locked(t / ".lock", f"the {t.name} build"))
            elif t.parent == wd.root / "envs":
                stack.enter_context(locked(t.parent / f".{t.name}.lock", f"environment {t}"))
        for t in targets:
            removed.append(str(t))
            if dry_run:
                continue
            if t.is_dir():
                shutil.rmtree(t)
            else:
                t.unlink()
    return removed
