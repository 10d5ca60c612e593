"""Reading ``cuobjdump -elf`` output: per device module (one cubin per translation unit and
architecture), the kernels it holds, whether it has a user ``__constant__`` bank, and which of
kvprefetch's device-state symbols (the prologue's address table and mode) it defines.

Why verify-kernel looks at this and not only at the kernels' instructions: on the H200, kernels
whose SASS was identical to stock ran 0.5-1% slower on short steps when their module also held a
user constant bank (the prologue's mode, then a ``__constant__``), measured against an A/A
rebuild of stock in every run (docs/prefetch-tuning.md, finding 4). So the rule is: no more
modules with a constant bank than stock has, and the prologue's state only in modules that hold
a kernel the variant prefetches in."""

from __future__ import annotations

import re
from dataclasses import dataclass

_MODULE = re.compile(r"^Fatbin elf code:\s*$", re.M)
_ARCH = re.compile(r"^arch = (sm_\d+\w*)\s*$", re.M)
_KERNEL = re.compile(r"\s\.text\.(\S+)\s*$", re.M)          # section names; not .rela.text.
_CONST_BANK = re.compile(r"\s\.nv\.constant3\s*$", re.M)      # user __constant__ variables
_STATE = re.compile(r"\S*kvprefetch_(?:bases|mode)E\b")      # the prologue's device state


@dataclass(frozen=True)
class Module:
    arch: str
    kernels: tuple[str, ...]         # mangled names
    constant_bank: bool
    state_symbols: tuple[str, ...]   # mangled names of kvprefetch_bases / kvprefetch_mode

    @property
    def holds_state(self) -> bool:
        return bool(self.state_symbols)


def parse_elf(text: str) -> list[Module]:
    """The modules of a ``cuobjdump -elf`` listing (a library, a fatbin or a cubin)."""
    chunks = _MODULE.split(text)[1:]
    out = []
    for chunk in chunks:
        arch = _ARCH.search(chunk)
        out.append(Module(arch.group(1) if arch else "?",
                          tuple(sorted(set(_KERNEL.findall(chunk)))),
                          bool(_CONST_BANK.search(chunk)),
                          tuple(sorted(set(_STATE.findall(chunk))))))
    return out
