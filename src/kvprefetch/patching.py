"""``apply``, ``diff-upstream`` and ``export-header``: the patch as data.

The patch is our own ``csrc/prefetch_ptx.cuh`` (copied next to the header) plus the unified
diffs in ``patches/v0.10.2/<variant>/``. ``apply`` only ever moves a tree from pristine to
"exactly this patch"; anything else is refused with the tree left byte-identical."""

from __future__ import annotations

import difflib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import upstream
from .errors import ConfigError, PatchError
from .hashing import inventory, sha256_bytes, sha256_file
from .locks import locked
from .runner import run
from .workdir import Workdir


@dataclass(frozen=True)
class ApplyResult:
    tree: str
    path: Path
    variant: str
    action: str  # applied | already-applied | would-apply
    patch_sha256: str
    files: list[str]


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
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tree.resolve().parent))
    res = run(["git", "apply", *args, *map(str, patches)], cwd=tree, env=env, echo=False,
              check=False)
    return res.returncode == 0


def _variant_files(variant: str) -> list[Path]:
    if variant not in upstream.VARIANTS:
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
    are pristine; "unknown" for anything else."""
    every = upstream.all_patched_paths()
    if _pristine_files(tree, every):
        return None
    for v in upstream.VARIANTS:
        own = upstream.patched_paths(v)
        others = [p for p in every if p not in own]
        if not _pristine_files(tree, others):
            continue
        with tempfile.TemporaryDirectory() as td:
            copy = Path(td) / "t"
            for rel in own:
                if not (tree / rel).is_file():
                    break
                (copy / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(tree / rel, copy / rel)
            else:
                if _git_apply(copy, _variant_files(v), "--reverse") and _pristine_files(copy, own):
                    return v
    return "unknown"


def _describe(tree: Path) -> str:
    return ", ".join(f"{p} (sha256 {sha256_file(tree / p)[:16]}…)"
                     for p in upstream.all_patched_paths()
                     if (tree / p).is_file() and sha256_file(tree / p) != upstream.PRISTINE_SHA256[p])


def apply_patch(workdir: Path, variant: str = "prefetch", tree_name: str | None = None,
                dry_run: bool = False) -> ApplyResult:
    wd = Workdir(workdir)
    name = tree_name or upstream.DEFAULT_TREE_FOR_VARIANT[variant]
    if name == "baseline":
        raise ConfigError("refusing to patch the 'baseline' tree: it is the stock reference",
                          "patch 'patched' (or 'seed'), e.g. kvprefetch apply --tree patched")
    patches = _variant_files(variant)
    tree = wd.tree(name)
    state = wd.read_state(name)
    if not tree.is_dir() or state is None:
        hint = (" --with-seed" if name == upstream.SEED_TREE
                else "" if name in upstream.TREE_NAMES else f" --extra-tree {name}")
        raise PatchError(f"there is no kvprefetch tree named {name!r} in {workdir}",
                         f"run `kvprefetch fetch{hint}` first, or pass --tree patched")
    digest = patch_sha256(variant)
    headers = [(src, tree / rel) for src, rel in upstream.kit_headers()]
    files = upstream.patched_paths(variant) + list(upstream.KIT_HEADERS_IN_TREE)
    with locked(wd.tree(name).with_suffix(".lock"), f"the tree {name}"):
        carried = carried_variant(tree)
        header_ok = all(dst.is_file() and sha256_file(dst) == sha256_file(src)
                        for src, dst in headers)
        if carried == variant and header_ok:
            return ApplyResult(name, tree, variant, "already-applied", digest, files)
        if carried is not None and carried != variant:
            what = "an unknown modification" if carried == "unknown" else f"the {carried} variant"
            raise PatchError(
                f"{tree} carries {what}, not pristine v0.10.2, in: {_describe(tree)}; the tree "
                "was left untouched",
                f"restore it with `kvprefetch fetch --force`, then `kvprefetch apply --variant {variant}`")
        applied = state.get("applied") or {}
        recorded = applied.get("headers") or {  # a record from before there were two headers
            upstream.PREFETCH_HEADER_IN_TREE: applied.get("header_sha256")}
        for _, dst in headers:
            rel = dst.relative_to(tree).as_posix()
            if carried == variant and dst.is_file() and sha256_file(dst) != recorded.get(rel):
                raise PatchError(f"{dst} was edited by hand (it differs from what kvprefetch "
                                 "installed); the tree was left untouched",
                                 "restore it with `kvprefetch fetch --force`, then apply again")
        if dry_run:
            return ApplyResult(name, tree, variant, "would-apply", digest, files)
        if carried is None:
            if not _git_apply(tree, patches, "--check"):
                raise PatchError(f"the {variant} patch does not apply to {tree}",
                                 "restore the tree with `kvprefetch fetch --force`")
            _git_apply(tree, patches)
            now = carried_variant(tree)
            if now != variant:
                raise PatchError(f"git apply reported success but {tree} does not carry the "
                                 f"{variant} patch afterwards (found: {now or 'pristine'})",
                                 "report this; meanwhile restore the tree with "
                                 "`kvprefetch fetch --force`")
        for src, dst in headers:
            tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)
        state["applied"] = {"variant": variant, "patch_sha256": digest,
                            "headers": {dst.relative_to(tree).as_posix(): sha256_file(dst)
                                        for _, dst in headers},
                            "files": {p: sha256_file(tree / p)
                                      for p in upstream.patched_paths(variant)}}
        state["inventory"] = inventory(tree)
        wd.write_state(name, state)
    return ApplyResult(name, tree, variant, "applied", digest, files)


def _file_diff(rel: str, old: str | None, new: str) -> FileDiff:
    a = old.splitlines(keepends=True) if old is not None else []
    b = new.splitlines(keepends=True)
    lines = list(difflib.unified_diff(a, b, fromfile="/dev/null" if old is None else f"a/{rel}",
                                      tofile=f"b/{rel}"))
    added = sum(1 for ln in lines if ln.startswith("+") and not ln.startswith("+++"))
    removed = sum(1 for ln in lines if ln.startswith("-") and not ln.startswith("---"))
    text = "".join(ln if ln.endswith("\n") else ln + "\n\\ No newline at end of file\n" for ln in lines)
    return FileDiff(rel, added, removed, text)


def pristine_text(wd: Workdir, rel: str = upstream.ATTENTION_HEADER) -> str:
    """A pristine upstream file, from the kept pristine source or the baseline tree, verified."""
    for cand in (wd.pristine / "sdist", wd.pristine / "git", wd.tree("baseline")):
        p = cand / rel
        if p.is_file() and sha256_file(p) == upstream.PRISTINE_SHA256[rel]:
            return p.read_text()
    raise PatchError(f"no pristine v0.10.2 {rel} under {wd.root}", "run `kvprefetch fetch` first")


def diff_upstream(workdir: Path, tree_name: str = "patched") -> DiffResult:
    wd = Workdir(workdir)
    tree = wd.tree(tree_name)
    if not (tree / upstream.ATTENTION_HEADER).is_file():
        raise PatchError(f"there is no tree {tree_name!r} in {workdir}", "run `kvprefetch fetch` first")
    state = wd.read_state(tree_name) or {}
    files = [_file_diff(rel, pristine_text(wd, rel), (tree / rel).read_text())
             for rel in upstream.all_patched_paths() if (tree / rel).is_file()]
    for rel in upstream.KIT_HEADERS_IN_TREE:
        if (tree / rel).is_file():
            files.append(_file_diff(rel, None, (tree / rel).read_text()))
    variant = (state.get("applied") or {}).get("variant")
    return DiffResult(tree_name, variant, [f for f in files if f.diff])


def drop_in_caveat(variant: str) -> str | None:
    """What a drop-in header alone does not do for ``variant`` (None: it is complete)."""
    if variant == "prefetch":
        return ("the header alone compiles the v2 prologue, but only the launchers' hooks fill "
                "its address table, fire the v1 L2 prefetch, read KVPREFETCH and launch the "
                "GQA-grouped twin (csrc/gqa_grouped.cuh): without "
                "patches/v0.10.2/prefetch/paged_attention_v{1,2}.cu.patch nothing is prefetched "
                "and no twin runs (use `kvprefetch apply` for the whole variant)")
    if variant == "launch":
        return ("the launch variant changes only the launchers; its header is stock. Apply "
                "patches/v0.10.2/launch/*.patch (or `kvprefetch apply --variant launch`)")
    if variant == "control":
        return ("the control variant is stock (its diffs add one comment to each launcher); "
                "its header is stock. Use `kvprefetch apply --variant control` for the A/A tree")
    return None


def export_header(workdir: Path, output: Path, variant: str = "prefetch") -> Path:
    """Write the seed-style single-file drop-in ``attention_kernels.cuh``: pristine upstream,
    the variant's header diff applied, and our helper inlined in place of its #include.
    A single header cannot carry the launchers' hooks (see ``drop_in_caveat``)."""
    wd = Workdir(workdir)
    header_patches = [p for p in _variant_files(variant)
                      if p.name == Path(upstream.ATTENTION_HEADER).name + ".patch"]
    with tempfile.TemporaryDirectory() as td:
        t = Path(td) / "t"
        (t / upstream.ATTENTION_HEADER).parent.mkdir(parents=True)
        (t / upstream.ATTENTION_HEADER).write_text(pristine_text(wd))
        if not _git_apply(t, header_patches):
            raise PatchError(f"the {variant} patch does not apply to pristine v0.10.2",
                             "reinstall kvprefetch from a clean checkout")
        text = (t / upstream.ATTENTION_HEADER).read_text()
    helper = upstream.prefetch_header().read_text().replace("#pragma once\n", "")
    marker = '#include "prefetch_ptx.cuh"'
    out_lines = []
    for line in text.splitlines(keepends=True):
        if line.startswith(marker):
            out_lines.append(f"// ---- begin kvprefetch csrc/prefetch_ptx.cuh (inlined) ----\n"
                             f"{helper}// ---- end kvprefetch csrc/prefetch_ptx.cuh ----\n")
        else:
            out_lines.append(line)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    tmp.write_text("".join(out_lines))
    os.replace(tmp, output)
    return output
