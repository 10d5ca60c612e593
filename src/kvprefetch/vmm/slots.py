"""Slot bookkeeping and the mapping/reclaim plans: pure logic, no CUDA, unit-tested on CPU.

A *slot* is one batch row of the virtual tensors (vAttention's ``reqId``). Its state is
(active, seq_len, mapped), where ``mapped`` is the number of page groups mapped as a prefix.

Policies (vAttention §6.1-6.2, with the defects noted in research/ fixed):
- ``free`` only deactivates: the slot keeps its pages (deferred reclamation), so the next request
  placed there needs no driver call for the pages it already has.
- ``pick_free`` places a request on the free slot that already holds enough groups with the least
  excess (best fit), else on the free slot holding the most; ties go to the lowest index. The slot
  it would pick with no hint is the *warm slot*, which eager allocation keeps mapped.
- ``plan_reclaim`` takes groups from the tail of inactive slots, the slots holding the most first,
  and never below what a protected (warm) slot must keep.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .errors import VmmUsageError
from .layout import CacheGeometry, check_context


@dataclass
class SlotState:
    active: bool = False
    seq_len: int = 0
    mapped: int = 0        # page groups mapped, always the prefix [0, mapped)
    request: int = -1      # serial number of the request that holds/held it


@dataclass(frozen=True)
class SlotView:
    """A read-only copy of one slot's state."""

    slot: int
    active: bool
    seq_len: int
    mapped_groups: int
    request: int


class SlotTable:
    """The slots of one cache. Not thread-safe by itself: the cache holds its lock around calls."""

    def __init__(self, max_batch: int, pages_per_slot: int) -> None:
        self.max_batch = max_batch
        self.pages_per_slot = pages_per_slot
        self._slots = [SlotState() for _ in range(max_batch)]
        self._serial = 0

    # ---- queries -----------------------------------------------------------------------------
    def check_slot(self, slot: object) -> int:
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self.max_batch:
            raise VmmUsageError(
                f"unknown slot {slot!r}: slots are integers 0..{self.max_batch - 1}",
                "pass a slot id that alloc_reqid() returned",
            )
        return slot

    def __getitem__(self, slot: int) -> SlotState:
        return self._slots[self.check_slot(slot)]

    def view(self, slot: int) -> SlotView:
        s = self[slot]
        return SlotView(slot, s.active, s.seq_len, s.mapped, s.request)

    def active_slots(self) -> list[int]:
        return [i for i, s in enumerate(self._slots) if s.active]

    def inactive_mapped(self) -> dict[int, int]:
        return {i: s.mapped for i, s in enumerate(self._slots) if not s.active and s.mapped}

    def mapped_groups(self) -> int:
        return sum(s.mapped for s in self._slots)

    def pick_free(self, need_groups: int | None = None) -> int | None:
        free = [(i, s.mapped) for i, s in enumerate(self._slots) if not s.active]
        if not free:
            return None
        if need_groups is not None:
            fits = [(m, i) for i, m in free if m >= need_groups]
            if fits:
                return min(fits)[1]
        return min(free, key=lambda im: (-im[1], im[0]))[0]

    def warm_slot(self) -> int | None:
        """The slot the next ``alloc()`` without a hint will return."""
        return self.pick_free(None)

    # ---- transitions -------------------------------------------------------------------------
    def alloc(self, need_groups: int | None = None) -> int:
        slot = self.pick_free(need_groups)
        if slot is None:
            raise VmmUsageError(
                f"all {self.max_batch} slots are in use",
                "free a finished request with free_reqid(), or init the cache with a larger "
                "max_batch",
            )
        s = self._slots[slot]
        s.active, s.seq_len, s.request = True, 0, self._serial
        self._serial += 1
        return slot

    def free(self, slot: int) -> None:
        s = self[slot]
        if not s.active:
            raise VmmUsageError(
                f"slot {slot} is not allocated (double free, or never allocated)",
                "call free_reqid() exactly once per id returned by alloc_reqid()",
            )
        s.active, s.seq_len = False, 0

    def set_mapped(self, slot: int, groups: int) -> None:
        if not 0 <= groups <= self.pages_per_slot:
            raise VmmUsageError(f"slot {slot}: {groups} groups is outside 0..{self.pages_per_slot}",
                                "this is a bug in the cache's bookkeeping")
        self[slot].mapped = groups


