"""What we pin about upstream vLLM v0.10.2, and where the kit's own patch files live.

Every number here was read off the real release: the PyPI sdist's sha256, the commit that
the sdist's ``vllm/_version.py`` records (``g26b999c71``), and the sha256 of the pristine
``csrc/attention/attention_kernels.cuh``. Also the variants, the trees, and the kit's own headers
and patches. What the kit's code decides about vLLM's kernels (the launch policy) is
``kvprefetch.kernels.policy``."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

VLLM_VERSION = "0.10.2"
GIT_TAG = "v0.10.2"
DEFAULT_REPO_URL = "https://github.com/vllm-project/vllm.git"
# The abbreviated commit id that vLLM's own sdist records for the tag (vllm/_version.py,
# ``__commit_id__ = 'g26b999c71'``). A tag that resolves elsewhere is refused; the content
# check below (pristine header sha256) backs it up.
GIT_COMMIT_PREFIX = "26b999c71"

SDIST_NAME = f"vllm-{VLLM_VERSION}.tar.gz"
SDIST_SHA256 = "57608f44cf61f5d80fb182c98e06e524cb2925bb528258a7b247c8e43a52d13e"
SDIST_SIZE = 10908356
SDIST_TOPDIR = f"vllm-{VLLM_VERSION}"
# The unpacked sdist in full: hashing.manifest_digest(hashing.source_manifest(<its top dir>)),
# i.e. one sha256 over every file's path and sha256 (3063 files). A local --source directory
# and the kept pristine copy must match it exactly, not only the files the patches touch.
SDIST_SOURCE_FILES = 3063
SDIST_SOURCE_SHA256 = "c51956bd5a813de0f576c044fff0c8460efcabbbd4aee2dbb30b2016aeda76c0"
DEFAULT_INDEX_URL = "https://pypi.org/simple"

ATTENTION_HEADER = "csrc/attention/attention_kernels.cuh"
ATTENTION_HEADER_SHA256 = "7d3dba04d33d49dfcd7fc532cae5951a6ed1187ec5ef2ce969bfcaa37aeffb96"
# sha256 of every upstream file a kvprefetch patch may touch, as released in v0.10.2.
PRISTINE_SHA256 = {
    ATTENTION_HEADER: ATTENTION_HEADER_SHA256,
    "csrc/attention/paged_attention_v1.cu":
        "58e8dbfaa49bfb2a2ab2797c7d8e02a9b924a947e3f7ac0ea2211e6bdcb44629",
    "csrc/attention/paged_attention_v2.cu":
        "4faadf7672b1e12d5444899549f965c4cf83250ae0b7d9263b42f46fadb7ddcc",
}
# Our own headers (csrc/kvprefetch/), which `apply` installs in every variant's tree under
# csrc/attention/kvprefetch/, where the patched sources include them from: the rules table, the
# L2 prefetch instruction, the launch policy, the v2 prologue, the launchers' L2 prefetch kernel,
# the umbrella the `prefetch` variant includes, the paper's form (`seed`), the GQA twins (the
# header the launchers include and its three parts: device helpers, kernels, host launch) and
# stock's unbounded copies of the launch-bounded v1 kernels. Every file of csrc/kvprefetch/ is
# listed (tests/unit/test_upstream.py): an unlisted one would be missing from the trees and
# from the patch hash.
KIT_HEADERS = ("rules.inc", "l2_prefetch.cuh", "launch_policy.cuh", "prologue.cuh",
               "launcher_prefetch.cuh", "prefetch.cuh", "paper.cuh", "gqa_twins.cuh",
               "gqa_twins_device.cuh", "gqa_twins_kernel.cuh", "gqa_twins_launch.cuh",
               "stock_v1.cuh")
KIT_HEADER_DIR_IN_TREE = "csrc/attention/kvprefetch"
KIT_HEADERS_IN_TREE = tuple(f"{KIT_HEADER_DIR_IN_TREE}/{h}" for h in KIT_HEADERS)
# The only sources that include attention_kernels.cuh; both are in vLLM's _C extension.
PAGED_ATTENTION_SOURCES = ("csrc/attention/paged_attention_v1.cu",
                           "csrc/attention/paged_attention_v2.cu")

TREE_NAMES = ("baseline", "patched")
# What a tree may be called: tree names become folder names (trees/, build/, envs/), lock and
# file names (bench ncu's ncu-<shape>-<tree>.csv/.log) and C++ namespaces, so no separator, no
# dot. Here, below every layer that reads a tree's name from a record (workspace.workdir's
# check_tree_name, kernels.ops' build manifests). ``\Z``, not ``$``, which also matches before a
# last newline: `slurm plan --trees 'baseline,mine\n=launch'` passed it, and the plan was refused
# as "the campaign's job 'build-mine\n' is not one kvprefetch plans / plan the campaign again"
# (issue 41, the twenty-fourth hostile pass).
TREE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
PAPER_TREE = "paper"
# prefetch: our corrected in-kernel per-block prefetch (K and V sites of the attention kernel).
# launch:   attention kernels untouched; the launcher issues a small L2 prefetch kernel first.
# paper:    the paper's mechanism as its reproduction describes it.
# control:  stock, rebuilt through the same pipeline (its diffs add one comment to each
#           launcher): the A/A reference that shows the benchmark's resolution.
VARIANTS = ("prefetch", "launch", "paper", "control")
# Old names still accepted, as variant names and as tree names: the paper's variant and its
# tree were called `seed` until the RNG's --seed made the word ambiguous. Work directories made
# then keep a tree named seed, recorded as carrying the seed variant.
LEGACY_NAMES = {"seed": "paper"}


def canonical_variant(name: str) -> str:
    """The variant's current name (``seed`` -> ``paper``); any other name unchanged."""
    return LEGACY_NAMES.get(name, name)


