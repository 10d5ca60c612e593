"""The folders the CUDA driver and torch write by path where the environment leads, once a
command of the kit's starts CUDA (``verify-kernel``, ``bench kernel``/``decode``/``ncu``/``e2e``,
``vmm selftest``/``bench``), and the refusal of one that another user chose (``foreign
.refuse_foreign_chosen``, the rule of matplotlib's, uv's and vLLM's folders).

- The driver's just-in-time cache, where it keeps the machine code it compiled from PTX:
  ``CUDA_CACHE_PATH``, else ``$HOME/.nv/ComputeCache``; none with ``CUDA_CACHE_DISABLE=1``
  (CUDA's programming guide, "CUDA Environment Variables").
- torch's kernel cache, where it keeps the kernels it compiles at run time (jiterator, NVRTC):
  ``PYTORCH_KERNEL_CACHE_PATH``, else ``$XDG_CACHE_HOME/torch/kernels``, else
  ``$HOME/.cache/torch/kernels``; none with ``USE_PYTORCH_KERNEL_CACHE=0`` (the names and the
  order are the strings of ``libtorch_cuda.so``'s ``get_cache_dir``).

Both are written only when something is compiled at run time, which the kit's own builds
(machine code for the GPU's arch) do not ask for; a PTX-only build or a torch op that torch
compiles at run time does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path

# The variables the two folders are read from. A relative one is read from the folder the
# process is in when CUDA starts: for ncu's child that is `/` (runner.NEUTRAL_CWD).
_VARS = ("CUDA_CACHE_PATH", "PYTORCH_KERNEL_CACHE_PATH", "XDG_CACHE_HOME", "HOME")


def gpu_folders(environ: Mapping[str, str]) -> list[tuple[str, Path]]:
    """The driver's and torch's caches under ``environ``, each with the variable that chose it."""
    home = environ.get("HOME") or os.path.expanduser("~")
    out: list[tuple[str, Path]] = []
    if environ.get("CUDA_CACHE_DISABLE") != "1":
        if environ.get("CUDA_CACHE_PATH"):
            out.append(("CUDA_CACHE_PATH", Path(environ["CUDA_CACHE_PATH"])))
        else:
            out.append(("HOME", Path(home, ".nv", "ComputeCache")))
    if environ.get("USE_PYTORCH_KERNEL_CACHE") != "0":
        if environ.get("PYTORCH_KERNEL_CACHE_PATH"):
            out.append(("PYTORCH_KERNEL_CACHE_PATH", Path(environ["PYTORCH_KERNEL_CACHE_PATH"])))
        elif environ.get("XDG_CACHE_HOME"):
            out.append(("XDG_CACHE_HOME", Path(environ["XDG_CACHE_HOME"], "torch", "kernels")))
        else:
            out.append(("HOME", Path(home, ".cache", "torch", "kernels")))
    return out


def refuse_foreign_gpu_folders(environ: MutableMapping[str, str] | None = None) -> None:
    """Before CUDA starts: name each relative folder variable absolute, from the current folder,
    in ``environ`` (``os.environ``: this process and every child it starts), and refuse
    (ConfigError) a cache folder another user chose (``foreign.refuse_foreign_chosen``). The
    driver and torch write their caches by path, so ``CUDA_CACHE_PATH`` through ``nobody``'s link
    in a shared folder would have them written in the folder the link chose, as matplotlib's
    font cache was (issue 41: left open by the forty-first hostile pass, closed by the lead); and
    ``bench ncu`` profiles a child that runs in ``/``, where a relative folder would be made."""
    from ..workspace.foreign import absolute_folder_vars, refuse_foreign_folders

    env = os.environ if environ is None else environ
    absolute_folder_vars(_VARS, env)
    refuse_foreign_folders(gpu_folders(env), env, "the GPU's cache folder")
