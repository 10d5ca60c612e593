"""Which CUDA toolkit compiles an overlay environment's kernels, and why.

The library is compiled against the environment's own torch (2.8.0, built for CUDA 12.8), so
its nvcc should be a CUDA 12.x one: same major version as torch's CUDA, so the runtime API it
compiles against is the one libcudart.so.12 (loaded by torch) implements.

Where one comes from, in order: ``--cuda-home``, ``CUDA_HOME``/``CUDA_PATH``, the toolkit around
``nvcc`` on PATH, ``/usr/local/cuda-<major>.*`` (newest first), ``/usr/local/cuda``.

It cannot come from PyPI alone: the ``nvidia-cuda-nvcc-cu12`` wheels (checked: 12.2.140,
12.4.131, 12.6.85, 12.8.93, 12.9.86) hold ``ptxas``, ``libnvvm`` and the ``crt`` headers only,
with no ``nvcc``, ``cicc``, ``cudafe++`` or ``fatbinary``; the unsuffixed ``nvidia-cuda-nvcc``
wheels that do carry a whole compiler start at 13.0. So where none of the places above has a
CUDA 12 toolkit, the build assembles CUDA 12.4.1 from pinned package archives (``cuda12.py``:
Debian's redistribution of NVIDIA's compiler plus PyPI's runtime headers) into the work
directory, once. Only where that fails (no network) does ``--allow-cuda-mismatch`` accept
compiling with the other major (recorded in the manifest and reported by doctor and
verify-kernel)."""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, KvprefetchError
from ..machine.toolchain import fmt_version, is_toolkit, nvcc_version
from ..runner import which

# Checked against the index on 2026-12-01 (see the module docstring).
NVCC_WHEEL_NOTE = ("PyPI's nvidia-cuda-nvcc-cu12 wheels carry ptxas, libnvvm and libdevice but "
                   "no nvcc, cicc, cudafe++ or fatbinary, so a CUDA 12 compiler cannot come from "
                   "the package index")


@dataclass(frozen=True)
class Toolkit:
    """The toolkit an overlay build compiles with."""

    cuda_home: str
    nvcc: str
    version: tuple[int, int, int]
    source: str              # where it was found: --cuda-home, CUDA_HOME, PATH, /usr/local/...
    torch_cuda: str          # the CUDA version the env's torch was built for, e.g. "12.8"
    matches: bool            # same major version as torch_cuda
    why: str

    def to_dict(self) -> dict[str, object]:
        return {"cuda_home": self.cuda_home, "nvcc": self.nvcc,
                "nvcc_version": fmt_version(self.version), "source": self.source,
                "torch_cuda": self.torch_cuda, "matches_torch_major": self.matches,
                "why": self.why}


def candidate_roots(environ: Mapping[str, str], explicit: str | None = None,
                    fallback_glob: str = "/usr/local/cuda-*",
                    fallback: Sequence[str] = ("/usr/local/cuda",)) -> list[tuple[Path, str]]:
    """(root, where it came from), in the order they are tried, without duplicates."""
    out: list[tuple[Path, str]] = []
    if explicit:
        out.append((Path(explicit), "--cuda-home"))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if environ.get(var):
            out.append((Path(environ[var]), var))
    found = which("nvcc", environ)
    if found:
        # A wrapper script (e.g. /usr/local/bin/nvcc running another nvcc) has no toolkit
        # around it; the toolkit it runs is found by the globs below.
        for p in (Path(found), Path(os.path.realpath(found))):
            if is_toolkit(p.parent.parent):
                out.append((p.parent.parent, f"nvcc on PATH ({found})"))
                break
    out += [(Path(p), p) for p in sorted(glob.glob(fallback_glob), reverse=True)]
    out += [(Path(p), p) for p in fallback]
    seen: set[str] = set()
    uniq = []
    for root, where in out:
        key = os.path.realpath(root)
        if key not in seen and is_toolkit(root):
            seen.add(key)
            uniq.append((root, where))
    return uniq


ASSEMBLED = "assembled from pinned package archives"


def _refuse_a_cuda_home_that_is_no_toolkit(explicit: str | None) -> None:
    """An explicit ``--cuda-home`` that is no toolkit is refused, never passed over:
    ``candidate_roots`` keeps only toolkits, so ``--cuda-home /opt/cuda-12.8-typo`` (or
    ``/dev/zero``, a file, a newline in the name) was dropped without a word and the build
    compiled with whichever other toolkit the machine had (with ``--allow-cuda-mismatch``, a
    CUDA 13 one), and the failure said to pass ``--cuda-home`` or ``--allow-cuda-mismatch``,
    both given (issue 41, the twenty-second hostile pass)."""
    if explicit and not is_toolkit(Path(explicit)):
        raise ConfigError(f"--cuda-home {explicit!r} is no CUDA toolkit: it holds no bin/nvcc "
                          "and include/cuda_runtime.h",
                          "point --cuda-home at a CUDA 12.x toolkit root (the folder holding "
                          "bin/nvcc, e.g. /usr/local/cuda-12.8), or leave it out to use the "
                          "machine's")


