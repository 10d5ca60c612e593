"""The GPU caches on the GPU (``machine/gpu_folders``): the CUDA driver writes its just-in-time
cache by the path ``CUDA_CACHE_PATH`` names, which is why the kit checks that folder before a
kernel loads; and a GPU command is refused where another user's link chose it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")
NOBODY = 65534

# A kernel in PTX only: the driver compiles it when the module loads, and caches the result.
_LOAD_PTX = r"""
import ctypes, sys
ptx = b'''.version 8.0
.target sm_90
.address_size 64
.visible .entry kvprefetch_cache_probe(.param .u64 p) { ret; }
''' + b'\0'
cuda = ctypes.CDLL("libcuda.so.1")
ctx, mod = ctypes.c_void_p(), ctypes.c_void_p()
dev = ctypes.c_int()
assert cuda.cuInit(0) == 0
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
rc = cuda.cuModuleLoadData(ctypes.byref(mod), ptx)
assert rc == 0, rc
"""


@pytest.mark.gpu
def test_the_driver_writes_its_jit_cache_where_cuda_cache_path_says(tmp_path: Path) -> None:
    """The premise of the check: a PTX module loaded, and the driver made its cache in the
    folder ``CUDA_CACHE_PATH`` names."""
    cache = tmp_path / "jitcache"
    env = dict(os.environ, CUDA_CACHE_PATH=str(cache))
    env.pop("CUDA_CACHE_DISABLE", None)
    res = subprocess.run([sys.executable, "-c", _LOAD_PTX], env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    assert cache.is_dir() and any(p.is_file() for p in cache.rglob("*")), list(cache.rglob("*"))


@pytest.mark.gpu
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a link another user owns")
def test_a_gpu_command_is_refused_where_another_users_link_chose_the_cache(
        tmp_path: Path) -> None:
    """``vmm selftest --driver cuda`` with ``CUDA_CACHE_PATH`` through ``nobody``'s link in a
    shared folder: refused before a kernel loads, and nothing made where the link leads."""
    mine = tmp_path / "mine"
    mine.mkdir()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "cache").symlink_to(mine)
    os.lchown(shared / "cache", NOBODY, NOBODY)
    env = dict(os.environ, PYTHONPATH=SRC, CUDA_CACHE_PATH=str(shared / "cache"))
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "vmm", "selftest", "--driver",
                          "cuda", "--ops", "20"], env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    text = res.stdout + res.stderr
    assert "Traceback" not in text, text
    assert res.returncode == 2, text
    assert "the GPU's cache folder" in text and "belongs to nobody" in text, text
    assert list(mine.iterdir()) == [], text
