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
    here = Path(__file__).resolve().parent  # the kvprefetch package
    for cand in (here / "data", here.parent.parent):
        if ((cand / "csrc" / "kvprefetch").is_dir()
                and (cand / "patches" / f"v{VLLM_VERSION}").is_dir()):
            return cand
    raise FileNotFoundError("kvprefetch's csrc/kvprefetch/ and patches/ were not found")


def kit_header_dir() -> Path:
    return kit_root() / "csrc" / "kvprefetch"


# Our largest header is some 40 KiB; the limit keeps a huge one from filling memory.
_MAX_HEADER_BYTES = 1 << 20


def kit_headers() -> list[tuple[Path, str]]:
    """(our file, its path in a tree) for each of KIT_HEADERS, each checked to be a regular
    file of at most 1 MiB, never a symlink (issue 41, the eighth hostile pass: a FIFO there
    hung ``apply``; a link out was read and installed into the tree)."""
    from .errors import PatchError

    out = [(kit_header_dir() / h, t)
           for h, t in zip(KIT_HEADERS, KIT_HEADERS_IN_TREE, strict=True)]
    for src, _ in out:
        problem: str | None
        try:
            st = src.lstat()
        except OSError as exc:
            problem = exc.strerror or str(exc)
        else:
            problem = ("it is a symlink" if stat.S_ISLNK(st.st_mode)
                       else "it is not a regular file (a FIFO, device, socket or folder)"
                       if not stat.S_ISREG(st.st_mode)
                       else f"it is larger than {_MAX_HEADER_BYTES} bytes"
                       if st.st_size > _MAX_HEADER_BYTES else None)
        if problem is not None:
            raise PatchError(f"the kit's header {src} cannot be used: {problem}",
                             f"restore {src} from a kvprefetch checkout "
                             "(`git checkout -- csrc/kvprefetch/`)")
    return out


# A variant's diff is a few KiB; the limit keeps a huge or endless file from filling memory.
_MAX_PATCH_BYTES = 1 << 20
# Header lines git apply acts on that no kit patch carries: a rename, a copy, a new, deleted or
# re-moded file (a symlink is mode 120000), a binary patch.
_REFUSED_HEADERS = ("rename ", "copy ", "new file mode", "deleted file mode", "new mode",
                    "old mode", "GIT binary patch", "Binary files")
_HUNK = re.compile(r"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def _patch_problem(text: str) -> str | None:
    """Why a diff is not one that only modifies files of PRISTINE_SHA256 in place (None: it
    is). Header lines are read outside hunks only, so a hunk's "--- " line is content."""
    old = new = 0
    for line in text.splitlines():
        if old > 0 or new > 0:  # inside a hunk
            if line.startswith("-"):
                old -= 1
            elif line.startswith("+"):
                new -= 1
            elif not line.startswith("\\"):  # context (" ", or an empty line)
                old, new = old - 1, new - 1
            continue
        m = _HUNK.match(line)
        if m:
            old, new = int(m.group(1) or 1), int(m.group(2) or 1)
        elif line.startswith(_REFUSED_HEADERS):
            return (f"it has a {line[:80]!r} header; a kit patch only modifies files in "
                    "place")
        elif line.startswith(("--- ", "+++ ", "diff --git ")):
            words = (line[len("diff --git "):].split(" ") if line.startswith("diff")
                     else [line[4:]])
            for w in words:
                rel = w[2:] if w.startswith(("a/", "b/")) else None
                if rel not in PRISTINE_SHA256:
                    return (f"it names {w[:200]!r}, not one of the upstream files a kit patch "
                            f"may touch ({', '.join(PRISTINE_SHA256)})")
    return None


def patch_files(variant: str) -> list[Path]:
    """A variant's diffs, each checked first (issue 41, the eighth hostile pass): a regular
    file of at most 1 MiB of UTF-8 text that only modifies pinned upstream files in place. A
    diff naming ``../../x``, an absolute path, a rename, a symlink or binary content (the kit's
    ``patches/`` altered by hand) made ``apply`` copy and write outside the work directory."""
    from .errors import PatchError
    from .reading import read_limited

    d = kit_root() / "patches" / f"v{VLLM_VERSION}" / canonical_variant(variant)
    files = sorted(d.glob("*.patch"))
    for p in files:
        fix = (f"restore {p} from a kvprefetch checkout (`git checkout -- patches/`), or move "
               "it away")
        if p.is_symlink():
            raise PatchError(f"the kit's patch {p} is a symlink -> {os.readlink(p)}; a kit "
                             "patch is a file of the checkout", fix)
        try:
            problem = _patch_problem(read_limited(p, _MAX_PATCH_BYTES).decode("utf-8"))
        except UnicodeDecodeError:
            problem = "it is not UTF-8 text"
        except (ValueError, OSError) as exc:
            problem = str(exc) if isinstance(exc, ValueError) else (exc.strerror or str(exc))
        if problem is not None:
            raise PatchError(f"the kit's patch {p} cannot be applied: {problem}", fix)
    return files


def patched_paths(variant: str) -> list[str]:
    """The upstream files (relative paths) that a variant's diffs modify (each one of
    PRISTINE_SHA256: ``patch_files`` checks)."""
    out = []
    for p in patch_files(variant):
        for line in p.read_text().splitlines():
            if line.startswith("+++ b/"):
                out.append(line[len("+++ b/"):].strip())
    return sorted(set(out))


def all_patched_paths() -> list[str]:
    return sorted({f for v in VARIANTS for f in patched_paths(v)})
