"""``clean``: removes only what kvprefetch created, as its ownership record lists it
(ownership.py), and never through a symlink. A tree whose content changed since the kit wrote
it, and ``backup/`` (where ``fetch --force`` keeps edited trees), are kept unless
``discard_edits``; everything kept is listed with the reason. Environments are recognised by the
marker the kit writes into them. A dry run takes no lock and writes nothing."""

from __future__ import annotations

import os
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, KvprefetchError
from ..hashing import differences, inventory, legacy_view, tree_inventory
from ..oserrors import mapped
from . import ownership, treetxn
from .locks import locked
from .workdir import TAG_FILE, Workdir

_KINDS = {"builds": ("build",), "envs": (), "trees": ("tree", "state", "pristine", "backup")}
_KINDS["all"] = _KINDS["builds"] + _KINDS["trees"]
_DIRS = {"builds": ("build",), "envs": ("envs",),
         "trees": ("trees", "state", "pristine", "backup")}
_DIRS["all"] = _DIRS["builds"] + _DIRS["envs"] + _DIRS["trees"]


@dataclass(frozen=True)
class Kept:
    path: str
    reason: str


@dataclass
class CleanResult:
    removed: list[str] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    dry_run: bool = False


def _tree_edits(wd: Workdir, name: str, entry: dict[str, Any]) -> list[str]:
    """What changed in a kit-made tree since the kit last wrote it ([] = nothing)."""
    now = inventory(wd.tree(name))
    try:
        state = wd.read_state(name)
    except KvprefetchError:
        state = None
    seen = tree_inventory(wd.tree(name), state) if state is not None else now
    if state is not None and not differences(state["inventory"], seen):
        return []
    # the record's digest, made by the current inventory rules or (an older record) the first
    if entry.get("digest") in (ownership.inventory_digest(now),
                               ownership.inventory_digest(legacy_view(now))):
        return []
    return differences(state["inventory"], seen) if state else ["its content (no readable state)"]


