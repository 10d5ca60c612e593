"""The cuda-python layer: return-code checking and error translation.

Without a GPU the driver's functions cannot run, so ``_call`` is exercised with stand-in functions
returning cuda-python's ``(CUresult, value...)`` tuples, built from the real ``CUresult`` enum of
the installed cuda-bindings (the ``test`` extra installs them; never skipped for their lack). That
stands in for the CUDA driver only; the real calls run in tests/gpu/test_vmm_gpu.py on the H200."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kvprefetch.vmm.driver import CudaVmmDriver, load_driver_module
from kvprefetch.vmm.errors import VmmDriverError, VmmError, VmmOutOfMemory


def _driver_with(**fns: Any) -> CudaVmmDriver:
    real = load_driver_module()
    drv = object.__new__(CudaVmmDriver)
    drv._d = SimpleNamespace(CUresult=real.CUresult, **fns)  # type: ignore[attr-defined]
    return drv


def test_the_bindings_expose_every_vmm_call() -> None:
    d = load_driver_module()
    for name in ("cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess",
                 "cuMemUnmap", "cuMemRelease", "cuMemAddressFree",
                 "cuMemGetAllocationGranularity", "cuMemGetInfo", "cuCtxSetCurrent",
                 "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease", "cuCtxSynchronize"):
        assert callable(getattr(d, name)), name


def test_success_unpacks_values() -> None:
    ok = load_driver_module().CUresult.CUDA_SUCCESS
    drv = _driver_with(cuMemGetInfo=lambda: (ok, 10, 20), cuMemUnmap=lambda va, size: (ok,),
                       cuMemAddressReserve=lambda *a: (ok, 0x1000))
    assert drv.mem_info() == (10, 20)
    assert drv.unmap(0x1000, 4096) is None
    assert drv.reserve(4096, 4096) == 0x1000


def test_out_of_memory_becomes_vmm_out_of_memory() -> None:
    cu = load_driver_module().CUresult

    def no_names(err: Any) -> Any:
        raise RuntimeError("no driver on this machine")

    drv = _driver_with(cuMemCreate=lambda *a: (cu.CUDA_ERROR_OUT_OF_MEMORY, None),
                       cuGetErrorName=no_names, cuGetErrorString=no_names)
    drv._prop = None  # type: ignore[attr-defined]
    with pytest.raises(VmmOutOfMemory) as ei:
        drv.create(2 << 20)
    assert "cuMemCreate is out of device memory" in str(ei.value)
    assert "To fix:" in str(ei.value)


def test_other_errors_carry_call_code_and_name() -> None:
    cu = load_driver_module().CUresult
    drv = _driver_with(
        cuMemMap=lambda *a: (cu.CUDA_ERROR_INVALID_VALUE,),
        cuGetErrorName=lambda e: (cu.CUDA_SUCCESS, b"CUDA_ERROR_INVALID_VALUE"),
        cuGetErrorString=lambda e: (cu.CUDA_SUCCESS, b"invalid argument"),
    )
    with pytest.raises(VmmDriverError) as ei:
        drv.map(0x1000, 2 << 20, 7)
    e = ei.value
    assert e.call == "cuMemMap" and e.code == int(cu.CUDA_ERROR_INVALID_VALUE)
    assert "CUDA_ERROR_INVALID_VALUE" in str(e) and "invalid argument" in str(e)
    assert isinstance(e, VmmError) and e.exit_code == 9


def test_no_gpu_gives_a_clear_error() -> None:
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is present; the real driver is tested in test_vmm_gpu.py")
    with pytest.raises(VmmError):
        CudaVmmDriver(0)


def test_every_call_passes_the_installed_bindings_argument_checks() -> None:
    """cuda-python converts and type-checks arguments before it loads libcuda, so on a machine
    without a driver each call must fail with the loader's error, never with a TypeError. This
    catches a wrong argument order or type against the real bindings without a GPU."""
    import importlib.util
    import threading

    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is present: these calls would really run; see test_vmm_gpu.py")
    from kvprefetch.vmm.driver import allocation_structs

    d = load_driver_module()
    drv = object.__new__(CudaVmmDriver)
    drv._d = d
    drv._prop, drv._access = allocation_structs(d, 0)
    drv._dev = d.CUdevice(0)
    drv._ctx = d.CUcontext(0)
    drv._closed = False
    drv._local = threading.local()
    va = 0x7F00_0000_0000
    handle = d.CUmemGenericAllocationHandle(0)
    calls = [drv.bind_thread, drv.current_context, drv.granularity,
             lambda: drv.granularity(recommended=True), lambda: drv.reserve(2 << 20, 2 << 20),
             lambda: drv.free_va(va, 2 << 20), lambda: drv.create(2 << 20),
             lambda: drv.release(handle), lambda: drv.map(va, 2 << 20, handle),
             lambda: drv.set_access(va, 2 << 20), lambda: drv.unmap(va, 2 << 20),
             drv.mem_info, drv.synchronize, lambda: drv.read(va, 64), drv.close]
    for call in calls:
        with pytest.raises(Exception) as ei:  # noqa: PT011 (anything but a TypeError)
            call()
        assert not isinstance(ei.value, TypeError), ei.value