# ---- plans -----------------------------------------------------------------------------------
def parse_seq_lens(table: SlotTable, geom: CacheGeometry,
                   seq_lens: Mapping[int, int] | Sequence[int]) -> dict[int, int]:
    """Validate a step's sequence lengths *before anything changes* and return
    ``{active slot: tokens}`` for every active slot.

    A mapping names some slots (the others keep their length). A sequence must have one entry per
    slot, vAttention style, with 0 for every slot that is not allocated."""
    out = {i: table[i].seq_len for i in table.active_slots()}
    if isinstance(seq_lens, Mapping):
        items = list(seq_lens.items())
    else:
        items = list(enumerate(seq_lens))
        if len(items) != table.max_batch:
            raise VmmUsageError(
                f"seq_lens has {len(items)} entries but the cache has {table.max_batch} slots",
                "pass one length per slot (0 for free slots), or a {slot: length} mapping",
            )
    for slot, tokens in items:
        table.check_slot(slot)
        check_context(geom, tokens)
        if not table[slot].active:
            if tokens:
                raise VmmUsageError(
                    f"slot {slot} is not allocated but was given {tokens} tokens",
                    "call alloc_reqid() first, or pass 0 for free slots",
                )
            continue
        out[slot] = tokens
    return out


def plan_now(table: SlotTable, geom: CacheGeometry, lens: Mapping[int, int]) -> dict[int, int]:
    """slot -> groups it must hold before this step's kernels run (only slots that are short)."""
    plan = {}
    for slot, tokens in lens.items():
        need = geom.groups_for_tokens(tokens)
        if need > table[slot].mapped:
            plan[slot] = need
    return plan


def plan_ahead(table: SlotTable, geom: CacheGeometry, lookahead_tokens: int,
               eager_groups: int) -> dict[int, int]:
    """What the worker maps while the current step computes: every active slot grown by
    ``lookahead_tokens`` (one decode token by default), and the warm slot up to ``eager_groups``."""
    plan: dict[int, int] = {}
    for slot in table.active_slots():
        s = table[slot]
        need = geom.groups_for_tokens(min(geom.spec.max_context, s.seq_len + lookahead_tokens))
        if need > s.mapped:
            plan[slot] = need
    warm = table.warm_slot()
    if warm is not None and eager_groups > table[warm].mapped:
        plan[warm] = min(eager_groups, geom.pages_per_slot)
    return plan


def plan_reclaim(inactive_mapped: Mapping[int, int], need_groups: int | None,
                 keep: Mapping[int, int] | None = None) -> dict[int, int]:
    """slot -> new (smaller) mapped count, freeing at least ``need_groups`` groups if possible
    (all reclaimable groups when ``need_groups`` is None). ``keep[slot]`` groups are never taken."""
    keep = keep or {}
    order = sorted(inactive_mapped.items(), key=lambda sm: (-sm[1], -sm[0]))
    plan: dict[int, int] = {}
    freed = 0
    for slot, mapped in order:
        if need_groups is not None and freed >= need_groups:
            break
        floor = min(mapped, max(0, keep.get(slot, 0)))
        take = mapped - floor
        if need_groups is not None:
            take = min(take, need_groups - freed)
        if take > 0:
            plan[slot] = mapped - take
            freed += take
    return plan


def should_reclaim(free_bytes: int, threshold_bytes: int) -> bool:
    """Reclaim when the device's free memory falls below the threshold (0 disables it)."""
    return threshold_bytes > 0 and free_bytes < threshold_bytes
