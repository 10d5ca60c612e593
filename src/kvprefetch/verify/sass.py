"""Reading ``cuobjdump -sass`` output: which paged-attention kernels a library contains, per
SASS arch, and how many ``UBLKPF`` (the bulk L2 prefetch, ``cp.async.bulk.prefetch.L2``) each
one issues. Pure functions over text, tested on saved samples.

vLLM's _C ships SASS only (code=sm_90, no PTX), so the machine code is the only place to look.
Counting is per function, never over the whole file: other CUTLASS/cute code in a full _C
could contain bulk prefetches of its own."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

_ARCH = re.compile(r"^\s*arch = (sm_\d+a?)")
_FUNC = re.compile(r"^\s*Function : (\S+)")
_PREFETCH = re.compile(r"\bUBLKPF\b")
_LINE_PREFETCH = re.compile(r"\bCCTL\.E\.PF2\b")
_ADDRESS = re.compile(r"/\*[0-9a-fx]+\*/")  # an instruction's address, /*0a70*/
# The template arguments both kernels share: scalar_t, cache_t, HEAD_SIZE, BLOCK_SIZE,
# NUM_THREADS, then the start of KV_DTYPE (its namespace is spelled per kernel).
# A number in a name is at most 9 digits (_N): a name is data where it comes from a verify
# cache entry (facts.py), and ``int()`` of a run past Python's limit on digits (4,300, or the
# user's PYTHONINTMAXSTRDIGITS) was a ValueError traceback in verify-kernel (issue 41, the
# thirty-seventh hostile pass). A name with a longer number is no kernel of these.
_N = r"\d{1,9}"
_SHAPE_ARGS = (r"(?P<scalar>13__nv_bfloat16|t|f)(?P<cache>S\d*_|13__nv_bfloat16|t|f|h)"
               rf"Li(?P<head>{_N})ELi(?P<block>{_N})ELi(?P<threads>{_N})E")
_KERNEL = re.compile(r"paged_attention_(?P<version>v[12])_kernelI" + _SHAPE_ARGS
                     + r"LNS_\d+Fp8KVCacheDataTypeE(?P<kv>\d)ELb(?P<sparse>[01])E")
# kvprefetch's GQA-grouped twins (csrc/kvprefetch/gqa_twins.cuh): PARTITION_SIZE 0 is v1, then G, S,
# and (since the shared-memory ring) STAGED, and (since v2's reduction in the twin) FUSED.
_TWIN = re.compile(r"gqa_decode_kernelI" + _SHAPE_ARGS
                   + r"LN4vllm\d+Fp8KVCacheDataTypeE(?P<kv>\d)ELi(?P<partition>\d+)"
                   rf"ELi(?P<group>{_N})ELi(?P<split>{_N})E(?:Lb(?P<staged>[01])E)?"
                   r"(?:Lb(?P<fused>[01])E)?")
# Stock's unbounded copy of a launch-bounded v1 kernel (csrc/kvprefetch/stock_v1.cuh).
_UNBOUNDED = re.compile(r"unbounded_v1_kernelI" + _SHAPE_ARGS
                        + r"LN4vllm\d+Fp8KVCacheDataTypeE(?P<kv>\d)ELb(?P<sparse>[01])E")
_SCALAR = {"t": "fp16", "f": "fp32", "13__nv_bfloat16": "bf16"}
_KV = {"0": "auto", "1": "fp8_e4m3", "2": "fp8_e5m2"}


def _shape(m: re.Match[str]) -> dict[str, object]:
    return {"dtype": _SCALAR[m["scalar"]], "kv_cache": _KV.get(m["kv"], m["kv"]),
            "head_size": int(m["head"]), "block_size": int(m["block"])}


@dataclass(frozen=True)
class KernelSass:
    arch: str            # sm_90
    name: str            # mangled
    version: str         # v1 | v2
    dtype: str           # fp16 | bf16 | fp32 (query / compute dtype)
    kv_cache: str        # auto | fp8_e4m3 | fp8_e5m2
    head_size: int
    block_size: int
    block_sparse: bool
    ublkpf: int          # bulk L2 prefetch instructions in this function
    line_prefetch: int   # CCTL.E.PF2 (prefetch.global.L2) instructions

    @property
    def shape_key(self) -> tuple[str, int, int, str, str]:
        return (self.arch, self.head_size, self.block_size, self.dtype, self.kv_cache)


def decode_kernel_name(mangled: str) -> dict[str, object] | None:
    """Template arguments of a mangled paged_attention_v{1,2}_kernel name, or None."""
    m = _KERNEL.search(mangled)
    if m is None:
        return None
    return {"version": m["version"], **_shape(m), "block_sparse": m["sparse"] == "1"}


def decode_twin_name(mangled: str) -> dict[str, object] | None:
    """Template arguments of a mangled kvprefetch gqa_decode_kernel name, or None."""
    m = _TWIN.search(mangled)
    if m is None:
        return None
    return {"version": "v1" if m["partition"] == "0" else "v2", **_shape(m),
            "group": int(m["group"]), "split": int(m["split"]), "staged": m["staged"] == "1",
            "fused": m["fused"] == "1"}


def decode_unbounded_name(mangled: str) -> dict[str, object] | None:
    """Template arguments of a mangled kvprefetch unbounded_v1_kernel name, or None."""
    m = _UNBOUNDED.search(mangled)
    if m is None:
        return None
    return {"version": "v1", **_shape(m), "block_sparse": m["sparse"] == "1"}


def parse_sass(text: str) -> list[KernelSass]:
    """Every paged_attention_v1/v2 kernel in ``text`` with its arch and prefetch counts."""
    out: list[KernelSass] = []
    arch = "?"
    name: str | None = None
    counts = [0, 0]

    def flush() -> None:
        if name is None:
            return
        meta = decode_kernel_name(name)
        if meta is not None:
            out.append(KernelSass(arch=arch, name=name, ublkpf=counts[0],
                                  line_prefetch=counts[1], **meta))  # type: ignore[arg-type]

    # Each regex is tried only on lines holding its literal text (a full library's listing is
    # ~550 MB; the plain substring test is what keeps this pass to about a second per 250 MB).
    for line in text.splitlines():
        if "arch = " in line:
            m = _ARCH.match(line)
            if m:
                flush()
                name, arch, counts = None, m.group(1), [0, 0]
                continue
        if "Function : " in line:
            m = _FUNC.match(line)
            if m:
                flush()
                name, counts = m.group(1), [0, 0]
                continue
        if name is not None:
            if "UBLKPF" in line and _PREFETCH.search(line):
                counts[0] += 1
            elif "CCTL.E.PF2" in line and _LINE_PREFETCH.search(line):
                counts[1] += 1
    flush()
    return out


def arch_number(arch: str) -> int:
    m = re.match(rf"sm_({_N})(?!\d)", arch)  # a cache entry's arch is data (see _N)
    return int(m.group(1)) if m else 0


@dataclass(frozen=True)
class SassVerdict:
    ok: bool
    kernels: int
    with_prefetch: int
    problems: tuple[str, ...]


@functools.lru_cache(maxsize=2)
def function_bodies(text: str) -> Mapping[tuple[str, str], str]:
    """(arch, mangled name) -> the function's SASS with addresses stripped, for comparing the
    same kernel across two libraries instruction by instruction. verify-kernel asks this of the
    same listings many times (every check, and the baseline's for every tree; head 128 alone in
    three dtypes is a 10 MB listing), so the result is kept, read-only, for the last two listings:
    the tree being checked and the baseline it is compared with. cuobjdump prints each
    instruction's second encoding word (``/* 0x… */``, which holds its scheduling control bits:
    stalls, yields, barriers) on a line of its own; those lines are kept, so two kernels compare
    equal only if their schedules do too, and no opcode check matches them."""
    out: dict[tuple[str, str], list[str]] = {}
    arch, name = "?", None
    body: list[str] = []
    for line in text.splitlines():
        if "arch = " in line:
            m = _ARCH.match(line)
            if m:
                arch, name = m.group(1), None
                continue
        if "Function : " in line:
            m = _FUNC.match(line)
            if m:
                name = m.group(1)
                body = out[(arch, name)] = []
                continue
        if name is not None and "/*" in line:
            instr = _ADDRESS.sub("", line).split(";")[0].strip()
            if instr:
                body.append(instr)
    return MappingProxyType({k: "\n".join(v) for k, v in out.items()})


def prefetch_kernels(text: str) -> dict[tuple[str, str], int]:
    """UBLKPF count of each kvprefetch L2 prefetch kernel (the `launch` variant)."""
    return {k: body.count("UBLKPF") for k, body in function_bodies(text).items()
            if "kv_l2_prefetch_kernel" in k[1]}


# SASS opcodes that read or write global memory (or its caches): what a programmatic dependent
# must not issue before its ACQBULK (PTX griddepcontrol.wait).
_GLOBAL_OPS = frozenset({"LDG", "STG", "LD", "ST", "ATOM", "ATOMG", "RED", "REDG", "LDGSTS",
                         "UBLKPF", "UBLKCP", "CCTL"})


def _opcode(instr: str) -> str:
    """The opcode of one instruction (``@!P0 LDG.E.64 R4, ...`` -> ``LDG``)."""
    words = instr.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def pdl_waits(text: str) -> dict[tuple[str, str], tuple[bool, bool]]:
    """(arch, mangled name) -> (waits, waits first) for each of kvprefetch's GQA twins and
    reduce kernels (csrc/kvprefetch/gqa_twins.cuh) in ``text``: whether the function waits for the
    stream's previous kernel (``ACQBULK``, PTX ``griddepcontrol.wait``: it is launched as a
    programmatic dependent), and whether that wait comes before its first instruction that
    touches global memory, so that the launch overlap never reorders a memory access."""
    out = {}
    for key, body in function_bodies(text).items():
        if "gqa_decode_kernel" not in key[1] and "gqa_reduce_kernel" not in key[1]:
            continue
        ops = [_opcode(i) for i in body.splitlines()]
        wait = ops.index("ACQBULK") if "ACQBULK" in ops else None
        first_access = next((n for n, op in enumerate(ops) if op in _GLOBAL_OPS), len(ops))
        out[key] = (wait is not None, wait is not None and wait < first_access)
    return out


_READONLY_LOAD = re.compile(r"\bLDG\.[A-Z0-9.]*CONSTANT\b")
_ANY_LOAD = re.compile(r"\bLDG\.[A-Z0-9.]*")


def readonly_loads(text: str) -> dict[tuple[str, str], int]:
    """Read-only-path global loads (``LDG….CONSTANT``, PTX ``ld.global.nc``) per paged-attention
    kernel. NVVM emits them only while it can prove the KV cache is never written during the
    kernel; an asm that captures the cache pointer loses them (docs/tuning-log.md)."""
    return {k: len(_READONLY_LOAD.findall(body)) for k, body in function_bodies(text).items()
            if "paged_attention" in k[1]}


def judge(kernels: Iterable[KernelSass], *, patched: bool, sites: int = 2,
          expects: Callable[[KernelSass], bool] | None = None) -> SassVerdict:
    """Baseline: no UBLKPF in any attention kernel. A patched variant: at least ``sites`` (one K
    site, one V site) in every sm_90+ instantiation ``expects`` selects (default: all of them),
    none in its other attention kernels (``expects`` always False: the `launch` variant), and
    none in pre-Hopper cubins, whose kernels must still exist."""
    ks = list(kernels)
    problems: list[str] = []
    if not ks:
        problems.append("no paged_attention_v1/v2 kernels found in the SASS")
    for k in ks:
        hopper = arch_number(k.arch) >= 90
        wanted = patched and (expects is None or expects(k))
        label = (f"{k.arch} {k.version} head={k.head_size} block={k.block_size} {k.dtype}"
                 f"/{k.kv_cache}{' sparse' if k.block_sparse else ''}")
        if not wanted and k.ublkpf:
            where = "the baseline" if not patched else "a kernel this variant leaves stock"
            problems.append(f"{label}: {k.ublkpf} UBLKPF in {where} (expected 0)")
        if wanted and hopper and k.ublkpf < sites:
            problems.append(f"{label}: {k.ublkpf} UBLKPF (expected >= {sites}: K and V sites)")
        if wanted and not hopper and k.ublkpf:
            problems.append(f"{label}: UBLKPF in a pre-Hopper cubin")
    return SassVerdict(not problems, len(ks), sum(1 for k in ks if k.ublkpf), tuple(problems))


def summarise(kernels: Iterable[KernelSass]) -> list[dict[str, object]]:
    """Compact table rows by (arch, head size, block size, dtype, kv cache): kernel count and
    min/max UBLKPF over the v1/v2 x sparse instantiations of that shape."""
    groups: dict[tuple[str, int, int, str, str], list[KernelSass]] = {}
    for k in kernels:
        groups.setdefault(k.shape_key, []).append(k)
    rows = []
    for key in sorted(groups):
        g = groups[key]
        rows.append({"arch": key[0], "head_size": key[1], "block_size": key[2], "dtype": key[3],
                     "kv_cache": key[4], "kernels": len(g),
                     "ublkpf_min": min(k.ublkpf for k in g),
                     "ublkpf_max": max(k.ublkpf for k in g)})
    return rows


_ORDERED_LOAD = re.compile(r"\bLDG\.[A-Z0-9.]*STRONG\.(?:SM|GPU)\b")


def twin_kernels(text: str) -> dict[tuple[str, str], tuple[dict[str, object], int, int]]:
    """(arch, mangled name) -> (template arguments, global loads, global loads that are
    read-only or ordered) of each GQA-grouped twin in ``text``. Read-only
    (``LDG….CONSTANT``): the K/V loads, and every load of a twin launched as vLLM launches its
    kernels; ordered (strong: ``LDG….STRONG.SM``, PTX ``ld.global.ca``, or ``….STRONG.GPU``,
    ``ld.global.cg``): a twin launched as a programmatic dependent reads what an earlier kernel
    may write that way (load_dep), so that the loads stay after its wait."""
    out = {}
    for key, body in function_bodies(text).items():
        meta = decode_twin_name(key[1])
        if meta is not None:
            out[key] = (meta, len(_ANY_LOAD.findall(body)),
                        len(_READONLY_LOAD.findall(body)) + len(_ORDERED_LOAD.findall(body)))
    return out