def clean(workdir: Path, what: str = "builds", *, dry_run: bool = False,
          discard_edits: bool = False) -> CleanResult:
    wd = Workdir(workdir)
    root = wd.root
    if not (root / TAG_FILE).is_file():
        raise ConfigError(f"{workdir} is not a kvprefetch work directory (no {TAG_FILE})",
                          "pass the --workdir that kvprefetch created; clean never removes "
                          "directories it did not create")
    res = CleanResult(dry_run=dry_run)
    # on a full disk clean cannot free anything: each folder's removal is recorded first (a
    # clean killed part-way leaves an orphan, never a half tree), which takes a few kilobytes
    with ExitStack() as stack, mapped(
            ConfigError, f"clean in {workdir}", where=root,
            full_note="clean records each removal before it makes it, in a few kilobytes, "
                      "so it needs that much free to free the rest"):
        if not dry_run:
            stack.enter_context(locked(wd.lock, f"the work directory {workdir}"))
        res.removed += ownership.remove_orphans(root, dry_run=dry_run)
        owned = ownership.entries(root)
        targets: list[Path] = []
        trees_going: set[str] = set()
        for rel, entry in sorted(owned.items()):
            path = root / rel
            kind = entry.get("kind")
            if kind not in _KINDS[what] or not os.path.lexists(path):
                continue
            link = ownership.symlink_on_the_way(root, path)
            if link is not None:
                res.kept.append(Kept(str(path), f"{link} is a symlink; clean never follows one"))
                continue
            if (kind == "state") != path.is_file():
                res.kept.append(Kept(str(path), "not what kvprefetch made there (a "
                                                f"{'directory' if path.is_dir() else 'file'})"))
                continue
            if kind == "backup" and not discard_edits:
                res.kept.append(Kept(str(path), "a tree `fetch --force` moved aside with your "
                                                "edits; --discard-edits removes it"))
                continue
            if kind == "tree":
                name = path.name
                if not dry_run:  # the tree's lock, shared with fetch, apply and build
                    stack.enter_context(locked(wd.tree_lock(name), f"the tree {name}"))
                    treetxn.recover(wd, name)
                edits = _tree_edits(wd, name, entry)
                if edits and not discard_edits:
                    res.kept.append(Kept(str(path), "edited since kvprefetch made it ("
                                         + ", ".join(edits[:4]) + ("…" if len(edits) > 4 else "")
                                         + "); --discard-edits removes it"))
                    continue
                trees_going.add(name)
            if kind == "build" and not dry_run:
                # a build holds build/<tree>/.lock while it compiles: never pull it from under one
                stack.enter_context(locked(path / ".lock", f"the {path.name} build",
                                           root=wd.root))
            targets.append(path)
        # a state record goes with its tree (a kept tree keeps its record)
        targets = [t for t in targets
                   if not (t.parent == root / "state" and t.stem not in trees_going
                           and (wd.root / "trees" / t.stem).is_dir())]
        adopted = wd.is_adopted()
        if what in ("envs", "all"):
            envs = root / "envs"
            if envs.is_dir() and not envs.is_symlink():
                for p in sorted(envs.iterdir()):
                    if p.is_dir() and not p.is_symlink() and _kit_env(root, p, owned, adopted):
                        if not dry_run:
                            stack.enter_context(locked(envs / f".{p.name}.lock",
                                                       f"environment {p}"))
                        targets.append(p)
        # a state record goes last: a clean killed between a tree and its record leaves a
        # record without its tree, which fetch simply makes again (a tree without its record
        # would be "not made by kvprefetch" and need --force)
        targets.sort(key=lambda t: t.parent == root / "state")
        listed = {str(t) for t in targets} | {k.path for k in res.kept}
        not_kits = _not_created_reason(root)
        for d in _DIRS[what]:
            top = root / d
            if top.is_symlink():
                res.kept.append(Kept(str(top), "a symlink; clean never follows one"))
                continue
            if not top.is_dir():
                continue
            for p in sorted(top.iterdir()):
                if str(p) in listed or p.name.endswith(".lock") \
                        or ownership.rel(root, p) in owned:
                    continue
                if d == "envs" and (p / ".kvprefetch-env.json").is_file():
                    if adopted:  # else a target above
                        res.kept.append(Kept(str(p), "not in the ownership record, and this "
                                                     "work directory was adopted with your "
                                                     "files in it (its .kvprefetch-env.json "
                                                     "alone does not make it the kit's)"))
                    continue
                res.kept.append(Kept(str(p), not_kits))
        for t in targets:
            res.removed.append(str(t))
            if dry_run:
                continue
            ownership.remove(root, t)
            if ownership.rel(root, t) in owned:
                ownership.forget(root, t)
    return res


def _not_created_reason(root: Path) -> str:
    """Why clean keeps a path no ownership record entry names. A work directory with no record
    at all (made before the kit kept one, or its record moved aside as a corrupt record's
    message says) kept everything with "not created by kvprefetch" and no word of the way back
    (issue 41, left open by the thirty-third hostile pass): `fetch --repair` records its trees
    again."""
    if os.path.lexists(root / ownership.OWNED_FILE):
        return "not created by kvprefetch"
    return (f"not in an ownership record: this work directory has no {ownership.OWNED_FILE} "
            "(made before kvprefetch kept one, or moved aside); `kvprefetch fetch --repair` "
            "with this --workdir records its trees again")


def _kit_env(root: Path, env: Path, owned: dict[str, dict[str, Any]], adopted: bool) -> bool:
    """Whether the folder ``env`` of ``envs/`` is an environment the kit made: one the
    ownership record lists, or, in a work directory the kit created empty (where only it and
    whoever writes the work directory put things), one that holds the kit's marker. In an
    adopted work directory a marker is no proof: a user's folder there with a file named
    ``.kvprefetch-env.json`` (an environment copied from another work directory, or anything)
    was removed by ``clean --what envs`` (issue 41, the twentieth hostile pass; the nineteenth
    left it open)."""
    if (owned.get(ownership.rel(root, env)) or {}).get("kind") == "env":
        return True
    return not adopted and (env / ".kvprefetch-env.json").is_file()
