"""``kvprefetch.vmm``: a virtually contiguous KV cache on CUDA's virtual memory API (vAttention,
ASPLOS'25), for Hopper, with tests.

The package is split so that everything but the driver calls can be tested without a GPU:

- ``layout``  -- the cache geometry (per-layer ``[B, S, H, D]`` or tensor slicing
  ``[B, S, L, H, D]``) and the page arithmetic: which bytes of which tensor a slot's page group
  covers.
- ``slots``   -- slot bookkeeping (alloc/free, deferred reclamation, the warm slot) and the
  planning functions: what a step must map now, what the worker maps next, what to reclaim.
- ``stats``   -- latency histograms and the accounting snapshot.
- ``driver``  -- the only module that calls the CUDA driver (through cuda-python), return codes
  checked; ``fake`` is a strict in-memory stand-in used by the CPU tests and ``vmm selftest``.
- ``tensors`` -- zero-copy torch tensors over a raw device address (a DLPack capsule).
- ``worker``  -- the one persistent mapping thread and its wait/submit protocol.
- ``cache``   -- ``VirtualKVCache``: init, alloc_reqid, free_reqid, step, teardown, stats.
- ``bench``   -- the H200 measurements (decode attention over VMM vs cudaMalloc, step latency).

Nothing here imports torch or cuda-python at import time.
"""

from __future__ import annotations

from .errors import VmmDriverError, VmmError, VmmOutOfMemory, VmmUsageError
from .layout import CacheGeometry, KVCacheSpec, Layout

__all__ = [
    "CacheGeometry",
    "KVCacheSpec",
    "Layout",
    "VirtualKVCache",
    "VmmDriverError",
    "VmmError",
    "VmmOutOfMemory",
    "VmmUsageError",
]


def __getattr__(name: str) -> object:
    # VirtualKVCache lives in cache.py, which pulls in the worker thread machinery; load it on
    # first use so that ``import kvprefetch.vmm`` stays cheap.
    if name == "VirtualKVCache":
        from .cache import VirtualKVCache

        return VirtualKVCache
    raise AttributeError(name)
