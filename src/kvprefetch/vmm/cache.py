"""``VirtualKVCache``: vAttention's API (init, alloc_reqid, free_reqid, step) over CUDA VMM.

Lifecycle: ``__init__`` reserves one virtual range per tensor and maps nothing. ``alloc_reqid``
hands out a slot, ``step(seq_lens)`` makes every active slot's pages present before the step's
kernels run, ``free_reqid`` returns a slot but keeps its pages (deferred reclamation), and
``teardown`` unmaps exactly what is mapped, releases every handle, then frees the ranges.

Physical pages come from a pool of single-page handles: an unmapped handle is remapped before a new
one is created, so committed memory only grows when contexts do. When a step cannot get a page
(device out of memory, or ``physical_budget_bytes`` reached) the cache first reclaims pages from
inactive slots; if that is not enough it raises ``VmmOutOfMemory`` and keeps every page it has.

Threading: see ``worker.py``. ``step`` waits for the previous background job, maps what the current
step still lacks on the calling thread, then hands the next-token lookahead, the warm slot's eager
mapping and the free-memory-threshold reclamation to the worker, which overlaps them with the
step's GPU work. With ``async_mapping=False`` all of that runs inline (no lookahead: the next
step maps what it needs itself), which is the baseline the benchmark compares against.

Unmapping (reclaim, non-deferred free, teardown) first synchronizes the context, so no kernel still
in flight can read a page that goes away (kvcached does the same)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .driver import VmmDriver
from .errors import VmmError, VmmOutOfMemory, VmmUsageError
from .layout import CacheGeometry, KVCacheSpec, Layout, check_layer, make_geometry
from .pages import PageMapping
from .slots import (
    SlotTable,
    SlotView,
    parse_seq_lens,
    plan_ahead,
    plan_now,
    should_reclaim,
)
from .stats import LatencyHistogram, VmmStats
from .worker import MappingWorker

_HISTOGRAMS = ("create", "map", "set_access", "unmap", "release", "step", "step_wait",
               "step_sync_map", "worker_job")
_COUNTERS = ("pages_created", "pages_released", "pages_mapped", "pages_unmapped",
             "set_access_calls", "set_access_fallbacks", "groups_mapped_sync",
             "groups_mapped_async", "groups_reclaimed", "reclaim_events", "threshold_reclaims",
             "background_oom", "steps", "oom_raised")


@dataclass(frozen=True)
class StepReport:
    step_us: float        # wall time of the step() call
    wait_us: float        # of which waiting for the previous background job
    sync_groups: int      # page groups mapped on the calling thread
    submitted: bool       # whether a background job was handed to the worker


class VirtualKVCache(PageMapping):
    def __init__(self, spec: KVCacheSpec, *, device: int = 0, page_size: int | None = None,
                 driver: VmmDriver | None = None, async_mapping: bool = True,
                 lookahead_tokens: int = 1, eager_groups: int = 1,
                 deferred_reclaim: bool = True, reclaim_threshold_bytes: int = 0,
                 physical_budget_bytes: int | None = None,
                 batch_set_access: bool = True) -> None:
        if lookahead_tokens < 0 or eager_groups < 0:
            raise VmmUsageError("lookahead_tokens and eager_groups must be >= 0",
                                "pass non-negative values")
        self.spec = spec
        self.device = device
        self._closed = True  # until init completes
        if driver is None:
            _init_torch_cuda(device)
            from .driver import CudaVmmDriver

            driver = CudaVmmDriver(device)
        self._driver = driver
        self._driver.bind_thread()
        self.granularity = driver.granularity()
        self.geometry: CacheGeometry = make_geometry(spec, self.granularity, page_size)
        g = self.geometry
        self.async_mapping = async_mapping
        self.lookahead_tokens = lookahead_tokens
        self.eager_groups = eager_groups
        self.deferred_reclaim = deferred_reclaim
        self.reclaim_threshold_bytes = reclaim_threshold_bytes
        self._budget_pages = (None if physical_budget_bytes is None
                              else physical_budget_bytes // g.page_size)
        self._batch_access = batch_set_access
        import threading

        self._lock = threading.RLock()
        self._table = SlotTable(spec.max_batch, g.pages_per_slot)
        self._handles: dict[tuple[int, int], list[Any]] = {}
        self._pool: list[Any] = []
        self._created = 0
        self.hist = {n: LatencyHistogram(n) for n in _HISTOGRAMS}
        self.counters = dict.fromkeys(_COUNTERS, 0)
        self._va: list[int] = []
        try:
            for _ in range(g.n_tensors):
                self._va.append(driver.reserve(g.tensor_bytes, g.page_size))
        except BaseException:
            for va in self._va:
                driver.free_va(va, g.tensor_bytes)
            raise
        self._tensors: list[Any] = []
        if driver.supports_tensors:
            self._tensors = _make_tensors(g, self._va, device)
        self._worker: MappingWorker | None = None
        self.worker_context: int | None = None
        self._closed = False
        if async_mapping:
            self._worker = MappingWorker(self._worker_init)

    # ---- context manager ---------------------------------------------------------------------
    def __enter__(self) -> VirtualKVCache:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    # ---- tensors -----------------------------------------------------------------------------
    @property
    def tensors(self) -> list[Any]:
        """The virtual tensors in reservation order: K of every layer, then V of every layer
        (per-layer), or [K, V] each ``[B, S, L, H, D]`` (tensor slicing)."""
        self._check_open()
        if not self._tensors:
            raise VmmUsageError(f"the {self._driver.name} driver exposes no tensors",
                                "use the CUDA driver (the default) to get torch tensors")
        return list(self._tensors)

    def key(self, layer: int) -> Any:
        return self._layer_view(0, layer)

    def value(self, layer: int) -> Any:
        return self._layer_view(1, layer)

    def _layer_view(self, kv: int, layer: int) -> Any:
        check_layer(self.geometry, layer)
        ts = self.tensors
        if self.spec.layout is Layout.TENSOR_SLICING:
            return ts[kv][:, :, layer]
        return ts[self.geometry.tensor_index(kv, layer)]

    @property
    def driver(self) -> VmmDriver:
        return self._driver

    def tensor_address(self, index: int) -> int:
        return self._va[index]

    # ---- slots -------------------------------------------------------------------------------
    def alloc_reqid(self, prompt_len: int | None = None) -> int:
        """A free slot for a new request. With ``prompt_len``, the free slot whose mapped pages
        fit it best; otherwise the warm slot (the one holding the most pages)."""
        self._check_open()
        need = None if prompt_len is None else self.geometry.groups_for_tokens(prompt_len)
        with self._lock:
            return self._table.alloc(need)

    def free_reqid(self, slot: int) -> None:
        """Return a slot. Its pages stay mapped for the next request (deferred reclamation)
        unless the cache was built with ``deferred_reclaim=False``."""
        self._check_open()
        with self._lock:
            self._table.free(slot)
        if not self.deferred_reclaim:
            self._wait_worker()
            self._driver.bind_thread()
            with self._lock:
                if self._table[slot].active or not self._table[slot].mapped:
                    return
            self._driver.synchronize()
            self._shrink(slot, 0)

    def slot(self, slot: int) -> SlotView:
        with self._lock:
            return self._table.view(slot)

    def active_slots(self) -> list[int]:
        with self._lock:
            return self._table.active_slots()

    # ---- step --------------------------------------------------------------------------------
    def step(self, seq_lens: Mapping[int, int] | Sequence[int]) -> StepReport:
        """Make every active slot hold pages for ``seq_lens[slot]`` tokens (the prompt on
        prefill, the context including the new token on decode), then start mapping ahead for
        the next step. Raises ``VmmUsageError`` for bad input (nothing changed) and
        ``VmmOutOfMemory`` when pages run out (slots keep what they have; ``.short`` says what
        is missing)."""
        t0 = time.perf_counter()
        self._check_open()
        self._driver.bind_thread()
        waited = self._wait_worker()
        with self._lock:
            lens = parse_seq_lens(self._table, self.geometry, seq_lens)
            for slot, tokens in lens.items():
                self._table[slot].seq_len = tokens
            plan = plan_now(self._table, self.geometry, lens)
            self.counters["steps"] += 1
        sync_groups = 0
        short: dict[int, int] = {}
        first: VmmOutOfMemory | None = None
        t_map = time.perf_counter()
        for slot, target in plan.items():
            before = self._table[slot].mapped
            try:
                self._grow(slot, target, reclaim=True)
            except VmmOutOfMemory as exc:
                short[slot] = target - self._table[slot].mapped
                first = first or exc
            sync_groups += self._table[slot].mapped - before
        if plan:
            self.hist["step_sync_map"].record(time.perf_counter() - t_map)
        with self._lock:
            self.counters["groups_mapped_sync"] += sync_groups
        if short:
            with self._lock:
                self.counters["oom_raised"] += 1
            missing = sum(short.values())
            raise VmmOutOfMemory(
                f"out of physical memory: {missing} page group(s) of "
                f"{self.geometry.group_bytes} B missing for slot(s) "
                f"{', '.join(f'{s} (+{n})' for s, n in sorted(short.items()))}; "
                f"cause: {first.cause if first else 'unknown'}",
                "preempt a request (free_reqid) and call step() again; the cache is intact",
                short=short,
            ) from first
        submitted = False
        if self._worker is not None:
            self._worker.submit(self._background)
            submitted = True
        else:
            self._background()
        self.hist["step"].record(time.perf_counter() - t0)
        return StepReport(step_us=(time.perf_counter() - t0) * 1e6, wait_us=waited * 1e6,
                          sync_groups=sync_groups, submitted=submitted)

    def wait(self) -> None:
        """Block until the background job (if any) is done. ``step`` does this itself."""
        self._check_open()
        self._wait_worker()

    def _wait_worker(self) -> float:
        if self._worker is None:
            return 0.0
        t0 = time.perf_counter()
        err = self._worker.wait()
        dt = time.perf_counter() - t0
        self.hist["step_wait"].record(dt)
        if err is not None:
            raise err
        return dt

    def _worker_init(self) -> None:
        self._driver.bind_thread()
        current = getattr(self._driver, "current_context", None)
        self.worker_context = current() if current else None

    def _background(self) -> None:
        """Lookahead for active slots, eager mapping of the warm slot, threshold reclamation.
        Runs on the worker (async) or inline (sync). Out-of-memory here is not an error: the next
        step maps what it needs itself and reports it then."""
        t0 = time.perf_counter()
        lookahead = self.lookahead_tokens if self._worker is not None else 0
        with self._lock:
            plan = plan_ahead(self._table, self.geometry, lookahead, self.eager_groups)
            warm = self._table.warm_slot()
        for slot, target in plan.items():
            before = self._table[slot].mapped
            try:
                self._grow(slot, target, reclaim=slot != warm)
            except VmmOutOfMemory:
                with self._lock:
                    self.counters["background_oom"] += 1
            with self._lock:
                self.counters["groups_mapped_async"] += self._table[slot].mapped - before
        if self.reclaim_threshold_bytes:
            free, _ = self._driver.mem_info()
            if should_reclaim(free, self.reclaim_threshold_bytes):
                self._reclaim(None, keep_warm=True)
                self._release_pool()
                with self._lock:
                    self.counters["threshold_reclaims"] += 1
        self.hist["worker_job"].record(time.perf_counter() - t0)

    def reclaim(self, need_groups: int | None = None) -> int:
        """Explicitly unmap pages of inactive slots (all of them by default) into the pool and
        release the pool's handles to the device. Returns the groups unmapped."""
        self._check_open()
        self._driver.bind_thread()
        self._wait_worker()
        freed = self._reclaim(need_groups)
        self._release_pool()
        return freed

    # ---- accounting --------------------------------------------------------------------------
    def stats(self) -> VmmStats:
        g = self.geometry
        with self._lock:
            mapped_pages = len(self._handles) * g.n_tensors
            return VmmStats(
                layout=self.spec.layout.value, page_size=g.page_size,
                granularity=self.granularity, n_tensors=g.n_tensors, group_bytes=g.group_bytes,
                va_reserved_bytes=0 if self._closed else g.va_bytes,
                mapped_pages=mapped_pages, physical_mapped_bytes=mapped_pages * g.page_size,
                pool_pages=self._created, pool_free_pages=len(self._pool),
                pool_bytes=self._created * g.page_size,
                active_slots=len(self._table.active_slots()),
                slot_groups=[self._table[i].mapped for i in range(self.spec.max_batch)],
                counters=dict(self.counters),
                latency={n: h.summary() for n, h in self.hist.items()},
            )

    # ---- teardown ----------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise VmmUsageError("the VMM cache was torn down",
                                "create a new VirtualKVCache; tensors from the old one are invalid")

    def teardown(self) -> None:
        """Unmap exactly what was mapped, then release every handle, then free the address
        ranges, in that order. Idempotent. Errors are collected and raised once at the end."""
        if self._closed:
            return
        errors: list[str] = []
        self._closed = True
        self._tensors = []
        if self._worker is not None:
            err = self._worker.stop()
            if err is not None:
                errors.append(f"background job: {err}")
        self._driver.bind_thread()
        try:
            self._driver.synchronize()
        except BaseException as exc:  # noqa: BLE001 - collected or re-raised
            errors.append(f"synchronize: {exc}")
        page = self.geometry.page_size
        with self._lock:
            mapped = sorted(self._handles.items())
            self._handles = {}
        released: list[Any] = []
        for (slot, group), hs in mapped:
            off = self.geometry.group_offset(slot, group)
            for t, h in enumerate(hs):
                try:
                    self._driver.unmap(self._va[t] + off, page)
                    self.counters["pages_unmapped"] += 1
                    released.append(h)
                except BaseException as exc:  # noqa: BLE001 - collected or re-raised
                    errors.append(f"unmap slot {slot} group {group} tensor {t}: {exc}")
        for h in released + self._pool:
            try:
                self._driver.release(h)
                self._created -= 1
                self.counters["pages_released"] += 1
            except BaseException as exc:  # noqa: BLE001 - collected or re-raised
                errors.append(f"release {h}: {exc}")
        self._pool = []
        for va in self._va:
            try:
                self._driver.free_va(va, self.geometry.tensor_bytes)
            except BaseException as exc:  # noqa: BLE001 - collected or re-raised
                errors.append(f"free range {va:#x}: {exc}")
        self._va = []
        try:
            self._driver.close()
        except BaseException as exc:  # noqa: BLE001 - collected or re-raised
            errors.append(f"close: {exc}")
        if errors:
            raise VmmError("teardown of the VMM cache hit errors:\n  " + "\n  ".join(errors),
                           "the device may hold leaked memory until the process exits")


def _init_torch_cuda(device: int) -> None:
    """Make sure PyTorch's primary context exists before the driver retains it."""
    try:
        import torch
    except ImportError as exc:
        raise VmmError(f"PyTorch is not installed ({exc})", "install torch with CUDA") from exc
    if not torch.cuda.is_available():
        raise VmmError("no CUDA device is visible to PyTorch",
                       "run on a GPU machine, or pass driver=FakeVmmDriver() for a dry run")
    torch.empty(0, device=f"cuda:{device}")


def _make_tensors(g: CacheGeometry, vas: list[int], device: int) -> list[Any]:
    import torch

    from .tensors import KDL_CUDA, tensor_from_address

    dtype = getattr(torch, g.spec.dtype)
    return [tensor_from_address(va, g.shape, g.strides_elems, dtype, KDL_CUDA, device)
            for va in vas]
