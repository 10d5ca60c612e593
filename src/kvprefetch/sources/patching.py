"""``apply`` and ``export-header``: the patch as data (``diff-upstream`` is ``upstream_diff``).

The patch is our own headers (``csrc/kvprefetch/``, copied into the tree) plus the unified
diffs in ``patches/v0.10.2/<variant>/``. ``apply`` only ever moves a tree from pristine to
"exactly this patch"; anything else is refused with the tree left byte-identical."""

from __future__ import annotations

import os
import re
import stat
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .. import upstream
from ..errors import ConfigError, PatchError
from ..hashing import differences, sha256_bytes, sha256_file, tree_inventory, walk
from ..kernels import rules as kernel_rules
from ..oserrors import mapped
from ..runner import run
from ..workspace import mounts, ownership, treetxn
from ..workspace.confine import kept_mode, write_file
from ..workspace.locks import locked
from ..workspace.workdir import Workdir


@dataclass(frozen=True)
class ApplyResult:
    tree: str
    path: Path
    variant: str
    action: str  # applied | already-applied | would-apply
    patch_sha256: str
    files: list[str]


def patch_sha256(variant: str) -> str:
    """One hash over the helper header and the variant's diffs: the patch's identity."""
    parts = [src.read_bytes() for src, _ in upstream.kit_headers()]
    parts += [p.read_bytes() for p in upstream.patch_files(variant)]
    return sha256_bytes(b"\0".join(parts))


def _git_apply(tree: Path, patches: list[Path], *args: str) -> bool:
    # GIT_CEILING_DIRECTORIES stops git from discovering an enclosing repository (the work
    # directory may live inside one), so paths in the patch stay relative to the tree.
    # The ceiling must be absolute (git ignores relative entries): with the default relative
    # work directory inside a checkout, git would otherwise find the checkout and silently skip
    # every path outside it, "applying" nothing.
    # No GIT_* variable of the caller's reaches git, and no config file but the repository's
    # (there is none): GIT_TRACE (GIT_TRACE2, ...) name files git appends its trace to, through
    # any link there, and a config's trace2.*Target does the same; GIT_TRACE=<campaign>/logs/
    # git.trace and a link put at that name had a build job's apply append git's trace to a
    # file outside (issue 41, the twenty-first hostile pass). Others (GIT_DIR, GIT_WORK_TREE,
    # GIT_INDEX_FILE, a config's apply.whitespace) would change what the kit's patch does.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CEILING_DIRECTORIES=str(tree.resolve().parent), GIT_CONFIG_NOSYSTEM="1",
               GIT_CONFIG_GLOBAL=os.devnull)
    res = run(["git", "apply", *args, *map(str, patches)], cwd=tree, env=env, echo=False,
              check=False)
    return res.returncode == 0


def _git_made_only(root: Path, rels: list[str], variant: str) -> None:
    """After ``git apply`` in the scratch folder ``root``: it holds the files ``rels`` (regular
    files, no symlink) and their folders, nothing else. The kit's patches are checked to only
    modify those files in place (``upstream.patch_files``); this is the second line, should
    git read a patch otherwise (issue 41, the ninth hostile pass: a section hidden from the
    first check made a symlink in the scratch copy; apply then wrote a kit header through it,
    outside the work directory, and installed a file from outside as the patched source)."""
    dirs = {parent.as_posix() for r in rels for parent in PurePosixPath(r).parents} - {"."}
    for dirpath, dirnames, filenames in walk(root):  # never into a symlinked folder
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            mode = path.lstat().st_mode
            if not ((rel in dirs and stat.S_ISDIR(mode))
                    or (rel in rels and stat.S_ISREG(mode))):
                kind = ("a symlink" if stat.S_ISLNK(mode) else "a folder" if stat.S_ISDIR(mode)
                        else "a file" if stat.S_ISREG(mode) else "a special file")
                raise PatchError(f"git apply of the kit's {variant} patch made {rel} ({kind}), "
                                 "which is not a file the patch modifies in place; nothing was "
                                 "installed",
                                 "restore the kit's patches from a kvprefetch checkout "
                                 "(`git checkout -- patches/`)")


