"""``FakeVmmDriver``: an in-memory stand-in for the CUDA driver's VMM API, used by the CPU tests
and ``kvprefetch vmm selftest --driver fake``. It is stricter than the driver on purpose:

- every mutating call must come from a thread that called ``bind_thread`` (a missing
  ``cuCtxSetCurrent`` in the worker fails here instead of relying on driver leniency);
- two mutating calls may never overlap in time (the cache promises that only one thread changes
  mappings at once; ``overlap_sleep_s`` widens the window so a broken protocol is caught);
- sizes and addresses must be granularity-aligned; a map must fall inside a reservation and not
  overlap a mapping; a handle is mapped at most once; an unmap must match one mapping exactly;
  a handle may be released only when unmapped; a range may be freed only when nothing inside it
  is mapped; set_access needs a fully mapped range;
- ``create`` fails with ``VmmOutOfMemory`` once ``total_bytes`` are committed.

It holds no data: content checks are the GPU tests' job."""

from __future__ import annotations

import threading
import time
from typing import Any

from .errors import VmmDriverError, VmmOutOfMemory

MiB = 1 << 20


class FakeVmmDriver:
    name = "fake"
    supports_tensors = False

    def __init__(self, granularity: int = 2 * MiB, total_bytes: int = 1 << 34,
                 map_latency_s: float = 0.0, overlap_sleep_s: float = 0.0, device: int = 0) -> None:
        self.device = device
        self._gran = granularity
        self.total_bytes = total_bytes
        self.map_latency_s = map_latency_s
        self.overlap_sleep_s = overlap_sleep_s
        self._lock = threading.Lock()
        self._local = threading.local()
        self._next_va = 0x7F00_0000_0000
        self._next_handle = 1
        self.reservations: dict[int, int] = {}      # va -> size
        self.handles: dict[int, int] = {}           # handle -> size
        self.mappings: dict[int, tuple[int, int]] = {}  # va -> (size, handle)
        self.mapped_handles: set[int] = set()
        self.accessible: set[int] = set()           # page-aligned vas with access set
        self.calls: list[str] = []
        self.bound_threads: set[int] = set()
        self.sync_count = 0
        self.closed = False
        self._busy_thread: int | None = None
        self._inject: dict[str, list[int]] = {}     # call -> [calls to let through, CUresult]

    def inject(self, call: str, code: int, after: int = 0) -> None:
        """Make the ``after``-th next ``call`` (0 = the very next) fail with ``code``
        (2 = out of memory, anything else a driver error)."""
        self._inject[call] = [after, code]

    # ---- strictness helpers ------------------------------------------------------------------
    def _enter(self, call: str) -> None:
        if not getattr(self._local, "bound", False):
            raise VmmDriverError(call, 201, "CUDA_ERROR_INVALID_CONTEXT",
                                 "no context is current in this thread (fake driver)")
        me = threading.get_ident()
        with self._lock:
            if self._busy_thread is not None and self._busy_thread != me:
                raise AssertionError(f"fake driver: {call} overlaps a mutating call of another "
                                     "thread: the cache's mapping protocol is broken")
            self._busy_thread = me
            self.calls.append(call)
        code = None
        plan = self._inject.get(call)
        if plan is not None:
            if plan[0] == 0:
                code = plan[1]
                del self._inject[call]
            else:
                plan[0] -= 1
        if code is not None:
            self._leave()
            if code == 2:
                raise VmmOutOfMemory(f"fake {call}: injected out of memory")
            raise VmmDriverError(call, code, "CUDA_ERROR_INJECTED", "injected by the test")
        if self.overlap_sleep_s:
            time.sleep(self.overlap_sleep_s)

    def _leave(self) -> None:
        with self._lock:
            self._busy_thread = None

    def _bad(self, call: str, why: str) -> VmmDriverError:
        self._leave()
        return VmmDriverError(call, 1, "CUDA_ERROR_INVALID_VALUE", why)

    def _aligned(self, *values: int) -> bool:
        return all(v % self._gran == 0 for v in values)

    # ---- the interface -----------------------------------------------------------------------
    def bind_thread(self) -> None:
        self._local.bound = True
        self.bound_threads.add(threading.get_ident())

    def granularity(self, recommended: bool = False) -> int:
        return self._gran

    def committed_bytes(self) -> int:
        return sum(self.handles.values())

    def mem_info(self) -> tuple[int, int]:
        return self.total_bytes - self.committed_bytes(), self.total_bytes

    def reserve(self, size: int, alignment: int) -> int:
        self._enter("reserve")
        if size <= 0 or not self._aligned(size, alignment or self._gran):
            raise self._bad("reserve", f"size {size}/alignment {alignment} not aligned")
        va = self._next_va
        self._next_va += size + self._gran  # a guard gap between reservations
        self.reservations[va] = size
        self._leave()
        return va

    def free_va(self, va: int, size: int) -> None:
        self._enter("free_va")
        if self.reservations.get(va) != size:
            raise self._bad("free_va", f"no reservation of {size} B at {va:#x}")
        if any(va <= m < va + size for m in self.mappings):
            raise self._bad("free_va", f"range at {va:#x} still has mappings")
        del self.reservations[va]
        self._leave()

    def create(self, size: int) -> Any:
        self._enter("create")
        if size <= 0 or not self._aligned(size):
            raise self._bad("create", f"size {size} not aligned")
        if self.committed_bytes() + size > self.total_bytes:
            self._leave()
            raise VmmOutOfMemory(f"fake create: {size} B would exceed {self.total_bytes} B")
        h = self._next_handle
        self._next_handle += 1
        self.handles[h] = size
        self._leave()
        return h

    def release(self, handle: Any) -> None:
        self._enter("release")
        if handle not in self.handles:
            raise self._bad("release", f"unknown or already released handle {handle}")
        if handle in self.mapped_handles:
            raise self._bad("release", f"handle {handle} is still mapped")
        del self.handles[handle]
        self._leave()

    def _in_reservation(self, va: int, size: int) -> bool:
        return any(base <= va and va + size <= base + rsize
                   for base, rsize in self.reservations.items())

    def map(self, va: int, size: int, handle: Any) -> None:
        self._enter("map")
        if self.map_latency_s:
            time.sleep(self.map_latency_s)
        if not self._aligned(va, size):
            raise self._bad("map", f"unaligned map {va:#x}+{size}")
        if not self._in_reservation(va, size):
            raise self._bad("map", f"map {va:#x}+{size} outside every reservation")
        if handle not in self.handles or self.handles[handle] != size:
            raise self._bad("map", f"handle {handle} unknown or not {size} B")
        if handle in self.mapped_handles:
            raise self._bad("map", f"handle {handle} is already mapped")
        for m, (msize, _) in self.mappings.items():
            if m < va + size and va < m + msize:
                raise self._bad("map", f"map {va:#x}+{size} overlaps mapping at {m:#x}")
        self.mappings[va] = (size, handle)
        self.mapped_handles.add(handle)
        self._leave()

    def set_access(self, va: int, size: int) -> None:
        self._enter("set_access")
        if self.map_latency_s:
            time.sleep(self.map_latency_s)
        pos = va
        while pos < va + size:
            m = self.mappings.get(pos)
            if m is None:
                raise self._bad("set_access", f"{pos:#x} in set_access range is not mapped")
            pos += m[0]
        if pos != va + size:
            raise self._bad("set_access", "set_access range ends inside a mapping")
        for p in range(va, va + size, self._gran):
            self.accessible.add(p)
        self._leave()

    def unmap(self, va: int, size: int) -> None:
        self._enter("unmap")
        m = self.mappings.get(va)
        if m is None or m[0] != size:
            raise self._bad("unmap", f"no mapping of exactly {size} B at {va:#x}")
        del self.mappings[va]
        self.mapped_handles.discard(m[1])
        for p in range(va, va + size, self._gran):
            self.accessible.discard(p)
        self._leave()

    def synchronize(self) -> None:
        self.sync_count += 1

    def close(self) -> None:
        self.closed = True

    # ---- inspection for tests ----------------------------------------------------------------
    def live(self) -> dict[str, int]:
        """What is still allocated: all zero after a correct teardown."""
        return {"reservations": len(self.reservations), "handles": len(self.handles),
                "mappings": len(self.mappings)}

    def is_accessible(self, va: int) -> bool:
        return va - va % self._gran in self.accessible
