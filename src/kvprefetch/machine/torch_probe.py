"""Which torch a build compiles against: ``probe_torch`` runs the stdlib probe
(``probe/torch_info.py``) with an environment's own python and returns its include and library
paths, ABI and CUDA version as a ``TorchInfo``; ``default_torch_python`` is the torch 2.8.0
interpreter the full-mode smoke uses when none is given (the baseline overlay environment).

Here, below doctor and the build modes, because both ask it: doctor's smoke checks probe the
torch the smoke would use, and the kernels-only, overlay and smoke modes probe theirs."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BuildError
from ..oserrors import child_limit_fix
from ..runner import run
from ..workspace.workdir import Workdir


@dataclass(frozen=True)
class TorchInfo:
    python: str
    prefix: str
    torch_version: str
    torch_cuda: str | None
    include_paths: tuple[str, ...]
    library_paths: tuple[str, ...]
    cxx11_abi: bool
    common_nvcc_flags: tuple[str, ...]
    nvidia_include_paths: tuple[str, ...]

    @property
    def cxx_std(self) -> str:
        m = re.match(r"(\d+)\.(\d+)", self.torch_version)
        major_minor = (int(m.group(1)), int(m.group(2))) if m else (2, 10)
        return "c++20" if major_minor >= (2, 10) else "c++17"


def probe_script(name: str) -> Path:
    return Path(__file__).resolve().parent.parent / "probe" / name


def probe_torch(python: str, env: dict[str, str], log: Path | None = None) -> TorchInfo:
    # the record is read as UTF-8: a user's PYTHONIOENCODING (utf-16) made the probe's output
    # unreadable and the interpreter "not a Python with torch" (issue 41, the twenty-third pass)
    res = run([python, str(probe_script("torch_info.py"))],
              env={**env, "PYTHONIOENCODING": "utf-8"}, log=log, echo=False, check=False,
              cwd="/")
    if res.returncode != 0:
        raise BuildError(f"{python} cannot import torch (needed to compile against it): "
                         + _last_words(res.output),
                         child_limit_fix(res.output)  # `ulimit -v`: torch is there
                         or "install a CUDA build of torch in that environment, or build with "
                         "--torch-from PYTHON naming an interpreter that has one (`PYTHON -c "
                         "'import torch'` shows the whole error)")
    d = _probe_record(res.output)
    if d is None:
        # `--torch-from /bin/true` (or /bin/echo, a wrapper printing something else, a torch
        # that exits 0 while it imports): no record, or not the probe's; was an IndexError or
        # JSONDecodeError traceback (issue 41, ninth hostile pass)
        raise BuildError(f"{python} did not answer the torch probe as a Python interpreter "
                         "with torch does (no record of torch's version, CUDA and paths in "
                         f"its output: {_last_words(res.output) or 'nothing'})",
                         "pass --torch-from the path of a Python interpreter that has a CUDA "
                         "build of torch (e.g. .venv/bin/python)")
    if not d.get("torch_cuda"):
        raise BuildError(f"the torch in {python} ({d['torch_version']}) is a CPU-only build",
                         "install a CUDA build of torch (e.g. pip install torch==2.14.1 from an "
                         "index that serves CUDA wheels)")
    return TorchInfo(d["python"], d["prefix"], d["torch_version"], d["torch_cuda"],
                     tuple(d["include_paths"]), tuple(d["library_paths"]), d["cxx11_abi"],
                     tuple(d["common_nvcc_flags"]), tuple(d.get("nvidia_include_paths", ())))


_FIELDS: dict[str, type | tuple[type, ...]] = {
    "python": str, "prefix": str, "torch_version": str, "torch_cuda": (str, type(None)),
    "include_paths": list, "library_paths": list, "cxx11_abi": (bool, int),
    "common_nvcc_flags": list}


def _probe_record(output: str) -> dict[str, Any] | None:
    """The probe's record (its last line that is a JSON object with every field, of its
    type), or None."""
    for ln in reversed(output.splitlines()):
        if not ln.startswith("{"):
            continue
        try:
            d = json.loads(ln)
        except ValueError:
            return None
        if not isinstance(d, dict) or any(not isinstance(d.get(k), t)
                                          for k, t in _FIELDS.items()):
            return None
        lists = [d[k] for k, t in _FIELDS.items() if t is list]
        lists.append(d.get("nvidia_include_paths", []))
        if not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in lists):
            return None
        return d
    return None


def _last_words(output: str) -> str:
    """The last non-empty line of a child's output (a traceback's exception line), bounded:
    the whole traceback of someone else's interpreter is not the kit's message."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def default_torch_python(wd: Workdir) -> str | None:
    """The baseline overlay environment's python (``build --mode overlay`` makes it: torch
    2.8.0 with vLLM's pins), when it exists."""
    py = wd.overlay_env("baseline") / "bin" / "python"
    return str(py) if py.exists() else None


def probe_answer(output: str, python: str | os.PathLike[str]) -> dict[str, Any]:
    """The probe's record: the last line of ``python``'s output, a JSON object; a python that
    prints nothing or something else (`--torch-from /bin/true`, an env's python replaced) is
    one BuildError naming it, not an IndexError or JSONDecodeError traceback (issue 41, ninth
    hostile pass)."""
    lines = output.strip().splitlines()
    try:
        info = json.loads(lines[-1]) if lines else None
    except ValueError:
        info = None
    if not isinstance(info, dict):
        said = lines[-1][:300] if lines else "nothing"
        raise BuildError(f"{python} did not answer the environment probe as a Python "
                         f"interpreter does (its output: {said})",
                         "pass the path of a Python interpreter, or recreate the environment "
                         f"holding {python} (rerun with --force)")
    return info