def resolve_tree_name(name: str, existing: Iterable[str]) -> str:
    """The tree that a user-given ``name`` refers to, given the trees that ``existing`` names:
    the name itself when such a tree exists; else its other name (``seed`` <-> ``paper``) when
    a tree of that name exists (a work directory made before the rename, or after it); else the
    current name of a legacy one (``seed`` -> ``paper``)."""
    have = set(existing)
    if name in have:
        return name
    other = LEGACY_NAMES.get(name) or next((old for old, new in LEGACY_NAMES.items()
                                             if new == name), None)
    if other is not None and other in have:
        return other
    return LEGACY_NAMES.get(name, name)


DEFAULT_TREE_FOR_VARIANT = {"prefetch": "patched", "launch": "launch", "paper": PAPER_TREE,
                            "control": "control"}


def kit_root() -> Path:
    """The directory holding ``csrc/`` and ``patches/``: the repository checkout, or the
    copy shipped inside the installed package (``kvprefetch/data``)."""
    from .errors import ConfigError

    here = Path(__file__).resolve().parent  # the kvprefetch package
    # An installed copy (a data/ beside the code, even an incomplete one) is never taken for a
    # checkout, and a checkout is the package at src/kvprefetch beside setup.py and
    # pyproject.toml: a package copied or installed elsewhere without its data/ (`pip install
    # --target /tmp/x`, a copy on PYTHONPATH) read csrc/ and patches/ from the folder above
    # its own, /tmp for /tmp/x, and installed another user's headers into the trees (issue 41,
    # the tenth hostile pass).
    checkout = here.parent.parent
    cands = ([here / "data"] if os.path.lexists(here / "data")
             else [checkout] if here.parent.name == "src" and all(
                 (checkout / f).is_file() for f in ("setup.py", "pyproject.toml")) else [])
    for cand in cands:
        if ((cand / "csrc" / "kvprefetch").is_dir()
                and (cand / "patches" / f"v{VLLM_VERSION}").is_dir()):
            return cand
    where = (f"in {here / 'data'} (an installed copy)" if cands and cands[0] != checkout
             else f"in {checkout} (a checkout)" if cands
             else f"anywhere: {here} has no data/ folder (an installed copy's) and is not "
                  "src/kvprefetch of a checkout, so the folders around it are not read")
    raise ConfigError(f"kvprefetch's own csrc/kvprefetch/ and patches/v{VLLM_VERSION}/ were "
                      f"not found {where}",
                      "reinstall kvprefetch from a complete checkout (`pip install .`), or "
                      "restore them there (`git checkout -- csrc/ patches/`)")


def _kit_dirs_problem(path: Path) -> str | None:
    """Why a file of the kit is not reached through its own folders: a symlinked folder below
    ``kit_root`` (``csrc/kvprefetch`` linked elsewhere) would have the kit read, and install,
    files from outside its checkout (issue 41, the ninth hostile pass)."""
    root = kit_root()  # the checkout's is a resolved path; an installed copy's data/ is not
    if root.is_symlink():
        return f"{root} is a symlink -> {os.readlink(root)}"
    cur = root
    for part in path.relative_to(root).parts[:-1]:
        cur = cur / part
        if cur.is_symlink():
            return f"its folder {cur} is a symlink -> {os.readlink(cur)}"
    return None


