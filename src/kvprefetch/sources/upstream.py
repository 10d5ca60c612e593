"""What we pin about upstream vLLM v0.10.2, and where the kit's own patch files live.

Every number here was read off the real release: the PyPI sdist's sha256, the commit that
the sdist's ``vllm/_version.py`` records (``g26b999c71``), and the sha256 of the pristine
``csrc/attention/attention_kernels.cuh``."""

from __future__ import annotations

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
# Where ``apply`` puts our helper inside a tree (next to the header that includes it).
PREFETCH_HEADER_IN_TREE = "csrc/attention/prefetch_ptx.cuh"
# Our own headers, which `apply` installs next to vLLM's attention sources in every variant's
# tree: the prefetch (prefetch_ptx.cuh) and the GQA-grouped twin kernel (gqa_grouped.cuh).
KIT_HEADERS = ("prefetch_ptx.cuh", "gqa_grouped.cuh")
KIT_HEADERS_IN_TREE = tuple(f"csrc/attention/{h}" for h in KIT_HEADERS)
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
# csrc/prefetch_ptx.cuh's kPrologueMinHeadSize and prologue_rule: `prefetch` compiles its
# prologue only into v2 kernels with fp16 caches and at least this head size, or bf16 caches
# and head size 128 (docs/tuning-log.md).
PROLOGUE_MIN_HEAD_SIZE = 128


def prefetches_in(variant: str | None, version: str, kv_cache: str, head_size: int,
                  dtype: str) -> bool:
    """Whether ``variant`` puts a bulk prefetch into this paged_attention instantiation
    (``dtype``: the query's, fp16 | bf16 | fp32); its other attention kernels must stay
    instruction-identical to stock unless a launch bound changes them (verify-kernel)."""
    if variant in (None, "stock", "launch", "control"):
        return False
    if variant == "prefetch":
        return (version == "v2" and kv_cache == "auto" and head_size >= PROLOGUE_MIN_HEAD_SIZE
                and (dtype == "fp16" or (dtype == "bf16" and head_size <= 128)))
    return True  # paper, and any in-kernel variant of the paper's shape: every kernel


# csrc/prefetch_ptx.cuh's min_blocks_rule: `prefetch` declares the v1 kernels with fp16/bf16
# caches and block size 16 __launch_bounds__(128, N), N keyed by head size; every other
# instantiation has no bound and must stay instruction-identical to stock
# (docs/tuning-log.md rows 27-28).
V1_MIN_BLOCKS = {64: 6, 128: 4, 256: 3}


def min_blocks(variant: str | None, version: str, kv_cache: str, head_size: int,
               block_size: int, dtype: str) -> int:
    """The minBlocksPerMultiprocessor ``variant`` declares for this instantiation (0: none)."""
    if (variant != "prefetch" or version != "v1" or block_size != 16 or kv_cache != "auto"
            or dtype not in ("fp16", "bf16")):
        return 0
    return V1_MIN_BLOCKS.get(head_size, 0)


def changes_kernel(variant: str | None, version: str, kv_cache: str, head_size: int,
                   block_size: int, dtype: str) -> bool:
    """Whether ``variant`` compiles this instantiation differently from stock (a prefetch in it,
    or a launch bound); the others must be instruction-identical to stock."""
    return (prefetches_in(variant, version, kv_cache, head_size, dtype)
            or min_blocks(variant, version, kv_cache, head_size, block_size, dtype) > 0)


# csrc/prefetch_ptx.cuh's twin_rule and kTwins: `prefetch` compiles four GQA-grouped twins
# (csrc/gqa_grouped.cuh: kvprefetch::gqa_decode_kernel with G query heads and S times stock's
# threads per CTA) beside the kernels with head size 128, block size 16, not block-sparse, and
# fp16 caches (v1 and v2) or bf16 caches (v2 only); the launchers run one of them instead of
# vLLM's kernel. vLLM's own kernels are unchanged. (G, S, min_ctas_pct): `auto` runs the first
# twin whose min_ctas_pct the grid reaches, in stock CTAs per 100 SMs.
TWIN_SHAPES = ((4, 1, 1000), (4, 2, 500), (2, 2, 150), (2, 4, 0))
# csrc/gqa_grouped.cuh's staged<S>: the twins of these S are also compiled staged (a
# shared-memory ring per warp, KVPREFETCH_TWIN_STAGE > 0, the default), beside their unstaged
# instantiation, which the launcher runs where two ring slots per warp do not fit.
STAGED_SPLITS = (2,)
STAGE_SLOTS = 2  # KVPREFETCH_TWIN_STAGE: slots per warp of the ring
# csrc/gqa_grouped.cuh's fusable: the v2 twins of these (G, S) are also compiled FUSED (the CTA
# of a (sequence, head group) that finishes last does v2's reduction, KVPREFETCH_TWIN_FUSE),
# beside their plain instantiation.
FUSED_TWINS = ((2, 2),)


