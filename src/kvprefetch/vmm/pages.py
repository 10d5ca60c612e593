"""The page-mapping mechanics of ``VirtualKVCache``: the handle pool, growing a slot by page
groups, access rights, shrinking a slot, reclaiming inactive slots and releasing the pool.

Every method here changes mappings, so the caller guarantees exclusivity (see ``worker.py``): it
runs either as the worker's job or on the caller's thread while no job runs. Bookkeeping shared
with ``alloc``/``free`` is updated under ``self._lock``. A failed grow commits exactly the groups
that were fully mapped with access set, rolls back a half-mapped group, and returns unused handles
to the pool, so the bookkeeping always matches the driver."""

from __future__ import annotations

import threading
import time
from typing import Any

from .driver import VmmDriver
from .errors import VmmError, VmmOutOfMemory
from .layout import CacheGeometry, ceil_div
from .slots import SlotTable, plan_reclaim
from .stats import LatencyHistogram


class PageMapping:
    """Mixin holding the mapping state; ``VirtualKVCache`` sets these attributes up."""

    geometry: CacheGeometry
    eager_groups: int
    counters: dict[str, int]
    hist: dict[str, LatencyHistogram]
    _driver: VmmDriver
    _lock: threading.RLock
    _table: SlotTable
    _handles: dict[tuple[int, int], list[Any]]
    _pool: list[Any]
    _created: int
    _budget_pages: int | None
    _batch_access: bool
    _va: list[int]

    def _take_handles(self, n: int, protect: int, reclaim: bool) -> list[Any]:
        taken: list[Any] = []
        try:
            while len(taken) < n:
                with self._lock:
                    if self._pool:
                        taken.append(self._pool.pop())
                        continue
                    over_budget = (self._budget_pages is not None
                                   and self._created >= self._budget_pages)
                try:
                    if over_budget:
                        pages = self._budget_pages or 0
                        raise VmmOutOfMemory(
                            f"the physical budget of {pages} pages "
                            f"({pages * self.geometry.page_size} B) is used up")
                    t0 = time.perf_counter()
                    h = self._driver.create(self.geometry.page_size)
                    self.hist["create"].record(time.perf_counter() - t0)
                    with self._lock:
                        self._created += 1
                        self.counters["pages_created"] += 1
                    taken.append(h)
                except VmmOutOfMemory:
                    missing = ceil_div(n - len(taken), self.geometry.n_tensors)
                    if not reclaim or not self._reclaim(missing, protect=protect):
                        raise
        except BaseException:
            with self._lock:
                self._pool.extend(taken)
            raise
        return taken

    def _grow(self, slot: int, target: int, reclaim: bool) -> None:
        g = self.geometry
        start = self._table[slot].mapped
        done: list[list[Any]] = []
        err: BaseException | None = None
        for group in range(start, target):
            try:
                hs = self._take_handles(g.n_tensors, protect=slot, reclaim=reclaim)
            except BaseException as exc:  # noqa: BLE001 - collected or re-raised
                err = exc
                break
            try:
                self._map_group(slot, group, hs)
            except BaseException as exc:  # noqa: BLE001 - collected or re-raised
                with self._lock:
                    self._pool.extend(hs)
                err = exc
                break
            done.append(hs)
        if done:
            try:
                self._set_access(slot, start, start + len(done))
            except BaseException as exc:  # noqa: BLE001 - collected or re-raised
                for i in reversed(range(len(done))):
                    self._unmap_group(slot, start + i, done[i])
                done = []
                err = err or exc
        with self._lock:
            for i, hs in enumerate(done):
                self._handles[(slot, start + i)] = hs
            self._table.set_mapped(slot, start + len(done))
        if err is not None:
            raise err

    def _map_group(self, slot: int, group: int, hs: list[Any]) -> None:
        page = self.geometry.page_size
        off = self.geometry.group_offset(slot, group)
        mapped = 0
        try:
            for t, h in enumerate(hs):
                t0 = time.perf_counter()
                self._driver.map(self._va[t] + off, page, h)
                self.hist["map"].record(time.perf_counter() - t0)
                mapped += 1
        except BaseException:
            for t in range(mapped):
                self._driver.unmap(self._va[t] + off, page)
            raise
        with self._lock:
            self.counters["pages_mapped"] += mapped

    def _set_access(self, slot: int, first: int, stop: int) -> None:
        off, size = self.geometry.run_span(slot, first, stop)
        page = self.geometry.page_size
        if self._batch_access:
            try:
                for va in self._va:
                    self._timed_access(va + off, size)
                return
            except VmmError:
                # A driver that refuses one access call over several allocations: go per page.
                self._batch_access = False
                with self._lock:
                    self.counters["set_access_fallbacks"] += 1
        for va in self._va:
            for p in range(off, off + size, page):
                self._timed_access(va + p, page)

    def _timed_access(self, va: int, size: int) -> None:
        t0 = time.perf_counter()
        self._driver.set_access(va, size)
        self.hist["set_access"].record(time.perf_counter() - t0)
        with self._lock:
            self.counters["set_access_calls"] += 1

    def _unmap_group(self, slot: int, group: int, hs: list[Any]) -> None:
        page = self.geometry.page_size
        off = self.geometry.group_offset(slot, group)
        for t in range(len(hs)):
            t0 = time.perf_counter()
            self._driver.unmap(self._va[t] + off, page)
            self.hist["unmap"].record(time.perf_counter() - t0)
        with self._lock:
            self._pool.extend(hs)
            self.counters["pages_unmapped"] += len(hs)

    def _shrink(self, slot: int, new_mapped: int) -> int:
        """Unmap a slot's tail groups down to ``new_mapped``; handles go back to the pool."""
        with self._lock:
            old = self._table[slot].mapped
            groups = [(g, self._handles.pop((slot, g))) for g in range(old - 1, new_mapped - 1, -1)]
            self._table.set_mapped(slot, min(old, new_mapped))
        for group, hs in groups:
            self._unmap_group(slot, group, hs)
        with self._lock:
            self.counters["groups_reclaimed"] += len(groups)
        return len(groups)

    def _reclaim(self, need_groups: int | None, protect: int | None = None,
                 keep_warm: bool = False) -> int:
        """Take groups from inactive slots (never from ``protect``). Returns groups freed."""
        with self._lock:
            inactive = self._table.inactive_mapped()
            keep: dict[int, int] = {}
            if protect is not None:
                inactive.pop(protect, None)
            warm = self._table.warm_slot()
            if keep_warm and warm is not None:
                keep[warm] = self.eager_groups
            plan = plan_reclaim(inactive, need_groups, keep)
        if not plan:
            return 0
        self._driver.synchronize()
        freed = 0
        for slot, new_mapped in plan.items():
            with self._lock:
                if self._table[slot].active:  # allocated meanwhile: leave it alone
                    continue
            freed += self._shrink(slot, new_mapped)
        with self._lock:
            self.counters["reclaim_events"] += 1
        return freed

    def _release_pool(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, []
        for h in pool:
            t0 = time.perf_counter()
            self._driver.release(h)
            self.hist["release"].record(time.perf_counter() - t0)
            with self._lock:
                self._created -= 1
                self.counters["pages_released"] += 1

