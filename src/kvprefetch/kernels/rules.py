"""The kernel rules' numbers, read from the one table the C++ includes.

``csrc/kvprefetch/rules.inc`` is an X-macro table: the CUDA headers include it to build their
constants (the GQA twins, the v1 launch bounds, the thresholds), and this module parses the same
file, so a rule changed there changes both sides. The Python statement of the C++ decisions
(``kernels.policy``: which instantiations change, which twin a grid runs, the ring's slots)
reads its numbers from here; tests compile the C++ logic into a host program and check that
both sides agree. Parsing is pure and happens once, at first use."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, fields
from pathlib import Path

RULES_FILE = "rules.inc"
_ENTRY = re.compile(r"^KVP_(TWIN_AT|TWIN|V1_MIN_BLOCKS|RULE)\((.*)\)\s*$")
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


@dataclass(frozen=True)
class Twin:
    """One GQA-grouped twin: G query heads and S times stock's threads per CTA; `auto` runs the
    first twin whose ``min_ctas_pct`` (stock CTAs per 100 SMs) the grid reaches."""

    group: int
    split: int
    min_ctas_pct: int
    name: str


@dataclass(frozen=True)
class KernelRules:
    """Every entry of rules.inc: the twins in `auto`'s order, the (head size, block size, v1
    too) triples they are compiled beside, the v1 launch bounds by head size, and the named
    integers (KVP_RULE ``kFooBar`` is the field ``foo_bar``)."""

    twins: tuple[Twin, ...]
    twin_at: tuple[tuple[int, int, bool], ...]
    v1_min_blocks: tuple[tuple[int, int], ...]
    twin_least_cta_pct: int
    chain_link_pct: int
    empty_cta_pct: int
    rule_block_size: int
    prologue_min_head_size: int
    prologue_max_bf16_head_size: int
    prologue_max_k_registers: int
    twin_bound_threads: int
    staged_split: int
    stage_slots: int
    stage_max_warps: int
    fused_group: int
    fused_split: int
    smem_system_bytes: int
    smem_static_bytes: int
    l2_blocks_per_cta: int
    auto_l2_divisor: int
    l2_min_chunk_bytes: int
    prologue_rounds: int
    base_slots: int
    auto_max_ctas_pct: int
    auto_max_issuing_pct: int

    def min_blocks_for(self, head_size: int) -> int:
        return dict(self.v1_min_blocks).get(head_size, 0)


def _field_name(macro_name: str) -> str:
    """``kPrologueMinHeadSize`` -> ``prologue_min_head_size``."""
    return _CAMEL.sub("_", macro_name.removeprefix("k")).lower()


def _literal(text: str) -> int | str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    return int(text, 0)


def parse_rules(text: str) -> KernelRules:
    """The table in ``text`` (rules.inc's content). Every line ``KVP_<KIND>(literals)`` at the
    start of a line is an entry; everything else (comments, the macros' defaults) is skipped.
    An unknown or missing rule is a ValueError, so the two sides cannot drift apart silently."""
    twins: list[Twin] = []
    twin_at: list[tuple[int, int, bool]] = []
    bounds: list[tuple[int, int]] = []
    named: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _ENTRY.match(line.strip())
        if m is None:
            continue
        kind, args = m.group(1), m.group(2).split(",")
        if kind == "RULE":
            name, value = args[0].strip(), _literal(args[1])
            if not isinstance(value, int):
                raise ValueError(f"{RULES_FILE}:{lineno}: {name} is not an integer")
            named[_field_name(name)] = value
            continue
        values = [_literal(a) for a in args]
        if kind == "TWIN":
            g, s, pct, label = values
            twins.append(Twin(int(g), int(s), int(pct), str(label)))
        elif kind == "TWIN_AT":
            head, block, v1 = values
            twin_at.append((int(head), int(block), bool(v1)))
        else:
            head, n = values
            bounds.append((int(head), int(n)))
    wanted = {f.name for f in fields(KernelRules)} - {"twins", "twin_at", "v1_min_blocks"}
    if set(named) != wanted:
        raise ValueError(f"{RULES_FILE}: rules {sorted(set(named) ^ wanted)} do not match "
                         "kvprefetch.kernels.rules.KernelRules")
    if not twins:
        raise ValueError(f"{RULES_FILE}: no KVP_TWIN entry")
    if not twin_at:
        raise ValueError(f"{RULES_FILE}: no KVP_TWIN_AT entry")
    return KernelRules(twins=tuple(twins), twin_at=tuple(twin_at), v1_min_blocks=tuple(bounds),
                       **named)


def rules_path() -> Path:
    """csrc/kvprefetch/rules.inc of this checkout, or of the copy shipped in the package,
    checked as the kit's headers are (``upstream.kit_headers``: a regular file of at most 1 MiB,
    never a symlink; a PatchError naming it otherwise)."""
    from .. import upstream

    return next(src for src, _ in upstream.kit_headers() if src.name == RULES_FILE)


@functools.cache
def rules() -> KernelRules:
    """The kit's own rules.inc, parsed once. A rules.inc that is not the kit's (altered by
    hand: empty, another table, not UTF-8, a FIFO, a link out) is one PatchError naming it
    (issue 41, the ninth hostile pass: a ValueError traceback, or "was not found" for a FIFO,
    from every command that imports the launch policy)."""
    from ..errors import PatchError
    from ..reading import read_limited

    path = rules_path()
    try:
        return parse_rules(read_limited(path, 1 << 20).decode("utf-8"))
    except (ValueError, OSError) as exc:  # UnicodeDecodeError is a ValueError
        why = (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)
        raise PatchError(f"the kit's rules table {path} cannot be read: {why[:300]}",
                         f"restore {path} from a kvprefetch checkout "
                         "(`git checkout -- csrc/kvprefetch/rules.inc`)") from None
