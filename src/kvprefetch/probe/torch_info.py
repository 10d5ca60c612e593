"""Print, as JSON, what a build needs to know about this interpreter's torch: version, CUDA
version, include and library directories, and the C++ ABI. Runs with the env's own python."""

import json
import os
import sys

import torch
from torch.utils import cpp_extension

print(json.dumps({
    "python": sys.executable,
    "prefix": sys.prefix,
    "torch_version": torch.__version__,
    "torch_file": torch.__file__,
    "torch_cuda": torch.version.cuda,
    "include_paths": cpp_extension.include_paths(device_type="cuda"),
    "library_paths": cpp_extension.library_paths(device_type="cuda"),
    "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
    "common_nvcc_flags": list(cpp_extension.COMMON_NVCC_FLAGS),
    # The nvidia-* wheels that a pip-installed CUDA torch depends on carry the cuBLAS /
    # cuSPARSE / cuSOLVER headers that ATen/cuda/CUDAContext.h includes; a bare toolkit
    # (or a compile-only machine) may lack them.
    "nvidia_include_paths": sorted(
        os.path.join(root, d, "include")
        for root in {os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia")}
        if os.path.isdir(root)
        for d in os.listdir(root)
        if os.path.isdir(os.path.join(root, d, "include"))
    ),
}))