def choose_toolkit(torch_cuda: str, environ: Mapping[str, str], *, explicit: str | None = None,
                   allow_mismatch: bool = False,
                   roots: Sequence[tuple[Path, str]] | None = None,
                   assembled: Path | None = None,
                   assemble: Callable[[], Path] | None = None) -> Toolkit:
    """The first toolkit whose nvcc has torch's CUDA major version (``assembled``, the work
    directory's assembled toolkit, is tried after the machine's own); else the toolkit that
    ``assemble()`` makes; else, with ``allow_mismatch``, the first toolkit found; else
    ConfigError naming what was found."""
    try:
        want = int(torch_cuda.split(".")[0])
    except ValueError:
        raise ConfigError(f"cannot read torch's CUDA version {torch_cuda!r}",
                          "install a CUDA build of torch==2.8.0 in the environment") from None
    _refuse_a_cuda_home_that_is_no_toolkit(explicit)
    found: list[tuple[Path, str, tuple[int, int, int]]] = []
    problems: list[str] = []
    candidates = list(roots if roots is not None else candidate_roots(environ, explicit))
    if assembled is not None and not explicit and is_toolkit(assembled):
        candidates.append((assembled, f"{ASSEMBLED} ({assembled})"))
    for root, where in candidates:
        nvcc = root / "bin" / "nvcc"
        try:
            v = nvcc_version(nvcc, environ)
        except KvprefetchError as exc:
            problems.append(f"{nvcc}: {exc.cause.splitlines()[0]}")
            continue
        found.append((root, where, v))
        if v[0] == want:
            return Toolkit(str(root), str(nvcc), v, where, torch_cuda, True,
                           f"nvcc {fmt_version(v)} ({where}) has the major version of the "
                           f"CUDA {torch_cuda} the environment's torch is built for")
    seen = "; ".join([f"CUDA {fmt_version(v)} at {r} ({w})" for r, w, v in found] + problems)
    assembly_error = None
    if assemble is not None and not explicit:
        try:
            root = assemble()
            v = nvcc_version(root / "bin" / "nvcc", environ)
        except KvprefetchError as exc:
            assembly_error = exc
        else:
            return Toolkit(str(root), str(root / "bin" / "nvcc"), v, f"{ASSEMBLED} ({root})",
                           torch_cuda, v[0] == want,
                           f"no CUDA {want}.x toolkit on this machine (found: {seen or 'none'})"
                           f"; nvcc {fmt_version(v)} {ASSEMBLED} (Debian's redistribution of "
                           f"NVIDIA's compiler and PyPI's runtime headers) into {root}")
    if allow_mismatch and found:
        root, where, v = found[0]
        return Toolkit(str(root), str(root / "bin" / "nvcc"), v, where, torch_cuda, False,
                       f"no CUDA {want}.x toolkit here ({NVCC_WHEEL_NOTE}); "
                       f"--allow-cuda-mismatch: compiled with nvcc {fmt_version(v)} ({where}) "
                       f"and its CUDA headers for torch's CUDA {torch_cuda}, linked against "
                       f"the environment's libcudart.so.{want}; running it needs a driver for "
                       f"CUDA {v[0]}.{v[1]}")
    if explicit and not found:
        raise ConfigError(f"--cuda-home {explicit} holds no working bin/nvcc",
                          "point --cuda-home at a CUDA 12.x toolkit root")
    raise ConfigError(
        f"the environment's torch is built for CUDA {torch_cuda}, but no CUDA {want}.x nvcc "
        f"was found (found: {seen or 'no toolkit'}); {NVCC_WHEEL_NOTE}"
        + (f"; assembling one from package archives failed: {assembly_error.cause}"
           if assembly_error else ""),
        f"install a CUDA {want}.8 toolkit (NVIDIA's runfile, apt cuda-toolkit-{want}-8, or "
        f"`conda install -c nvidia cuda-nvcc={want}.8 cuda-cudart-dev={want}.8`) and pass "
        "--cuda-home DIR (or set CUDA_HOME); or pass --allow-cuda-mismatch to compile with the "
        "toolkit that is here (the library then needs a driver for that CUDA version)")