def _kit_file_problem(path: Path, limit: int) -> str | None:
    """Why ``path`` is not a regular file of at most ``limit`` bytes, reached through the kit's
    own folders (None: it is)."""
    problem = _kit_dirs_problem(path)
    if problem is not None:
        return problem
    try:
        st = path.lstat()
    except OSError as exc:
        return exc.strerror or str(exc)
    return (f"it is a symlink -> {os.readlink(path)}" if stat.S_ISLNK(st.st_mode)
            else "it is not a regular file (a FIFO, device, socket or folder)"
            if not stat.S_ISREG(st.st_mode)
            else f"it is larger than {limit} bytes" if st.st_size > limit else None)


def kit_header_dir() -> Path:
    return kit_root() / "csrc" / "kvprefetch"


# Our largest header is some 40 KiB; the limit keeps a huge one from filling memory.
_MAX_HEADER_BYTES = 1 << 20


def kit_headers() -> list[tuple[Path, str]]:
    """(our file, its path in a tree) for each of KIT_HEADERS, each checked to be a regular
    file of at most 1 MiB, never a symlink nor in a symlinked folder (issue 41, the eighth
    hostile pass: a FIFO there hung ``apply``; a link out was read and installed into the
    tree; the ninth: ``csrc/kvprefetch`` linked to a folder elsewhere)."""
    from .errors import PatchError

    out = [(kit_header_dir() / h, t)
           for h, t in zip(KIT_HEADERS, KIT_HEADERS_IN_TREE, strict=True)]
    for src, _ in out:
        problem = _kit_file_problem(src, _MAX_HEADER_BYTES)
        if problem is not None:
            raise PatchError(f"the kit's header {src} cannot be used: {problem}",
                             f"restore {src} from a kvprefetch checkout "
                             "(`git checkout -- csrc/kvprefetch/`)")
    return out


# The kit's C++ sources other than its headers, which the builds compile (kernels-only and
# overlay: the ops library; overlay: the router). kvprefetch_ops.cpp is some 20 KiB.
KIT_SOURCES = ("kvprefetch_ops.cpp", "kvprefetch_route.cpp")
_MAX_SOURCE_BYTES = 1 << 20


def kit_source(name: str) -> Path:
    """``csrc/<name>`` of the kit, checked as its headers are: a regular file of at most 1 MiB,
    never a symlink nor in a symlinked folder (issue 41, the ninth hostile pass: a FIFO there
    hung ``build --dry-run``, a link to /dev/zero filled memory, a link out was hashed and
    compiled into the library a build installs). Otherwise one BuildError naming it."""
    from .errors import BuildError

    if name not in KIT_SOURCES:
        raise ValueError(f"{name} is not one of the kit's sources")
    path = kit_root() / "csrc" / name
    problem = _kit_file_problem(path, _MAX_SOURCE_BYTES)
    if problem is not None:
        raise BuildError(f"the kit's source {path} cannot be used: {problem}",
                         f"restore {path} from a kvprefetch checkout (`git checkout -- "
                         f"csrc/{name}`), or reinstall kvprefetch")
    return path


# A variant's diff is a few KiB; the limit keeps a huge or endless file from filling memory.
_MAX_PATCH_BYTES = 1 << 20
_NAMES = "|".join(re.escape(p) for p in PRISTINE_SHA256)
# The only lines a kit patch holds outside its hunks: what `git diff` writes for a file
# modified in place. Anything else git apply would act on (a rename, a copy, a new, deleted or
# re-moded file, a symlink's mode 120000, a binary patch, another -p level, a quoted name, a
# second name) is refused by not being on this list.
_DIFF_GIT = re.compile(rf"diff --git a/({_NAMES}) b/\1", re.ASCII)
_INDEX = re.compile(r"index [0-9a-f]{7,64}\.\.[0-9a-f]{7,64}(?: 100644)?", re.ASCII)
_HUNK = re.compile(r"@@ -[0-9]+(?:,([0-9]+))? \+[0-9]+(?:,([0-9]+))? @@(?: .*)?", re.ASCII)
# Line breaks that Python's str.splitlines honours and git does not (git splits on "\n"
# only), and every other control character but the tab: a line that git reads as one hunk
# line must never read as two here.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