def _scratch_copy(root: Path, src: Path, scratch: Path, dst: Path) -> None:
    """Copy the tree file ``src`` (inside ``root``) to ``dst`` (inside ``scratch``, a private
    folder: ``ownership.private_dir``), both through folders opened ``O_NOFOLLOW`` from there
    down (``confine.read_file``,
    ``write_file``), its permission bits kept: a scratch folder swapped for a link to a folder
    outside while apply copied into it had ``shutil.copy2`` write the tree's files, and the kit
    headers, behind the link (issue 41, the tenth hostile pass; a swap loop won 2 runs of 4)."""
    from ..workspace.confine import read_file

    data = read_file(root, src, limit=MAX_SOURCE_BYTES, family=PatchError)
    write_file(dst, data, root=scratch, family=PatchError, mode=kept_mode(src),
               exact=True)


def _variant_files(variant: str) -> list[Path]:
    if upstream.canonical_variant(variant) not in upstream.VARIANTS:
        raise ConfigError(f"unknown variant {variant!r}",
                          f"use one of: {', '.join(upstream.VARIANTS)}")
    files = upstream.patch_files(variant)
    if not files:
        raise PatchError(f"no patch files for variant {variant}",
                         "reinstall kvprefetch from a complete checkout")
    return files


def _pristine_files(tree: Path, paths: list[str]) -> bool:
    return all((tree / p).is_file() and
               sha256_file(tree / p) == upstream.PRISTINE_SHA256[p] for p in paths)


def carried_variant(tree: Path) -> str | None:
    """Which variant (if any) the tree's patched files carry exactly; None when all of them
    are pristine; "unknown" for anything else. The reversed patch is tried on copies in a
    private folder outside the work directory (``ownership.private_dir``): nothing is written
    there (diff-upstream and dry runs write nothing), and git's writes by path reach no folder
    anyone who writes the work directory can swap."""
    every = upstream.all_patched_paths()
    if _pristine_files(tree, every):
        return None
    for v in upstream.VARIANTS:
        own = upstream.patched_paths(v)
        others = [p for p in every if p not in own]
        if not _pristine_files(tree, others):
            continue
        # git apply writes by path: only in a folder no one who writes the work directory
        # can reach (ownership.private_dir), never in the work directory's tmp/
        with ownership.private_dir("carried") as td:
            copy = td / "t"
            for rel in own:
                if not (tree / rel).is_file():
                    break
                # trees/<name> -> its work directory
                _scratch_copy(tree.parent.parent, tree / rel, td, copy / rel)
            else:
                if not _git_apply(copy, _variant_files(v), "--reverse"):
                    continue
                _git_made_only(copy, own, v)
                if _pristine_files(copy, own):
                    return v
    return "unknown"


def _describe(tree: Path) -> str:
    return ", ".join(f"{p} (sha256 {sha256_file(tree / p)[:16]}…)"
                     for p in upstream.all_patched_paths()
                     if (tree / p).is_file()
                     and sha256_file(tree / p) != upstream.PRISTINE_SHA256[p])


def _refuse_differences(tree: Path, variant: str, applied: dict[str, Any] | None,
                        diffs: list[str]) -> PatchError:
    """Why a tree that differs from the kit's record is refused (nothing was changed)."""
    shown = ", ".join(diffs[:8]) + (f" and {len(diffs) - 8} more" if len(diffs) > 8 else "")
    fix = ("keep your changes elsewhere, then `kvprefetch fetch --force` (the tree is moved to "
           f"backup/, not deleted) and `kvprefetch apply --variant {variant}`")
    kit = {f"M {h}" for h in upstream.KIT_HEADERS_IN_TREE}
    if applied is not None and set(diffs) <= kit:
        edited = ", ".join(str(tree / d[2:]) for d in diffs)
        return PatchError(f"{edited} was edited by hand (it differs from what kvprefetch "
                          "installed); the tree was left untouched", fix)
    carried = carried_variant(tree)
    what = ("an unknown modification" if carried in (None, "unknown")
            else f"the {carried} variant with other changes")
    expected = ("pristine v0.10.2" if applied is None
                else f"v0.10.2 with exactly the {applied['variant']} patch")
    return PatchError(f"{tree} carries {what}, not {expected}: these files differ from what "
                      f"kvprefetch recorded: {shown}; apply only ever adds exactly the patch, "
                      "so the tree was left untouched", fix)


