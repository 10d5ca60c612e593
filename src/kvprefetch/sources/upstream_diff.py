"""``diff-upstream``: what a tree changes against vLLM 0.10.2's pristine sources, file by
file, as unified diffs (split from ``patching``, which applies and exports the patch)."""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path

from .. import upstream
from ..errors import PatchError
from ..workspace.workdir import Workdir
from .patching import MAX_SOURCE_BYTES, pristine_text


@dataclass(frozen=True)
class FileDiff:
    path: str
    added: int
    removed: int
    diff: str


@dataclass(frozen=True)
class DiffResult:
    tree: str
    variant: str | None
    files: list[FileDiff]

    @property
    def additive(self) -> bool:
        return all(f.removed == 0 for f in self.files)


def _file_diff(rel: str, old: str | None, new: str) -> FileDiff:
    a = old.splitlines(keepends=True) if old is not None else []
    b = new.splitlines(keepends=True)
    lines = list(difflib.unified_diff(a, b, fromfile="/dev/null" if old is None else f"a/{rel}",
                                      tofile=f"b/{rel}"))
    added = sum(1 for ln in lines if ln.startswith("+") and not ln.startswith("+++"))
    removed = sum(1 for ln in lines if ln.startswith("-") and not ln.startswith("---"))
    text = "".join(ln if ln.endswith("\n") else ln + "\n\\ No newline at end of file\n"
                   for ln in lines)
    return FileDiff(rel, added, removed, text)


def _tree_text(tree: Path, rel: str) -> str:
    """A tree's copy of a patched file as text, read as ``reading.read_limited`` reads: a FIFO,
    a device, a huge or a binary file there is one PatchError, never a hang, a MemoryError or a
    UnicodeDecodeError traceback (issue 41, the fifth hostile pass)."""
    from ..reading import read_limited

    path = tree / rel
    fix = (f"this is not the file kvprefetch put there: move {path} away, or run `kvprefetch "
           "fetch --force` (the tree is moved to backup/ and made again)")
    try:
        return read_limited(path, MAX_SOURCE_BYTES).decode("utf-8")
    except UnicodeDecodeError:
        raise PatchError(f"cannot diff {path}: it is not UTF-8 text", fix) from None
    except ValueError as exc:
        raise PatchError(f"cannot diff {rel} of tree {tree.name}: {exc}", fix) from None
    except OSError as exc:
        raise PatchError(f"cannot diff {path}: {exc.strerror or exc}", fix) from None


def diff_upstream(workdir: Path, tree_name: str = "patched") -> DiffResult:
    wd = Workdir(workdir)
    tree_name = wd.resolve_tree(tree_name)
    tree = wd.tree(tree_name)
    if not os.path.lexists(tree / upstream.ATTENTION_HEADER):
        if tree_name in wd.existing_trees():
            # the tree is there without its header (deleted, or a folder on its way a symlink
            # to a folder without it): it was called an unknown tree, or "nothing was fetched
            # there yet", with a `fetch` that refuses the edited tree (issue 41, the
            # forty-third hostile pass)
            raise PatchError(f"the tree {tree} has no {upstream.ATTENTION_HEADER} (deleted, or "
                             "a folder on its way replaced): it differs from what kvprefetch "
                             "recorded",
                             "keep what you need from the tree, then `kvprefetch fetch "
                             "--force` (the tree is moved to backup/ and made again)")
        have = [t for t in wd.existing_trees()
                if (wd.tree(t) / upstream.ATTENTION_HEADER).is_file()]
        if not have:
            raise PatchError(f"there is no tree {tree_name!r} in {workdir}: nothing was fetched "
                             "there yet", "run `kvprefetch fetch` first")
        raise PatchError(f"unknown tree {tree_name!r}: the trees in {workdir} are "
                         f"{', '.join(have)}",
                         f"pass one of them to --tree (or make a tree of that name with "
                         f"`kvprefetch fetch --extra-tree {tree_name}`)")
    state = wd.read_state(tree_name) or {}
    files = [_file_diff(rel, pristine_text(wd, rel), _tree_text(tree, rel))
             for rel in upstream.all_patched_paths() if os.path.lexists(tree / rel)]
    for rel in upstream.KIT_HEADERS_IN_TREE:
        if os.path.lexists(tree / rel):
            files.append(_file_diff(rel, None, _tree_text(tree, rel)))
    variant = (state.get("applied") or {}).get("variant")
    return DiffResult(tree_name, upstream.canonical_variant(variant) if variant else None,
                      [f for f in files if f.diff])