def twin_reduces(kernel: str, group: int, split: int, twin_ctas: int, sm_count: int) -> bool:
    """csrc/gqa_grouped.cuh's twin_reduces under the default KVPREFETCH_TWIN_FUSE=1: a v2 twin
    in FUSED_TWINS does the reduction itself on grids of more than half and at most all of the
    SMs' count of CTAs (the grids after which kvprefetch's own reduce kernel would not run,
    pdl_reduce_after); elsewhere a reduce kernel follows it."""
    return (kernel == "v2" and (group, split) in FUSED_TWINS
            and 2 * twin_ctas > sm_count and twin_ctas <= sm_count)


def stage_count(ctas: int, sm_count: int, smem_per_sm: int, fixed: int, cta_warps: int,
                chunk_bytes: int, blocks_per_cta: int, max_slots: int = STAGE_SLOTS) -> int:
    """csrc/prefetch_ptx.cuh's stage_count: ring slots per warp a staged twin's launch gets (0:
    the launcher runs the unstaged twin). Per CTA the SM's shared memory over the CTAs it holds
    at once (the grid's per SM, at most 16 warps' worth), less 1 KiB (the system's), 3 KiB
    (static, mbarriers, alignment) and `fixed` (the twin's other dynamic shared memory); at
    most 2 x ceil(blocks / warps) chunks and `max_slots`; fewer than two is 0."""
    per_sm = -(-ctas // max(sm_count, 1))
    resident = max(1, min(per_sm, 16 // cta_warps))
    room = (smem_per_sm // resident - 1024 - 3072 - fixed) // (cta_warps * chunk_bytes)
    need = 2 * -(-max(blocks_per_cta, 1) // cta_warps)
    slots = min(room, need, max_slots)
    return slots if slots >= 2 else 0


def twin_stage_slots(batch: int, context: int, kernel: str, group: int, split: int,
                     sm_count: int = 132, smem_per_sm: int = 233472) -> int:
    """Ring slots the launcher gives twin (group, split) on a Llama-3.1-8B decode step (32 query
    heads, 8 kv heads, head 128, block 16, fp16, every sequence `context` tokens), by the
    launchers' sizes: stock's shared memory (v1: the padded context's logits; v2: a partition's,
    or the output scratch if larger) G times, plus the V products of the warps beyond stock's
    (csrc/gqa_grouped.cuh products_floats). Defaults: the H200."""
    if split not in STAGED_SPLITS:
        return 0
    blocks = -(-context // 16)
    logits = (blocks * 16 if kernel == "v1" else 512) * 4
    stock_smem = max(logits, (4 // 2) * 128 * 4)
    products = (split - 1) * 4 * group * 8 * 32 * 4  # floats -> bytes
    partitions = 1 if kernel == "v1" else -(-context // 512)
    ctas = 32 // group * batch * partitions
    return stage_count(ctas, sm_count, smem_per_sm, group * stock_smem + products, 4 * split,
                       128 * 16 * 2, blocks if kernel == "v1" else 512 // 16)


def twin_shapes(variant: str | None, version: str, kv_cache: str, head_size: int,
                block_size: int, dtype: str, block_sparse: bool = False
                ) -> tuple[tuple[int, int], ...]:
    """(G, S) of each twin ``variant`` compiles beside this instantiation (none: empty)."""
    cache_ok = dtype == "fp16" or (dtype == "bf16" and version == "v2")
    if (variant != "prefetch" or not cache_ok or block_sparse or kv_cache != "auto"
            or block_size != 16 or head_size != 128):
        return ()
    return tuple((g, s) for g, s, _ in TWIN_SHAPES)


def auto_twin(ctas_pct: int) -> tuple[int, int]:
    """(G, S) of the twin `auto` takes first for a grid of ``ctas_pct`` stock CTAs per 100 SMs
    (twin_pick may move on from it, below)."""
    return next(((g, s) for g, s, lo in TWIN_SHAPES if ctas_pct >= lo), TWIN_SHAPES[-1][:2])


# The H200's SM count and shared memory per SM (cudaDevAttrMaxSharedMemoryPerMultiprocessor),
# and the most dynamic shared memory a CTA may opt into.
H200_SMS, H200_SMEM_PER_SM, H200_MAX_SMEM = 132, 233472, 232448


def keeps_occupancy(split: int, twin_ctas: int, sm_count: int, smem: int,
                    smem_per_sm: int) -> bool:
    """csrc/prefetch_ptx.cuh's keeps_occupancy: an SM holds two CTAs of ``smem`` bytes of
    dynamic shared memory (plus 4 KiB each: the system's and the static part) wherever the
    twin's grid has two per SM to give it and its launch bound (4 / S CTAs per SM) allows two;
    else one."""
    per_sm = -(-twin_ctas // max(sm_count, 1))
    return smem_per_sm // (smem + 1024 + 3072) >= min(per_sm, 4 // split, 2)


def twin_smem(group: int, split: int, context: int, kernel: str) -> int:
    """Dynamic shared memory (bytes) of twin (group, split), unstaged, for a head-128, block-16,
    fp16/bf16 step whose longest sequence has ``context`` tokens: G times stock's (v1: the
    padded context's logits; v2: a partition's, or the output scratch if larger) plus the V
    products of the warps beyond stock's (csrc/gqa_grouped.cuh twin_smem_before)."""
    logits = (-(-context // 16) * 16 if kernel == "v1" else 512) * 4
    stock_smem = max(logits, (4 // 2) * 128 * 4)
    return group * stock_smem + (split - 1) * 4 * group * 8 * 32 * 4


def twin_pick(num_heads: int, num_kv_heads: int, batch: int, context: int, kernel: str,
              sm_count: int = H200_SMS, smem_per_sm: int = H200_SMEM_PER_SM,
              max_smem: int = H200_MAX_SMEM) -> tuple[int, int] | None:
    """csrc/prefetch_ptx.cuh's twin_pick in `auto` for a decode step of a head-128, block-16
    model (every sequence ``context`` tokens): auto_twin's pick if its G divides the query heads
    per kv head (else None, vLLM's kernel), moving on to the next twin of TWIN_SHAPES that can
    run and keeps two CTAs per SM wherever the pick does not; None past the last."""
    if num_kv_heads <= 0 or num_heads % num_kv_heads:
        return None
    per_kv = num_heads // num_kv_heads
    partitions = 1 if kernel == "v1" else -(-context // 512)
    stock_ctas = num_heads * batch * partitions
    first = auto_twin(100 * stock_ctas // max(sm_count, 1))
    if per_kv % first[0]:
        return None
    shapes = [(g, s) for g, s, _ in TWIN_SHAPES]
    for g, s in shapes[shapes.index(first):]:
        smem = twin_smem(g, s, context, kernel)
        if (per_kv % g == 0 and smem <= max_smem
                and keeps_occupancy(s, stock_ctas // g, sm_count, smem, smem_per_sm)):
            return g, s
    return None


# Variants whose launchers (v1 and v2) fire kvprefetch's kv_l2_prefetch_kernel beside small
# steps; `prefetch` fires it before every v2 kernel too (KVPREFETCH_V2_L2_KERNEL=2).
LAUNCHER_PREFETCH_VARIANTS = ("prefetch", "launch")
DEFAULT_TREE_FOR_VARIANT = {"prefetch": "patched", "launch": "launch", "paper": PAPER_TREE,
                            "control": "control"}


def kit_root() -> Path:
    """The directory holding ``csrc/`` and ``patches/``: the repository checkout, or the
    copy shipped inside the installed package (``kvprefetch/data``)."""
    here = Path(__file__).resolve().parent.parent  # the kvprefetch package
    for cand in (here / "data", here.parent.parent):
        if (cand / "csrc").is_dir() and (cand / "patches" / f"v{VLLM_VERSION}").is_dir():
            return cand
    raise FileNotFoundError("kvprefetch's csrc/ and patches/ were not found")


def prefetch_header() -> Path:
    return kit_root() / "csrc" / "prefetch_ptx.cuh"


def kit_headers() -> list[tuple[Path, str]]:
    """(our file, its path in a tree) for each of KIT_HEADERS."""
    return [(kit_root() / "csrc" / h, t) for h, t in zip(KIT_HEADERS, KIT_HEADERS_IN_TREE)]


def patch_files(variant: str) -> list[Path]:
    d = kit_root() / "patches" / f"v{VLLM_VERSION}" / canonical_variant(variant)
    return sorted(d.glob("*.patch"))


def patched_paths(variant: str) -> list[str]:
    """The upstream files (relative paths) that a variant's diffs modify."""
    out = []
    for p in patch_files(variant):
        for line in p.read_text().splitlines():
            if line.startswith("+++ b/"):
                out.append(line[len("+++ b/"):].strip())
    return sorted(set(out))


def all_patched_paths() -> list[str]:
    return sorted({f for v in VARIANTS for f in patched_paths(v)})
