"""The cmake a full-mode smoke configures vLLM with: ``find_cmake`` finds the first one new
enough for vLLM 0.10.2 (on PATH, then beside the torch environment's python). Here, below
doctor and the build modes, because doctor's smoke checks and the smoke itself both ask."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..runner import run, which

CMAKE_MIN = (3, 26, 1)  # vLLM 0.10.2's requirements/build.txt
CMAKE_FIX = ('pip install "cmake>=3.26.1,<4" into any environment and put its bin/ on PATH '
             "(or into the --torch-from environment)")


def parse_cmake_version(text: str) -> tuple[int, ...] | None:
    m = re.search(r"cmake version (\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(g or 0) for g in m.groups()) if m else None


def find_cmake(environ: dict[str, str],
               extra_dirs: list[Path]) -> tuple[str, tuple[int, ...]] | None:
    """The first cmake >= 3.26.1: on PATH, then in ``extra_dirs`` (the torch env's bin/)."""
    cands = [which("cmake", environ)] + [str(d / "cmake") for d in extra_dirs]
    for c in cands:
        if not c or not os.access(c, os.X_OK):
            continue
        res = run([c, "--version"], env=environ, echo=False, check=False)
        v = parse_cmake_version(res.output)
        if v is not None and v >= CMAKE_MIN:
            return c, v
    return None
