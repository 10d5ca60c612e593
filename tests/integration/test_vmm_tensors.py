"""Zero-copy tensors over a raw address via DLPack. On CPU the same builder the GPU path uses is
pointed at host memory (device type kDLCPU), so the aliasing is tested for real here, in torch
(which is why this is not in tests/unit: that layer has no torch); the CUDA case is in
tests/gpu/test_vmm_gpu.py."""

from __future__ import annotations

import ctypes

import pytest
import torch

from kvprefetch.vmm.tensors import KDL_CPU, tensor_from_address


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "int8", "float8_e4m3fn"])
def test_tensor_aliases_the_address_without_copy(dtype: str) -> None:
    dt = getattr(torch, dtype)
    buf = (ctypes.c_uint8 * 8192)()
    addr = ctypes.addressof(buf)
    t = tensor_from_address(addr, (4, 16), (32, 1), dt, KDL_CPU)
    assert t.dtype == dt and t.shape == (4, 16) and t.stride() == (32, 1)
    assert t.data_ptr() == addr
    src = torch.arange(64, dtype=torch.float32).reshape(4, 16).to(dt)
    t.copy_(src)
    item = t.element_size()
    # Row 1 starts 32 elements in: the bytes in the buffer are exactly what torch wrote.
    raw = bytes(buf[32 * item:(32 + 16) * item])
    assert raw == src[1].contiguous().view(torch.uint8).numpy().tobytes()
    # and a write into the buffer is visible through the tensor
    buf[0] = 0
    buf[1] = 0
    assert t.view(torch.uint8).reshape(-1)[0].item() == 0


def test_padded_batch_stride_like_the_cache() -> None:
    buf = (ctypes.c_uint8 * (3 * 1024))()
    t = tensor_from_address(ctypes.addressof(buf), (3, 4, 2, 8), (512, 16, 8, 1),
                            torch.float16, KDL_CPU)
    t.fill_(1.0)
    flat = tensor_from_address(ctypes.addressof(buf), (3 * 512,), (1,), torch.float16, KDL_CPU)
    touched = (flat != 0).nonzero().flatten()
    # each of the 3 slots covers 4*2*8 = 64 elements at slot*512, nothing in between
    assert touched.numel() == 3 * 64
    assert set((touched // 512).tolist()) == {0, 1, 2}
    assert int((touched % 512).max()) == 63


def test_shape_stride_mismatch() -> None:
    with pytest.raises(ValueError, match="must have the same length"):
        tensor_from_address(0, (2, 2), (1,), torch.float16, KDL_CPU)
