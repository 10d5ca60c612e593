"""``fetch --repair``: rebuild each tree's state record from content, never from belief.

The record says what the tree *should* hold: the verified pristine source, plus exactly a
variant's patch where the tree's patched files carry exactly that variant (git apply --reverse
gives back pristine) and the kit's headers. Whatever else the tree holds stays reported as a
local modification: repairing a record never absorbs an edit."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .. import upstream
from ..errors import FetchError
from ..hashing import INVENTORY_RULES, differences, inventory, sha256_file
from ..workspace import ownership
from ..workspace.workdir import Workdir


def repair_states(wd: Workdir, names: list[str], pristine: Path, kind: str, origin: str,
                  commit: str | None) -> list[str]:
    from .patching import carried_variant, patch_sha256

    base = inventory(pristine)
    heads = {rel: sha256_file(src) for src, rel in upstream.kit_headers()}
    notes = []
    adopted = wd.is_adopted()
    for name in names:
        tree = wd.tree(name)
        sp = wd.state_file(name)
        if adopted:
            _refuse_a_users_tree(wd, tree)
        if os.path.lexists(sp) and (sp.is_symlink() or not sp.is_file()):
            raise FetchError(f"the state path {sp} is not a regular file (a directory or a "
                             "symlink); kvprefetch does not remove what it did not make",
                             f"move {sp} away, then rerun `kvprefetch fetch --repair`")
        current = inventory(tree)
        carried = carried_variant(tree)
        expected = dict(base)
        applied: dict[str, Any] | None = None
        if carried in upstream.VARIANTS and name != "baseline":
            own = upstream.patched_paths(carried)
            _refuse_a_moving_tree(tree, current, own)
            files = {rel: current[rel] for rel in own}
            expected.update(files)
            expected.update(heads)
            applied = {"variant": carried, "patch_sha256": patch_sha256(carried),
                       "headers": dict(heads), "files": files}
        state = {"tree": name, "source": kind, "origin": origin, "commit": commit,
                 "vllm_version": upstream.VLLM_VERSION, "applied": applied,
                 "inventory": expected, "inventory_rules": INVENTORY_RULES}
        ownership.write_record(wd.root, sp, state)
        ownership.record(wd.root, sp, "state")
        ownership.record(wd.root, tree, "tree", digest=ownership.inventory_digest(expected))
        left = differences(expected, current)
        what = "pristine v0.10.2" if applied is None else f"the {carried} patch"
        note = f"rebuilt {sp} from the content of {tree} ({what})"
        if left:
            note += (f"; the tree also differs from that in: {', '.join(left[:6])}"
                     + (" …" if len(left) > 6 else ""))
        notes.append(note)
    return notes


def _refuse_a_users_tree(wd: Workdir, tree: Path) -> None:
    """In a work directory adopted with the user's files, a folder of ``trees/`` that the
    ownership record does not list is the user's: repairing it overwrote their
    ``state/<name>.json`` and recorded their folder as the kit's tree, which ``clean
    --discard-edits`` then removed with all it held (issue 41, the twenty-first hostile pass;
    the error about their state file had said to run ``fetch --repair``)."""
    if (ownership.owned(wd.root, tree) or {}).get("kind") == "tree":
        return
    raise FetchError(
        f"{tree} is not a tree kvprefetch made here (the ownership record does not list it, "
        f"and kvprefetch adopted {wd.root} with your files in it), so --repair leaves it and "
        f"its state file {wd.state_file(tree.name)} alone",
        f"move {tree} (and {wd.state_file(tree.name)}, if it is yours) out of the work "
        "directory, then rerun `kvprefetch fetch` to make the tree afresh")


def _refuse_a_moving_tree(tree: Path, current: dict[str, str], own: list[str]) -> None:
    """The tree's inventory and ``carried_variant`` are two reads of it: a folder swapped for a
    link between them (the inventory records the link and nothing below it, the variant check
    read the files through the real folder) left a patched file out of the inventory, and the
    record's lookup was a KeyError traceback (issue 41, the twentieth hostile pass: a swap loop
    of trees/patched/csrc/attention, 1 run of 2)."""
    gone = [rel for rel in own if rel not in current]
    if gone:
        raise FetchError(f"{tree} changed while `fetch --repair` read it: {', '.join(gone)} was "
                         "there for the variant check and not in the tree's inventory (a folder "
                         "on the way replaced, or the file removed, meanwhile)",
                         "stop whatever else writes the tree, make its folders real "
                         "directories again, then rerun `kvprefetch fetch --repair`")