def apply_patch(workdir: Path, variant: str = "prefetch", tree_name: str | None = None,
                dry_run: bool = False) -> ApplyResult:
    """Move a tree from pristine to "exactly this patch". The tree must match the kit's record
    byte for byte (no edits, no added files: a file the patch adds is never overwritten); the
    patched files are made on copies, staged, and renamed into place with the new state, or
    not at all (treetxn)."""
    wd = Workdir(workdir)
    patches = _variant_files(variant)
    variant = upstream.canonical_variant(variant)
    name = wd.resolve_tree(tree_name or upstream.DEFAULT_TREE_FOR_VARIANT[variant])
    if name == "baseline":
        raise ConfigError("refusing to patch the 'baseline' tree: it is the stock reference",
                          "patch 'patched' (or 'paper'), e.g. kvprefetch apply --tree patched")
    tree = wd.tree(name)
    hint = (" --with-paper" if name == upstream.PAPER_TREE
            else "" if name in upstream.TREE_NAMES else f" --extra-tree {name}")
    # "or pass --tree patched" only where another tree was named: said to `apply --tree
    # patched` itself, it sent the user back to what they had typed (issue 41, the
    # twenty-second hostile pass)
    other = "" if name == "patched" else ", or pass --tree patched"
    missing = PatchError(f"there is no kvprefetch tree named {name!r} in {workdir}",
                         f"run `kvprefetch fetch{hint}` first{other}")
    if tree.is_symlink():
        raise PatchError(f"the {name!r} tree {tree} is a symlink -> {os.readlink(tree)}, and "
                         "kvprefetch never writes through one",
                         f"move {tree} away, then `kvprefetch fetch{hint}` makes the tree again")
    if not tree.is_dir():
        raise missing
    digest = patch_sha256(variant)
    own = upstream.patched_paths(variant)
    files = own + list(upstream.KIT_HEADERS_IN_TREE)
    # a dry run takes no lock: it writes nothing, not even the lock file (issue 41, class 6)
    lock: AbstractContextManager[None] = (
        nullcontext() if dry_run else locked(wd.tree_lock(name), f"the tree {name}"))
    with lock, mapped(PatchError, f"apply to {tree}"):
        if treetxn.stage_dir(wd, name).exists() and dry_run:
            raise PatchError(f"an apply to {name!r} was interrupted and awaits recovery",
                             "run `kvprefetch apply` without --dry-run (it recovers first)")
        if not dry_run:
            treetxn.recover(wd, name)
        state = wd.read_state(name)
        if state is None:  # the tree is there: "run fetch" met "local modifications" (pass 33)
            raise PatchError(f"the tree {tree} has no state record ({wd.state_file(name)})",
                             "record it again from the tree's content with `kvprefetch fetch "
                             "--repair`, then rerun")
        applied = state.get("applied")
        recorded: dict[str, str] = state["inventory"]
        diffs = differences(recorded, tree_inventory(tree, state))
        diffs += [f"A {rel} (a symlink or special file)" for rel in upstream.KIT_HEADERS_IN_TREE
                  if applied is None and os.path.lexists(tree / rel) and rel not in recorded
                  and not any(d.startswith(f"A {rel}") for d in diffs)]
        if diffs:
            raise _refuse_differences(tree, variant, applied, diffs)
        headers_only = False
        was = upstream.canonical_variant(applied["variant"]) if applied is not None else None
        if applied is not None:
            if was == variant and applied["patch_sha256"] == digest:
                return ApplyResult(name, tree, variant, "already-applied", digest, files)
            # The kit's own headers changed since (csrc/*.cuh), its diffs did not: the tree's
            # patched files still reverse-apply to pristine. Install the new headers.
            headers_only = was == variant and carried_variant(tree) == variant
        if applied is not None and not headers_only:
            what = (f"the {was} variant" if was != variant
                    else f"another version of the {variant} patch (sha256 "
                         f"{applied['patch_sha256'][:16]}…)")
            # `fetch --force` replaces only an edited tree: to a patch the kit recorded it says
            # "unchanged", so it never restored this one (issue 41, the thirty-third pass)
            own_tree = (f" (or give the {variant} variant a tree of its own: `kvprefetch fetch "
                        f"--extra-tree {variant}`, then `kvprefetch apply --variant {variant} "
                        f"--tree {variant}`)" if name != variant else "")
            raise PatchError(f"{tree} carries {what}, not pristine v0.10.2, in: "
                             f"{_describe(tree) or 'the kit headers'}; the tree was left untouched",
                             "make the tree again from pristine: `kvprefetch clean --what trees`, "
                             f"then `kvprefetch fetch{hint}` and `kvprefetch apply --variant "
                             f"{variant} --tree {name}`{own_tree}")
        if dry_run:
            return ApplyResult(name, tree, variant, "would-apply", digest, files)
        # git apply writes its results by path, in its working folder: a private folder
        # outside the work directory, which nothing that writes the work directory can swap
        # for a link (ownership.private_dir); the results reach the tree through treetxn
        with ownership.private_dir("apply") as td:
            work = td / "t"
            for rel in [] if headers_only else own:
                _scratch_copy(wd.root, tree / rel, td, work / rel)
            if not headers_only and (not _git_apply(work, patches, "--check")
                                     or not _git_apply(work, patches)):
                raise PatchError(f"the {variant} patch does not apply to {tree}",
                                 "restore the tree with `kvprefetch fetch --force`")
            _git_made_only(work, [] if headers_only else own, variant)
            if not headers_only and not _git_apply(work, patches, "--reverse", "--check"):
                raise PatchError(f"git apply of the {variant} patch reported success but the "
                                 "result does not carry the patch",
                                 "report this; the tree was left untouched")
            for src, rel in upstream.kit_headers():
                write_file(work / rel, src.read_bytes(), root=td, family=PatchError)
            changes = {rel: work / rel for rel in
                       (upstream.KIT_HEADERS_IN_TREE if headers_only else files)}
            new_inventory = dict(recorded)
            new_inventory.update({rel: sha256_file(p) for rel, p in changes.items()})
            new_state = dict(state)
            new_state["applied"] = {
                "variant": variant, "patch_sha256": digest,
                "headers": {rel: new_inventory[rel] for rel in upstream.KIT_HEADERS_IN_TREE},
                "files": {rel: new_inventory[rel] for rel in own}}
            new_state["inventory"] = new_inventory

            def verify() -> None:
                now = differences(new_inventory, tree_inventory(tree, new_state))
                if now:
                    raise PatchError(f"{tree} changed while apply ran ({', '.join(now[:4])}); "
                                     "the apply was rolled back", "rerun `kvprefetch apply`")

            treetxn.commit(wd, name, changes, new_state, verify)
        ownership.record(wd.root, tree, "tree", digest=ownership.inventory_digest(new_inventory))
    return ApplyResult(name, tree, variant, "applied", digest, files)


