"""What an overlay environment is made of, the overlay's own: the released wheels it installs
(``PINS``), its options, the installer's command (pip or ``uv pip``), and the environment's
``libcudart.so.12`` its library links against. The overlay build mode that uses them is
``kvprefetch.builds.modes.overlay``, a layer above: this package never imports it."""

from __future__ import annotations

import json
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BuildError
from ..machine.uvconfig import refuse_foreign_cache, uv_config_args
from ..runner import NEUTRAL_CWD, run, which

VLLM_PIN = "vllm==0.10.2"
TORCH_PIN = "torch==2.8.0"
XFORMERS_PIN = "xformers==0.0.32.post1"
PINS = (VLLM_PIN, TORCH_PIN, XFORMERS_PIN)
TORCH_VERSION = "2.8.0"
ROUTE_CPP = "kvprefetch_route.cpp"


# One install at a time: the trees build concurrently, and two installs started together into
# a cold cache each download and unpack their own copy (measured with uv: 19 GiB of cache for
# two environments against 9.3 for one). Serialised, the second links from the first's cache.
INSTALLING = threading.Lock()


@dataclass(frozen=True)
class OverlayOptions:
    """What the overlay steps need beyond the common plan fields."""

    cuda_home: str | None = None       # --cuda-home
    allow_cuda_mismatch: bool = False  # --allow-cuda-mismatch
    uv: str | None = None              # the uv executable (uv backend)
    index_url: str | None = None       # PIP_INDEX_URL, passed to uv as UV_INDEX_URL

    def to_dict(self) -> dict[str, Any]:
        return {"cuda_home": self.cuda_home, "allow_cuda_mismatch": self.allow_cuda_mismatch,
                "uv": self.uv, "index_url": self.index_url}


def find_uv() -> str | None:
    """uv on PATH, else beside this interpreter (``pip install uv`` into the kit's venv)."""
    found = which("uv")
    if found:
        return found
    beside = Path(sys.executable).parent / "uv"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def default_backend() -> str:
    """The overlay's environment backend when ``--env-backend`` is not given: uv where found
    (its installs hard-link from one cache), else venv."""
    return "uv" if find_uv() else "venv"


def install_argv(backend: str, python: str, uv: str | None, *packages: str,
                 extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The command installing ``packages`` into the env whose interpreter is ``python``."""
    if backend == "uv":
        if not uv:
            from ..errors import ConfigError
            raise ConfigError("the uv backend was asked for, but uv was not found",
                              "`pip install uv` (into the kit's environment) or use "
                              "--env-backend venv")
        return (uv, *uv_config_args(os.environ), "pip", "install", "--python", python, *extra,
                *packages)
    refuse_foreign_cache(os.environ, "pip")  # pip writes its cache by path, as uv does
    return (python, "-m", "pip", "install", *extra, *packages)


def plugin_install_flags(backend: str) -> tuple[str, ...]:
    if backend == "uv":
        return ("--no-deps", "--offline", "--reinstall")
    return ("--no-deps", "--no-index", "--force-reinstall")


def env_cudart(site: Path) -> Path | None:
    p = site / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12"
    return p if p.is_file() else None


def link_against(link_flags: list[str], cudart: Path | None, cuda_home: Path) -> list[str]:
    """Link the env's own libcudart.so.12 (the one its torch loads) instead of the toolkit's
    ``-lcudart``, which for a toolkit of another major version would name libcudart.so.13."""
    if cudart is None:
        return link_flags
    drop = {"-lcudart", f"-L{cuda_home / 'lib64'}"}
    return [f for f in link_flags if f not in drop] + [str(cudart),
                                                       f"-Wl,-rpath,{cudart.parent}"]


def cudart_imports(nm_output: str) -> dict[str, str]:
    """``symbol -> version`` of the cudart symbols a library imports, from ``nm -D
    --undefined-only`` (lines like ``U cudaGetLastError@libcudart.so.12``)."""
    out = {}
    for line in nm_output.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            name, _, ver = parts[1].partition("@")
            if name.startswith(("cuda", "__cuda")):
                out[name] = ver.lstrip("@")
    return out


def installed_versions(python: str, env: dict[str, str], log: Path) -> dict[str, str]:
    code = ("import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
            "('vllm', 'torch', 'xformers')}))")
    res = run([python, "-c", code], env=env, log=log, echo=False, check=False,
              cwd=NEUTRAL_CWD)
    lines = [ln for ln in res.output.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        raise BuildError(f"{python} does not have vllm, torch and xformers installed:\n"
                         + res.output.strip()[-600:],
                         f"read {log}; rerun the build (the install step resumes)")
    versions: dict[str, str] = json.loads(lines[-1])
    return versions
