"""Reading ``cuobjdump -elf`` output: per device module (one cubin per translation unit and
architecture), the kernels it holds, whether it has a user ``__constant__`` bank, which of
kvprefetch's device-state symbols (the prologue's address table and mode) it defines, and which
kernels were declared with ``__launch_bounds__`` (their ``EIATTR_MAX_THREADS``).

Why verify-kernel looks at this and not only at the kernels' instructions: on the H200, kernels
whose SASS was identical to stock ran 0.5-1% slower on short steps when their module also held a
user constant bank (the prologue's mode, then a ``__constant__``), measured against an A/A
rebuild of stock in every run (docs/tuning-log.md, finding 4). So the rule is: no more
modules with a constant bank than stock has, and the prologue's state only in modules that hold
a kernel the variant prefetches in."""

from __future__ import annotations

import re
from dataclasses import dataclass

_MODULE = re.compile(r"^Fatbin elf code:\s*$", re.MULTILINE)
_ARCH = re.compile(r"^arch = (sm_\d+\w*)\s*$", re.MULTILINE)
_KERNEL = re.compile(r"\s\.text\.(\S+)\s*$", re.MULTILINE)          # section names; not .rela.text.
_CONST_BANK = re.compile(r"\s\.nv\.constant3\s*$", re.MULTILINE)      # user __constant__ variables
_STATE = re.compile(r"\S*kvprefetch_(?:bases|mode)E\b")      # the prologue's device state
_INFO = re.compile(r"^\.nv\.info\.(\S+)\s*$", re.MULTILINE)  # a kernel's attribute section
# at most 16 hex digits (64 bits): a longer one, printed, was past Python's limit on digits
_MAX_THREADS = re.compile(r"EIATTR_MAX_THREADS\s*\n\s*Format:[^\n]*\n\s*Value:\s*"
                          r"(0x[0-9a-f]{1,16})\b")


@dataclass(frozen=True)
class Module:
    arch: str
    kernels: tuple[str, ...]         # mangled names
    constant_bank: bool
    state_symbols: tuple[str, ...]   # mangled names of kvprefetch_bases / kvprefetch_mode
    # (kernel, x of its __launch_bounds__ maxThreadsPerBlock) for the kernels declared with one
    max_threads: tuple[tuple[str, int], ...] = ()

    @property
    def holds_state(self) -> bool:
        return bool(self.state_symbols)


def _max_threads(chunk: str) -> tuple[tuple[str, int], ...]:
    """Per ``.nv.info.<kernel>`` section (up to the next top-level line), its EIATTR_MAX_THREADS."""
    heads = list(_INFO.finditer(chunk))
    out = []
    for i, head in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(chunk)
        nxt = re.search(r"^\.", chunk[head.end():end], re.MULTILINE)
        body = chunk[head.end(): head.end() + nxt.start()] if nxt else chunk[head.end():end]
        m = _MAX_THREADS.search(body)
        if m:
            out.append((head.group(1), int(m.group(1), 16)))
    return tuple(sorted(out))


def _state_symbols(chunk: str) -> list[str]:
    r"""``_STATE.findall(chunk)``, searched only in the lines that hold ``kvprefetch_`` (a match
    never spans lines: ``\S`` excludes the newline). Over the whole listing, the leading ``\S*``
    was retried from every position of every long token: 4.8 s of a 55 MB listing."""
    out: list[str] = []
    at = chunk.find("kvprefetch_")
    while at >= 0:
        start = chunk.rfind("\n", 0, at) + 1
        end = chunk.find("\n", at)
        end = len(chunk) if end < 0 else end
        out += _STATE.findall(chunk, start, end)
        at = chunk.find("kvprefetch_", end)
    return out


def parse_elf(text: str) -> list[Module]:
    """The modules of a ``cuobjdump -elf`` listing (a library, a fatbin or a cubin)."""
    chunks = _MODULE.split(text)[1:]
    out = []
    for chunk in chunks:
        arch = _ARCH.search(chunk)
        out.append(Module(arch.group(1) if arch else "?",
                          tuple(sorted(set(_KERNEL.findall(chunk)))),
                          bool(_CONST_BANK.search(chunk)),
                          tuple(sorted(set(_state_symbols(chunk)))),
                          _max_threads(chunk)))
    return out