# A patched source of v0.10.2 is at most a few hundred KiB; a tree file is the user's data.
MAX_SOURCE_BYTES = 16 << 20


def pristine_text(wd: Workdir, rel: str = upstream.ATTENTION_HEADER) -> str:
    """A pristine upstream file, from the kept pristine source or the baseline tree, verified.
    Each candidate is read once, bounded and never blocking (``reading.read_limited``), and the
    bytes read are the bytes hashed: hashed by path and then read again by path, a file swapped
    for a FIFO between the two hung diff-upstream, export-header and apply for good, and one
    swapped for other text was taken as pristine (issue 41, the eighteenth hostile pass). A
    candidate that is not such a file (a FIFO, a folder, too large, other bytes) is skipped."""
    from ..reading import read_limited

    denied: list[Path] = []  # there but not readable by this user: `fetch` cannot fix that
    for cand in (wd.pristine / "sdist", wd.pristine / "git", wd.tree("baseline")):
        p = cand / rel
        try:
            data = read_limited(p, MAX_SOURCE_BYTES)
        except PermissionError:
            denied.append(p)
            continue
        except (OSError, ValueError):  # absent, or no regular file of that size
            continue
        if sha256_bytes(data) == upstream.PRISTINE_SHA256[rel]:
            return data.decode("utf-8")
    if denied:  # another user's work directory (issue 41, the thirty-fifth hostile pass)
        raise PatchError(f"the pristine v0.10.2 {rel} under {wd.root} cannot be read by this "
                         f"user ({denied[0]}: permission denied)",
                         f"run as the user who owns {wd.root}, or make its files readable "
                         f"for you (`chmod -R u+rX,go+rX {wd.root}` by that user)")
    raise PatchError(f"no pristine v0.10.2 {rel} under {wd.root}", "run `kvprefetch fetch` first")


def drop_in_caveat(variant: str) -> str | None:
    """What a drop-in header alone does not do for ``variant`` (None: it is complete)."""
    if variant == "prefetch":
        return ("the header alone compiles the v2 prologue, but only the launchers' hooks fill "
                "its address table, fire the v1 L2 prefetch, read KVPREFETCH and launch the "
                "GQA-grouped twins (csrc/kvprefetch/gqa_twins.cuh): without "
                "patches/v0.10.2/prefetch/paged_attention_v{1,2}.cu.patch nothing is prefetched "
                "and no twin runs (use `kvprefetch apply` for the whole variant)")
    if variant == "launch":
        return ("the launch variant changes only the launchers; its header is stock. Apply "
                "patches/v0.10.2/launch/*.patch (or `kvprefetch apply --variant launch`)")
    if variant == "control":
        return ("the control variant is stock (its diffs add one comment to each launcher); "
                "its header is stock. Use `kvprefetch apply --variant control` for the A/A tree")
    return None


