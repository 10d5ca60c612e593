"""VirtualKVCache's logic against ``FakeVmmDriver``.

The fake stands in for the CUDA driver only (there is no GPU in CI); everything above it (slots,
pages, pool, worker thread, reclamation, teardown) is the real code. The fake is stricter than the
driver: it refuses unaligned or overlapping maps, unmaps that do not match a mapping, releasing a
mapped handle, freeing a range with mappings, calls from a thread with no context, and two
threads changing mappings at the same time. The same behaviours run on the H200 with the real
driver in test_vmm_gpu.py."""

from __future__ import annotations

import threading

import pytest

from kvprefetch.vmm import KVCacheSpec, Layout, VirtualKVCache
from kvprefetch.vmm.errors import VmmDriverError, VmmOutOfMemory, VmmUsageError
from kvprefetch.vmm.fake import FakeVmmDriver
from kvprefetch.vmm.selftest import run_stress

MiB = 1 << 20
GROUP_PL = 4 * 2 * MiB  # per-layer, 2 layers: 4 pages per group


def spec(layout: Layout = Layout.PER_LAYER, batch: int = 4, context: int = 8192,
         layers: int = 2) -> KVCacheSpec:
    return KVCacheSpec(num_layers=layers, num_kv_heads=8, head_dim=128, max_batch=batch,
                       max_context=context, layout=layout)


def make(fake: FakeVmmDriver | None = None, **kw: object) -> tuple[VirtualKVCache, FakeVmmDriver]:
    fake = fake or FakeVmmDriver()
    sp = kw.pop("spec", None) or spec()
    return VirtualKVCache(sp, driver=fake, **kw), fake  # type: ignore[arg-type]


def expected_mappings(cache: VirtualKVCache) -> set[int]:
    g = cache.geometry
    out = set()
    for slot, groups in enumerate(cache.stats().slot_groups):
        for grp in range(groups):
            for t in range(g.n_tensors):
                out.add(cache.tensor_address(t) + g.group_offset(slot, grp))
    return out


def assert_consistent(cache: VirtualKVCache, fake: FakeVmmDriver) -> None:
    """The driver holds exactly the pages the cache's bookkeeping says, all accessible, and every
    live handle is either mapped or in the pool."""
    cache.wait()
    want = expected_mappings(cache)
    assert set(fake.mappings) == want
    assert all(fake.is_accessible(va) for va in want)
    st = cache.stats()
    assert len(fake.handles) == st.pool_pages == st.mapped_pages + st.pool_free_pages


def test_init_reserves_one_range_per_tensor_and_maps_nothing() -> None:
    cache, fake = make()
    assert fake.live() == {"reservations": 4, "handles": 0, "mappings": 0}
    st = cache.stats()
    assert st.pool_bytes == 0 and st.va_reserved_bytes == 4 * 4 * 8192 * 2048
    slicing, fake2 = make(spec=spec(Layout.TENSOR_SLICING))
    assert fake2.live()["reservations"] == 2
    cache.teardown()
    slicing.teardown()


