"""Zero-copy torch tensors over a raw address, through a hand-built DLPack capsule.

Why DLPack and not ``__cuda_array_interface__``: torch turns a CUDA array interface into a tensor
with ``at::from_blob`` *without* a device, so it asks ``cudaPointerGetAttributes`` where the pointer
lives; for a reserved but not yet mapped VMM range that query cannot answer (the cache maps
nothing at init). ``at::fromDLPack`` takes the device from the capsule and never queries the
pointer. The tensor does not own the memory: the cache does, and a tensor used after
``teardown()`` points at freed address space.

The capsule's deleter is NULL and its structs are kept alive for the life of the process (a few
hundred bytes per tensor), because torch reads ``deleter`` when the tensor dies. Each element type
is exported as the signed integer of the same width and re-viewed (``Tensor.view(dtype)`` keeps
shape and strides), so bfloat16 and float8 need no DLPack type codes."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

KDL_CPU = 1
KDL_CUDA = 2
_KDL_INT = 0


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_CAPSULE_NAME = b"dltensor"
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                                 ctypes.c_void_p)(("PyCapsule_New", ctypes.pythonapi))
_KEEP_ALIVE: list[Any] = []


def tensor_from_address(address: int, shape: Sequence[int], strides_elems: Sequence[int],
                        dtype: Any, device_type: int = KDL_CUDA, device_id: int = 0) -> Any:
    """A torch tensor aliasing ``address`` (no copy). ``dtype`` is a torch dtype; strides are in
    elements. ``device_type`` is ``KDL_CUDA`` for device memory, ``KDL_CPU`` for host memory."""
    import torch
    from torch.utils.dlpack import from_dlpack

    if len(shape) != len(strides_elems):
        raise ValueError("shape and strides must have the same length")
    itemsize = torch.empty((), dtype=dtype).element_size()
    carrier = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[itemsize]
    ndim = len(shape)
    shape_arr = (ctypes.c_int64 * ndim)(*shape)
    strides_arr = (ctypes.c_int64 * ndim)(*strides_elems)
    managed = _DLManagedTensor()
    managed.dl_tensor.data = address
    managed.dl_tensor.device = _DLDevice(device_type, device_id)
    managed.dl_tensor.ndim = ndim
    managed.dl_tensor.dtype = _DLDataType(_KDL_INT, itemsize * 8, 1)
    managed.dl_tensor.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
    managed.dl_tensor.strides = ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64))
    managed.dl_tensor.byte_offset = 0
    managed.manager_ctx = None
    managed.deleter = None
    _KEEP_ALIVE.append((managed, shape_arr, strides_arr))
    capsule = _capsule_new(ctypes.addressof(managed), _CAPSULE_NAME, None)
    t = from_dlpack(capsule)
    if t.dtype != carrier:  # pragma: no cover - a torch that maps int types differently
        raise TypeError(f"DLPack int{itemsize * 8} came back as {t.dtype}")
    t = t.view(dtype)
    if t.data_ptr() != address:  # pragma: no cover - would mean torch copied
        raise RuntimeError(f"torch did not alias {address:#x} (got {t.data_ptr():#x})")
    return t