_KIT_INCLUDE = re.compile(r'^\s*#include "(?:kvprefetch/)?([A-Za-z0-9_]+\.(?:cuh|inc))"')


def inline_kit_headers(text: str, _seen: set[str] | None = None) -> list[str]:
    """``text``'s lines with every ``#include`` of one of the kit's headers replaced by that
    header's own lines, recursively, each header once (they are ``#pragma once``) except
    rules.inc, an X-macro table meant to be included again."""
    seen = set() if _seen is None else _seen
    out: list[str] = []
    for line in text.splitlines(keepends=True):
        m = _KIT_INCLUDE.match(line)
        name = m.group(1) if m else None
        if name is None or name not in upstream.KIT_HEADERS:
            out.append(line)
            continue
        if name in seen:
            continue
        if name != kernel_rules.RULES_FILE:
            seen.add(name)
        body = (upstream.kit_header_dir() / name).read_text().replace("#pragma once\n", "")
        out.append(f"// ---- begin kvprefetch csrc/kvprefetch/{name} (inlined) ----\n")
        out.extend(inline_kit_headers(body, seen))
        out.append(f"// ---- end kvprefetch csrc/kvprefetch/{name} ----\n")
    return out


def _refuse_output_inside(output: Path, root: Path) -> None:
    """export-header writes only -o, never into the work directory it reads: an -o there
    replaced, with exit 0, whatever file was at that name, the kit's ownership record, a state
    record, the work directory's tag, a tree's or the pristine copy's header alike, and left a
    work directory that fetch, apply and clean refuse (issue 41, the nineteenth hostile pass).
    By path and by device and inode: an -o through a bind mount of the work directory elsewhere
    resolves to another path, and got past the path comparison alone."""
    where = Path(os.path.realpath(output))
    home = Path(os.path.realpath(root))
    if mounts.within(where, home):
        raise PatchError(f"refusing to write {output}: it is inside the work directory {root}, "
                         "whose files are kvprefetch's records, trees and pristine copy",
                         "write the header outside the work directory (e.g. -o "
                         "csrc/attention_kernels.cuh, or into your own vLLM checkout)")


def export_header(workdir: Path, output: Path, variant: str = "prefetch") -> Path:
    """Write a single-file drop-in ``attention_kernels.cuh`` (the form the paper's reproduction
    ships): pristine upstream, the variant's header diff applied, and our headers inlined in
    place of its #include.
    A single header cannot carry the launchers' hooks (see ``drop_in_caveat``)."""
    wd = Workdir(workdir)
    _refuse_output_inside(output, wd.root)
    variant = upstream.canonical_variant(variant)
    upstream.kit_headers()  # each a regular file of the kit, checked before one is inlined
    header_patches = [p for p in _variant_files(variant)
                      if p.name == Path(upstream.ATTENTION_HEADER).name + ".patch"]
    pristine = pristine_text(wd)
    # export-header reads the work directory and writes only -o: its scratch is a system temp
    # folder, as diff-upstream --check's (a --workdir that is no work directory got an ownership
    # record and its lock; issue 41, the fourth hostile pass)
    with ownership.scratch_dir(wd.root, "export-header", read_only=True) as td:
        t = td / "t"
        write_file(t / upstream.ATTENTION_HEADER, pristine, family=PatchError)
        # launch and control change only the launchers: their header is stock (no patch to
        # apply; `git apply` of no file reads its standard input, /dev/null, and failed)
        if header_patches and not _git_apply(t, header_patches):
            raise PatchError(f"the {variant} patch does not apply to pristine v0.10.2",
                             "reinstall kvprefetch from a clean checkout")
        _git_made_only(t, [upstream.ATTENTION_HEADER], variant)
        text = (t / upstream.ATTENTION_HEADER).read_text()
    out_lines = inline_kit_headers(text)
    # -o anywhere: never through a symlinked file or folder (confine.write_file)
    write_file(output, "".join(out_lines), family=PatchError, mode=kept_mode(output),
               exact=True)
    return output
