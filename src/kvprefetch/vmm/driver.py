"""The only module that calls the CUDA driver's virtual memory API, through cuda-python
(``cuda.bindings.driver``; ``cuda.cuda`` on releases before 12.6). Every call's return code is
checked: out-of-memory becomes ``VmmOutOfMemory``, anything else ``VmmDriverError``.

``VmmDriver`` is the interface the cache uses; ``fake.FakeVmmDriver`` implements it in memory for
the CPU tests. Handles are opaque objects; addresses and sizes are ints (bytes)."""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Protocol

from .errors import VmmDriverError, VmmError, VmmOutOfMemory


class VmmDriver(Protocol):
    name: str
    device: int
    supports_tensors: bool

    def granularity(self, recommended: bool = False) -> int: ...
    def reserve(self, size: int, alignment: int) -> int: ...
    def free_va(self, va: int, size: int) -> None: ...
    def create(self, size: int) -> Any: ...
    def release(self, handle: Any) -> None: ...
    def map(self, va: int, size: int, handle: Any) -> None: ...
    def set_access(self, va: int, size: int) -> None: ...
    def unmap(self, va: int, size: int) -> None: ...
    def mem_info(self) -> tuple[int, int]: ...
    def bind_thread(self) -> None: ...
    def synchronize(self) -> None: ...
    def close(self) -> None: ...


def load_driver_module() -> Any:
    """Import cuda-python's driver bindings (new layout first, then the pre-12.6 one)."""
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver  # type: ignore[attr-defined,no-redef]
        except ImportError as exc:
            raise VmmError(
                f"cuda-python is not installed ({exc})",
                "pip install 'kvprefetch[vmm]' (cuda-python>=12.4, which provides "
                "cuda.bindings.driver)",
            ) from exc
    return driver


def bindings_version() -> str:
    try:
        import cuda.bindings

        return str(getattr(cuda.bindings, "__version__", "unknown"))
    except ImportError:
        return "absent"


def allocation_structs(d: Any, device: int) -> tuple[Any, list[Any]]:
    """The allocation properties (pinned device memory on ``device``) and the one access
    descriptor (read-write for that device) every create and set-access call uses."""
    prop = d.CUmemAllocationProp()
    prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device
    desc = d.CUmemAccessDesc()
    desc.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = device
    desc.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    return prop, [desc]


class CudaVmmDriver:
    """The CUDA driver, on one device's primary context (the one PyTorch's runtime uses)."""

    name = "cuda"
    supports_tensors = True

    def __init__(self, device: int = 0) -> None:
        self.device = device
        self._d = load_driver_module()
        self._local = threading.local()
        try:
            self._call("cuInit", 0)
        except VmmError:
            raise
        except Exception as exc:  # no libcuda.so: cuda-python raises its own loader error
            raise VmmError(f"the CUDA driver could not be loaded: {exc}",
                           "run on a machine with an NVIDIA GPU and driver") from exc
        self._dev = self._call("cuDeviceGet", device)
        # Retain the primary context (released in close()); torch's runtime uses the same one.
        self._ctx = self._call("cuDevicePrimaryCtxRetain", self._dev)
        self._closed = False
        self._prop, self._access = allocation_structs(self._d, device)
        self.bind_thread()

    # ---- plumbing ----------------------------------------------------------------------------
    def _call(self, fn: str, *args: Any) -> Any:
        result = getattr(self._d, fn)(*args)
        err = result[0] if isinstance(result, tuple) else result
        if int(err) != 0:
            raise self._error(fn, err)
        rest = result[1:] if isinstance(result, tuple) else ()
        if not rest:
            return None
        return rest[0] if len(rest) == 1 else rest

    def _error(self, fn: str, err: Any) -> VmmError:
        code = int(err)
        name, text = f"CUresult {code}", ""
        try:
            r = self._d.cuGetErrorName(err)
            name = r[1].decode() if isinstance(r[1], bytes) else str(r[1])
            r = self._d.cuGetErrorString(err)
            text = r[1].decode() if isinstance(r[1], bytes) else str(r[1])
        except Exception:  # noqa: BLE001,S110 - names are a courtesy; never mask the error
            pass
        if code == int(self._d.CUresult.CUDA_ERROR_OUT_OF_MEMORY):
            return VmmOutOfMemory(
                f"CUDA driver call {fn} is out of device memory ({name}: {text})",
                "preempt a request (free_reqid) and step again, or lower the cache's footprint",
            )
        return VmmDriverError(fn, code, name, text)

    # ---- the interface -----------------------------------------------------------------------
    def bind_thread(self) -> None:
        """Make the primary context current in the calling thread (once per thread)."""
        if getattr(self._local, "bound", False):
            return
        self._call("cuCtxSetCurrent", self._ctx)
        self._local.bound = True

    def current_context(self) -> int:
        ctx = self._call("cuCtxGetCurrent")
        return int(ctx) if ctx is not None else 0

    def primary_context(self) -> int:
        return int(self._ctx)

    def granularity(self, recommended: bool = False) -> int:
        flags = self._d.CUmemAllocationGranularity_flags
        opt = (flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED if recommended
               else flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        return int(self._call("cuMemGetAllocationGranularity", self._prop, opt))

    def reserve(self, size: int, alignment: int) -> int:
        return int(self._call("cuMemAddressReserve", size, alignment, 0, 0))

    def free_va(self, va: int, size: int) -> None:
        self._call("cuMemAddressFree", va, size)

    def create(self, size: int) -> Any:
        return self._call("cuMemCreate", size, self._prop, 0)

    def release(self, handle: Any) -> None:
        self._call("cuMemRelease", handle)

    def map(self, va: int, size: int, handle: Any) -> None:
        self._call("cuMemMap", va, size, 0, handle, 0)

    def set_access(self, va: int, size: int) -> None:
        self._call("cuMemSetAccess", va, size, self._access, 1)

    def unmap(self, va: int, size: int) -> None:
        self._call("cuMemUnmap", va, size)

    def mem_info(self) -> tuple[int, int]:
        free, total = self._call("cuMemGetInfo")
        return int(free), int(total)

    def synchronize(self) -> None:
        self._call("cuCtxSynchronize")

    def read(self, va: int, nbytes: int) -> bytes:
        """Copy device bytes to the host with the driver (tests: an independent view of memory)."""
        buf = (ctypes.c_char * nbytes)()
        self._call("cuMemcpyDtoH", ctypes.addressof(buf), va, nbytes)
        return bytes(buf)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._call("cuDevicePrimaryCtxRelease", self._dev)