def test_physical_memory_is_committed_only_as_contexts_grow() -> None:
    cache, fake = make(async_mapping=False, eager_groups=0)
    a, b = cache.alloc_reqid(), cache.alloc_reqid()
    seen = []
    for n in (1, 1000, 1024, 1025, 3000, 8192):
        cache.step({a: n, b: n // 2})
        seen.append(fake.committed_bytes())
        groups = -(-n * 2048 // (2 * MiB)) + -(-(n // 2) * 2048 // (2 * MiB))
        assert fake.committed_bytes() == groups * GROUP_PL
    assert seen == sorted(seen) and seen[0] < seen[-1]
    assert_consistent(cache, fake)
    cache.teardown()


def test_deferred_reclamation_reuses_pages_without_driver_calls() -> None:
    cache, fake = make(async_mapping=False, eager_groups=0)
    a = cache.alloc_reqid()
    cache.step({a: 3000})
    cache.free_reqid(a)
    assert cache.slot(a).mapped_groups == 3               # kept
    n_calls = len(fake.calls)
    b = cache.alloc_reqid(prompt_len=2500)
    assert b == a
    r = cache.step({b: 2500})
    assert r.sync_groups == 0 and len(fake.calls) == n_calls
    cache.teardown()


def test_non_deferred_free_unmaps_into_the_pool_and_reuses_handles() -> None:
    cache, fake = make(async_mapping=False, eager_groups=0, deferred_reclaim=False)
    a = cache.alloc_reqid()
    cache.step({a: 3000})
    cache.free_reqid(a)
    st = cache.stats()
    assert st.slot_groups[a] == 0 and st.pool_free_pages == 12 and not fake.mappings
    assert fake.sync_count >= 1                           # synchronized before unmapping
    b = cache.alloc_reqid()
    creates = fake.calls.count("create")
    cache.step({b: 3000})
    assert fake.calls.count("create") == creates          # handles came from the pool
    assert_consistent(cache, fake)
    cache.teardown()


def test_eager_allocation_keeps_the_next_slot_warm() -> None:
    cache, _ = make(eager_groups=1)
    a = cache.alloc_reqid()
    cache.step({a: 10})
    cache.wait()
    warm = cache.stats().slot_groups
    assert warm[a] == 1 and sum(warm) == 2                # slot a, plus one warm slot
    b = cache.alloc_reqid()
    assert warm[b] == 1
    r = cache.step({a: 11, b: 900})                       # a prompt that fits the warm page
    assert r.sync_groups == 0
    cache.teardown()


@pytest.mark.parametrize("layout", list(Layout))
def test_async_worker_takes_decode_mapping_off_the_critical_path(layout: Layout) -> None:
    cache, fake = make(spec=spec(layout), eager_groups=0)
    sync, _ = make(spec=spec(layout), eager_groups=0, async_mapping=False)
    tpp = cache.geometry.page_size // cache.geometry.token_bytes
    a, s = cache.alloc_reqid(), sync.alloc_reqid()
    cache.step({a: 1})
    sync.step({s: 1})
    crossings_sync = 0
    for n in range(2, 3 * tpp + 3):
        assert cache.step({a: n}).sync_groups == 0, f"async step at {n} mapped synchronously"
        got = sync.step({s: n}).sync_groups
        assert got == (1 if (n - 1) % tpp == 0 else 0)
        crossings_sync += got
    assert crossings_sync == 3
    assert threading.get_ident() not in {cache._worker.thread_ident}  # type: ignore[union-attr]
    assert cache._worker.thread_ident in fake.bound_threads  # type: ignore[union-attr]
    assert_consistent(cache, fake)
    cache.teardown()
    sync.teardown()


def test_out_of_memory_is_an_error_the_scheduler_can_act_on() -> None:
    cache, fake = make(physical_budget_bytes=2 * GROUP_PL, eager_groups=0, async_mapping=False)
    a, b = cache.alloc_reqid(), cache.alloc_reqid()
    cache.step({a: 2048})
    with pytest.raises(VmmOutOfMemory) as ei:
        cache.step({a: 2048, b: 1})
    assert ei.value.short == {b: 1} and "To fix:" in str(ei.value)
    assert cache.slot(a).mapped_groups == 2               # a kept everything
    assert_consistent(cache, fake)
    cache.free_reqid(a)                                   # the scheduler preempts a
    creates = fake.calls.count("create")
    cache.step({b: 1})                                    # reclaims one of a's groups
    assert fake.calls.count("create") == creates
    assert cache.slot(b).mapped_groups == 1 and cache.slot(a).mapped_groups == 1
    assert cache.stats().counters["groups_reclaimed"] == 1
    assert_consistent(cache, fake)
    cache.teardown()
    assert fake.live() == {"reservations": 0, "handles": 0, "mappings": 0}


def test_device_out_of_memory_midway_keeps_partial_progress() -> None:
    fake = FakeVmmDriver(total_bytes=3 * GROUP_PL)
    cache, _ = make(fake, eager_groups=0, async_mapping=False)
    a = cache.alloc_reqid()
    with pytest.raises(VmmOutOfMemory) as ei:
        cache.step({a: 5 * 1024})
    assert ei.value.short == {a: 2}
    assert cache.slot(a).mapped_groups == 3
    assert_consistent(cache, fake)
    cache.step({a: 3 * 1024})                             # what fits still works
    cache.teardown()
    assert fake.live() == {"reservations": 0, "handles": 0, "mappings": 0}


def test_bad_input_gives_clear_errors_and_changes_nothing() -> None:
    cache, fake = make()
    a = cache.alloc_reqid()
    cache.step({a: 100})
    cache.wait()
    before = (cache.stats().slot_groups, dict(fake.mappings), cache.slot(a))
    cases = [
        (lambda: cache.step({a: 8193}), "beyond the cache's S_max=8192"),
        (lambda: cache.step({a: 50, 7: 1}), "unknown slot 7"),
        (lambda: cache.step({a: 50, 2: 1}), "slot 2 is not allocated"),
        (lambda: cache.step([1, 2]), "4 slots"),
        (lambda: cache.free_reqid(3), "double free"),
        (lambda: cache.free_reqid(-1), "unknown slot"),
        (lambda: cache.alloc_reqid(prompt_len=10**6), "beyond"),
        (lambda: cache.key(0), "exposes no tensors"),
    ]
    for call, msg in cases:
        with pytest.raises(VmmUsageError, match=msg):
            call()
        cache.wait()
        assert (cache.stats().slot_groups, dict(fake.mappings), cache.slot(a)) == before
    cache.free_reqid(a)
    with pytest.raises(VmmUsageError, match="double free"):
        cache.free_reqid(a)
    b = cache.alloc_reqid()
    cache.step({b: 2000})                                 # still usable
    assert_consistent(cache, fake)
    cache.teardown()


def test_driver_error_in_the_middle_of_a_group_rolls_the_group_back() -> None:
    cache, fake = make(async_mapping=False, eager_groups=0)
    a = cache.alloc_reqid()
    cache.step({a: 1024})
    fake.inject("map", 1, after=6)                        # 2nd group ok, 3rd group's 3rd page
    with pytest.raises(VmmDriverError):
        cache.step({a: 3 * 1024})
    assert cache.slot(a).mapped_groups == 2
    assert_consistent(cache, fake)
    cache.step({a: 3 * 1024})
    assert cache.slot(a).mapped_groups == 3
    cache.teardown()
    assert fake.live() == {"reservations": 0, "handles": 0, "mappings": 0}


def test_batched_set_access_falls_back_to_per_page() -> None:
    cache, fake = make(async_mapping=False, eager_groups=0)
    a = cache.alloc_reqid()
    fake.inject("set_access", 1)
    cache.step({a: 4000})
    assert cache.stats().counters["set_access_fallbacks"] == 1
    assert_consistent(cache, fake)
    cache.teardown()


def test_teardown_unmaps_then_releases_then_frees_and_leaks_nothing() -> None:
    cache, fake = make()
    ids = [cache.alloc_reqid() for _ in range(3)]
    cache.step({ids[0]: 5000, ids[1]: 100, ids[2]: 2049})
    cache.free_reqid(ids[1])
    cache.step({ids[0]: 5001})
    cache.wait()
    st = cache.stats()
    start = len(fake.calls)
    cache.teardown()
    calls = fake.calls[start:]
    assert "map" not in calls and "create" not in calls
    last_unmap = max(i for i, c in enumerate(calls) if c == "unmap")
    first_release = calls.index("release")
    last_release = max(i for i, c in enumerate(calls) if c == "release")
    first_free = calls.index("free_va")
    assert last_unmap < first_release and last_release < first_free
    assert calls.count("unmap") == st.mapped_pages
    assert calls.count("release") == st.pool_pages
    assert calls.count("free_va") == 4
    assert fake.live() == {"reservations": 0, "handles": 0, "mappings": 0} and fake.closed
    c = cache.stats().counters
    assert c["pages_created"] == c["pages_released"] and c["pages_mapped"] == c["pages_unmapped"]
    cache.teardown()                                      # idempotent
    with pytest.raises(VmmUsageError, match="torn down"):
        cache.step({})
    with pytest.raises(VmmUsageError, match="torn down"):
        cache.alloc_reqid()


def test_threshold_reclamation_returns_inactive_pages_to_the_device() -> None:
    fake = FakeVmmDriver(total_bytes=40 * GROUP_PL)
    cache, _ = make(fake, reclaim_threshold_bytes=34 * GROUP_PL, eager_groups=1)
    a, b = cache.alloc_reqid(), cache.alloc_reqid()
    cache.step({a: 4096, b: 4096})                        # 8 groups
    cache.free_reqid(b)
    cache.step({a: 4097})                                 # worker: free memory < threshold
    cache.wait()
    st = cache.stats()
    assert st.counters["threshold_reclaims"] >= 1
    warm = [s for s in range(4) if s != a and st.slot_groups[s]]
    assert st.slot_groups[a] == 5 and [st.slot_groups[s] for s in warm] == [1]
    assert st.pool_free_pages == 0 and st.pool_pages == 6 * 4  # the rest went back
    assert_consistent(cache, fake)
    cache.teardown()


def test_explicit_reclaim() -> None:
    cache, fake = make(eager_groups=0)
    a, b = cache.alloc_reqid(), cache.alloc_reqid()
    cache.step({a: 3000, b: 3000})
    cache.free_reqid(a)
    assert cache.reclaim() == 3
    assert cache.stats().pool_pages == 3 * 4
    assert_consistent(cache, fake)
    cache.teardown()


def test_the_race_detector_can_fail() -> None:
    # Negative control for the overlap check every other test relies on: two threads mapping
    # at the same time must trip it.
    fake = FakeVmmDriver(overlap_sleep_s=0.05)
    va = (fake.bind_thread(), fake.reserve(8 * MiB, 2 * MiB))[1]
    h1, h2 = fake.create(2 * MiB), fake.create(2 * MiB)
    errors: list[BaseException] = []

    def other() -> None:
        fake.bind_thread()
        try:
            fake.map(va + 2 * MiB, 2 * MiB, h2)
        except (AssertionError, VmmDriverError) as exc:
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    try:
        fake.map(va, 2 * MiB, h1)
    except AssertionError as exc:
        errors.append(exc)
    t.join()
    assert any("overlaps a mutating call" in str(e) for e in errors)


def test_unbound_threads_are_refused_by_the_fake() -> None:
    fake = FakeVmmDriver()
    out: list[BaseException] = []
    t = threading.Thread(target=lambda: out.append(_try(lambda: fake.create(2 * MiB))))
    t.start()
    t.join()
    assert isinstance(out[0], VmmDriverError) and "INVALID_CONTEXT" in str(out[0])


def _try(fn):  # type: ignore[no-untyped-def]
    try:
        fn()
    except VmmDriverError as exc:
        return exc
    return None


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("async_mapping", [True, False])
def test_randomized_stress_ends_with_nothing_leaked(layout: Layout, async_mapping: bool) -> None:
    fake = FakeVmmDriver(overlap_sleep_s=2e-5)
    sp = spec(layout, batch=8)
    from kvprefetch.vmm.layout import make_geometry

    g = make_geometry(sp, 2 * MiB)
    budget = (3 * 8 * g.pages_per_slot // 8) * g.group_bytes  # 3/8 of what 8 full slots need
    cache, _ = make(fake, spec=sp, async_mapping=async_mapping,
                    physical_budget_bytes=budget)
    checks = []

    def check() -> None:
        assert_consistent(cache, fake)
        checks.append(1)

    report = run_stress(cache, 2500, seed=7, on_check=check, check_every=100)
    assert report.steps > 1500 and report.admitted > 100 and report.finished > 100
    assert report.oom_errors > 0 and report.preempted == report.oom_errors
    assert len(checks) >= 25
    cache.teardown()
    assert fake.live() == {"reservations": 0, "handles": 0, "mappings": 0}
    c = cache.stats().counters
    assert c["pages_created"] == c["pages_released"] and c["pages_mapped"] == c["pages_unmapped"]