def _parse_patch(text: str) -> tuple[str | None, list[str]]:
    """(why ``text`` is not a diff that only modifies files of PRISTINE_SHA256 in place, or
    None; the files it modifies). Read as git apply reads it (lines end at "\n" only; a
    hunk's length is what its header says, its lines begin with " ", "-", "+" or "\\ ", or are
    empty), and allowing only the lines `git diff` writes for such a change (issue 41, the
    ninth hostile pass: a hunk line holding a form feed, or a hunk header with Arabic-Indic
    digits, hid a second section that made a symlink in the scratch copy, and a hunk's added
    line "++ b/../x" was taken for a file to copy)."""
    if not text:
        return "it is empty", []
    if not text.endswith("\n"):
        return "its last line does not end with a newline", []
    lines = text[:-1].split("\n")
    paths: list[str] = []
    i, n = 0, len(lines)

    def where(k: int) -> str:
        return f"line {k + 1} ({lines[k][:80]!r})"

    for k, line in enumerate(lines):
        bad = _CONTROL.search(line)
        if bad is not None:
            return (f"line {k + 1} holds the control character {bad.group()!r} (column "
                    f"{bad.start() + 1}), which git and kvprefetch would read differently"), []
    while i < n:
        m = _DIFF_GIT.fullmatch(lines[i])
        if m is None:
            return (f"{where(i)} is not the 'diff --git a/<file> b/<file>' line of a file "
                    "the kit may patch: it names not one of the upstream files a kit patch "
                    f"may modify in place ({', '.join(PRISTINE_SHA256)})"), []
        rel = m.group(1)
        i += 1
        if i < n and _INDEX.fullmatch(lines[i]):
            i += 1
        for want in (f"--- a/{rel}", f"+++ b/{rel}"):
            if i >= n or lines[i] != want:
                return (f"{where(min(i, n - 1))} is not {want!r}: a kit patch only modifies "
                        "files in place"), []
            i += 1
        hunks = 0
        while i < n and lines[i].startswith("@@"):
            h = _HUNK.fullmatch(lines[i])
            if h is None:
                return f"{where(i)} is not a hunk header", []
            old = int(h.group(1) or 1)
            new = int(h.group(2) or 1)
            i += 1
            while old > 0 or new > 0:
                if i >= n:
                    return "its last hunk is shorter than its header says", []
                line = lines[i]
                if line.startswith("-"):
                    old -= 1
                elif line.startswith("+"):
                    new -= 1
                elif line == "" or line.startswith(" "):
                    old, new = old - 1, new - 1
                elif not line.startswith("\\ "):
                    return f"{where(i)} is not a line of a hunk", []
                if old < 0 or new < 0:
                    return f"{where(i)} makes a hunk longer than its header says", []
                i += 1
            if i < n and lines[i].startswith("\\ "):  # "\ No newline at end of file"
                i += 1
            hunks += 1
        if hunks == 0:
            return f"the section of {rel} has no hunk", []
        paths.append(rel)
    if not paths:
        return "it holds no diff", []
    return None, paths


def _checked_patches(variant: str) -> list[tuple[Path, list[str]]]:
    """A variant's diffs and the upstream files each modifies, each diff checked first (issue
    41, the eighth and ninth hostile passes): a regular file of at most 1 MiB of UTF-8 text,
    in the kit's own folders, that only modifies pinned upstream files in place. A diff naming
    ``../../x``, an absolute path, a rename, a symlink or binary content (the kit's
    ``patches/`` altered by hand) made ``apply`` copy and write outside the work directory."""
    from .errors import PatchError
    from .reading import read_limited

    d = kit_root() / "patches" / f"v{VLLM_VERSION}" / canonical_variant(variant)
    out = []
    for p in sorted(d.glob("*.patch")):
        fix = (f"restore {p} from a kvprefetch checkout (`git checkout -- patches/`), or move "
               "it away")
        if p.is_symlink():
            raise PatchError(f"the kit's patch {p} is a symlink -> {os.readlink(p)}; a kit "
                             "patch is a file of the checkout", fix)
        paths: list[str] = []
        problem = _kit_dirs_problem(p)
        if problem is None:
            try:
                problem, paths = _parse_patch(
                    read_limited(p, _MAX_PATCH_BYTES).decode("utf-8"))
            except UnicodeDecodeError:
                problem = "it is not UTF-8 text"
            except (ValueError, OSError) as exc:
                problem = str(exc) if isinstance(exc, ValueError) else (exc.strerror or str(exc))
        if problem is not None:
            raise PatchError(f"the kit's patch {p} cannot be applied: {problem}", fix)
        out.append((p, paths))
    return out


def patch_files(variant: str) -> list[Path]:
    """A variant's diffs, each checked first (``_checked_patches``)."""
    return [p for p, _ in _checked_patches(variant)]


def patched_paths(variant: str) -> list[str]:
    """The upstream files (relative paths, each one of PRISTINE_SHA256) that a variant's diffs
    modify: the names of their checked sections, never a line read from inside a hunk."""
    return sorted({rel for _, paths in _checked_patches(variant) for rel in paths})


def all_patched_paths() -> list[str]:
    return sorted({f for v in VARIANTS for f in patched_paths(v)})
