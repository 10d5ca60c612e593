"""The folders ``vllm bench throughput`` (``bench e2e``'s child) writes by path where its
environment leads, and the refusal of one that another user chose (``foreign
.refuse_foreign_chosen``, the rule of matplotlib's and uv's caches)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def vllm_folders(environ: Mapping[str, str]) -> list[tuple[str, Path]]:
    """The folders ``vllm bench throughput`` writes by path where its environment leads, each
    with the variable that chose it: vLLM's config folder (``usage_stats.json``, appended at
    every engine start) and its cache (compile caches), ``VLLM_CONFIG_ROOT``/``VLLM_CACHE_ROOT``,
    else ``XDG_CONFIG_HOME``/``XDG_CACHE_HOME`` or ``HOME``'s ``.config``/``.cache`` plus
    ``vllm`` (vLLM 0.10.2's ``envs.py``), and Triton's kernel cache (``TRITON_CACHE_DIR``, else
    ``TRITON_HOME`` or ``HOME``, plus ``.triton/cache``), and the CUDA driver's and torch's
    caches (``machine/gpu_folders``). A relative one lies in the run's own folder, in the output
    folder."""
    from ..machine.gpu_folders import gpu_folders

    home = environ.get("HOME") or os.path.expanduser("~")
    out: list[tuple[str, str]] = []
    for own, xdg, default in (("VLLM_CONFIG_ROOT", "XDG_CONFIG_HOME", ".config"),
                              ("VLLM_CACHE_ROOT", "XDG_CACHE_HOME", ".cache")):
        if own in environ:
            out.append((own, os.path.expanduser(environ[own])))
        elif xdg in environ:
            out.append((xdg, os.path.join(environ[xdg], "vllm")))
        else:
            out.append(("HOME", os.path.join(home, default, "vllm")))
    if environ.get("TRITON_CACHE_DIR"):
        out.append(("TRITON_CACHE_DIR", environ["TRITON_CACHE_DIR"]))
    else:
        var = "TRITON_HOME" if environ.get("TRITON_HOME") else "HOME"
        out.append((var, os.path.join(environ.get("TRITON_HOME") or home, ".triton", "cache")))
    folders = [(var, Path(folder)) for var, folder in out] + gpu_folders(environ)
    return [(var, folder) for var, folder in folders if folder.is_absolute()]


def refuse_foreign_vllm_folders(environ: Mapping[str, str]) -> None:
    """Refuse (ConfigError) a folder vLLM would write in that another user chose
    (``vllm_folders``): ``XDG_CONFIG_HOME`` through ``nobody``'s link in a shared folder had
    every run append its usage record in the folder the link chose, as matplotlib's and uv's
    caches were (issue 41, the forty-first hostile pass; ``foreign.refuse_foreign_chosen``)."""
    from ..workspace.foreign import refuse_foreign_folders

    refuse_foreign_folders(vllm_folders(environ), environ, "vLLM's folder")
