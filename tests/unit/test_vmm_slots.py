"""Slot bookkeeping and the mapping/reclaim plans (pure logic, no GPU, no mocks)."""

from __future__ import annotations

import pytest

from kvprefetch.vmm.errors import VmmUsageError
from kvprefetch.vmm.layout import KVCacheSpec, Layout, make_geometry
from kvprefetch.vmm.slots import (
    SlotTable,
    parse_seq_lens,
    plan_ahead,
    plan_now,
    plan_reclaim,
    should_reclaim,
)

MiB = 1 << 20


def geom(batch: int = 4, layout: Layout = Layout.PER_LAYER):  # type: ignore[no-untyped-def]
    return make_geometry(KVCacheSpec(2, 8, 128, batch, 8192, layout=layout), 2 * MiB)


def table(batch: int = 4) -> SlotTable:
    return SlotTable(batch, geom(batch).pages_per_slot)


def test_alloc_hands_out_distinct_slots_then_refuses() -> None:
    t = table(3)
    got = {t.alloc(), t.alloc(), t.alloc()}
    assert got == {0, 1, 2}
    with pytest.raises(VmmUsageError, match="all 3 slots are in use"):
        t.alloc()


def test_free_double_free_and_unknown_slots() -> None:
    t = table()
    s = t.alloc()
    t.free(s)
    with pytest.raises(VmmUsageError, match="double free"):
        t.free(s)
    for bad in (-1, 4, 10**6, "0", None, True):
        with pytest.raises(VmmUsageError, match="unknown slot"):
            t.free(bad)  # type: ignore[arg-type]
    with pytest.raises(VmmUsageError, match="double free"):
        t.free(2)  # exists but was never allocated


def test_deferred_reclamation_reuses_the_slot_holding_most_pages() -> None:
    t = table()
    a, b = t.alloc(), t.alloc()
    t.set_mapped(a, 3)
    t.set_mapped(b, 5)
    t.free(a)
    t.free(b)
    assert t[b].mapped == 5 and t[a].mapped == 3       # free keeps pages
    assert t.warm_slot() == b
    assert t.alloc() == b


def test_best_fit_with_a_prompt_hint() -> None:
    t = table()
    for s, m in zip(range(4), (6, 2, 4, 0), strict=True):
        t.alloc()
        t.set_mapped(s, m)
    for s in range(4):
        t.free(s)
    assert t.pick_free(3) == 2      # smallest that fits
    assert t.pick_free(2) == 1
    assert t.pick_free(7) == 0      # nothing fits: the largest
    assert t.pick_free(0) == 3


def test_parse_seq_lens_mapping_and_sequence_forms() -> None:
    g, t = geom(), table()
    a, b = t.alloc(), t.alloc()
    t[b].seq_len = 7
    assert parse_seq_lens(t, g, {a: 100}) == {a: 100, b: 7}  # b keeps its length
    assert parse_seq_lens(t, g, [5, 6, 0, 0]) == {a: 5, b: 6}
    with pytest.raises(VmmUsageError, match="4 slots"):
        parse_seq_lens(t, g, [1, 2])
    with pytest.raises(VmmUsageError, match="slot 2 is not allocated"):
        parse_seq_lens(t, g, {2: 10})
    with pytest.raises(VmmUsageError, match="slot 3 is not allocated"):
        parse_seq_lens(t, g, [1, 1, 0, 9])
    with pytest.raises(VmmUsageError, match="beyond the cache's S_max"):
        parse_seq_lens(t, g, {a: 8193})
    with pytest.raises(VmmUsageError, match="unknown slot"):
        parse_seq_lens(t, g, {9: 1})
    assert t[a].seq_len == 0 and t[b].seq_len == 7           # validation changed nothing


def test_plan_now_only_lists_short_slots() -> None:
    g, t = geom(), table()
    a, b = t.alloc(), t.alloc()
    t.set_mapped(a, 2)
    assert plan_now(t, g, {a: 2048, b: 1}) == {b: 1}
    assert plan_now(t, g, {a: 2049, b: 0}) == {a: 3}


def test_plan_ahead_maps_next_token_and_keeps_one_slot_warm() -> None:
    g, t = geom(), table()
    a = t.alloc()
    t[a].seq_len = 1024
    t.set_mapped(a, 1)
    plan = plan_ahead(t, g, lookahead_tokens=1, eager_groups=1)
    assert plan == {a: 2, 1: 1}                  # a crosses a page next token; slot 1 is warm
    t[a].seq_len = 1000
    assert plan_ahead(t, g, 1, 0) == {}          # no crossing and no eager allocation
    t[a].seq_len = 8192
    t.set_mapped(a, 8)
    assert a not in plan_ahead(t, g, 1, 0)       # never past S_max


def test_plan_reclaim_takes_from_the_tail_of_the_largest_inactive_slots() -> None:
    assert plan_reclaim({1: 3, 2: 5, 3: 1}, 4) == {2: 1}
    assert plan_reclaim({1: 3, 2: 5, 3: 1}, 7) == {2: 0, 1: 1}
    assert plan_reclaim({1: 3, 2: 5}, None) == {2: 0, 1: 0}
    assert plan_reclaim({1: 3, 2: 5}, None, keep={2: 1}) == {2: 1, 1: 0}
    assert plan_reclaim({1: 3}, 10) == {1: 0}    # frees what it can
    assert plan_reclaim({}, 3) == {}
    assert plan_reclaim({4: 2, 7: 2}, 1) == {7: 1}  # ties: the highest slot first


def test_should_reclaim_threshold() -> None:
    assert should_reclaim(1 << 30, 2 << 30)
    assert not should_reclaim(3 << 30, 2 << 30)
    assert not should_reclaim(0, 0)              # threshold 0 disables it


def test_set_mapped_bounds() -> None:
    t = table()
    with pytest.raises(VmmUsageError):
        t.set_mapped(0, t.pages_per_slot + 1)
    t.set_mapped(0, t.pages_per_slot)
    assert t.view(0).mapped_groups == t.pages_per_slot
