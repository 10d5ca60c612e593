"""A no-device ``libcuda.so.1`` for machines without an NVIDIA driver (CI, this project's CPU
development boxes), used ONLY by verify-kernel's probe processes.

vLLM's ``_C.abi3.so`` names ``libcuda.so.1`` as a needed library, so without a driver it does not
load, ``_C::paged_attention_v1/v2`` are never registered, and there is no dispatch table to
check. The stub exports exactly the driver functions that ``_C.abi3.so`` imports (read with
``nm -D --undefined-only``; two in vLLM 0.10.2), each returning ``CUDA_ERROR_NO_DEVICE`` (100).
With it, ``_C`` loads and the probe checks the host-side dispatch: which function the
dispatcher calls for the ops' CUDA kernels. Nothing runs on a device; launching a kernel, graph
capture and the outputs need a GPU and a real driver. The stub is never put on the path of
``vllm serve`` or ``bench e2e``."""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
from pathlib import Path

from ..errors import VerifyError
from ..runner import NEUTRAL_CWD, run
from ..workspace import confine
from ..workspace.confine import write_file
from ..workspace.ownership import private_dir

CUDA_ERROR_NO_DEVICE = 100
_DRIVER_SYMBOL = re.compile(r"^cu[A-Z]\w*$")


def driver_loadable() -> bool:
    """Whether this machine has an NVIDIA driver library the loader can find."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def driver_imports(nm_output: str) -> list[str]:
    """The unversioned ``cu*`` driver functions among ``nm -D --undefined-only`` lines."""
    out = set()
    for line in nm_output.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U" and _DRIVER_SYMBOL.match(parts[1]):
            out.add(parts[1])
    return sorted(out)


def stub_source(symbols: list[str]) -> str:
    body = "".join(f"int {s}(void) {{ return {CUDA_ERROR_NO_DEVICE}; }}\n" for s in symbols)
    return ("/* kvprefetch verify-kernel: no-device stand-in for libcuda.so.1 (generated). Every "
            "function returns CUDA_ERROR_NO_DEVICE. */\n" + body)


def ensure_stub(vllm_c: Path, dest_root: Path, *,
                root: Path | None = None) -> tuple[Path, list[str]]:
    """Build (or reuse) the stub for the driver imports of ``vllm_c``; returns (its directory,
    the symbols). Keyed by the symbol list, so one stub serves every env of the same vLLM."""
    # nm itself missing is runner's "not found on the PATH"; a non-zero exit is the file: a
    # FIFO, an empty or a non-ELF `_C*.so` next to where a (forged) build manifest's so_path
    # says the env is. It said "install binutils (nm)", which nm's presence cannot fix (issue
    # 41, the twenty-ninth hostile pass)
    fix = ("rebuild the overlay environment (`kvprefetch build --mode overlay`), or move its "
           "build folder (the manifest naming it) out of build/")
    try:
        what = confine.what_is(vllm_c)  # a link followed, as nm and the loader follow it
    except OSError as exc:
        what = f"unreadable ({exc.strerror})"
    if what != "a file":
        raise VerifyError(f"{vllm_c} (the overlay environment's vLLM library) is {what}, not "
                          "a library", fix)
    # an absolute path, from /: a manifest's relative so_path of `--plugin=/x/a/b.so` made
    # this `nm --plugin=/x/a/vllm/_C.abi3.so`, and nm loaded (ran) that library from outside
    # the work directory on `a.out` in the user's working folder (issue 41, the thirty-second
    # hostile pass); an absolute path is never an option, and / holds no a.out
    nm = run(["nm", "-D", "--undefined-only", os.path.abspath(vllm_c)], echo=False,
             check=False, cwd=NEUTRAL_CWD)
    if nm.returncode != 0:
        raise VerifyError(f"cannot read the driver imports of {vllm_c} (the overlay "
                          "environment's vLLM library): nm says "
                          f"{nm.output.strip()[-300:] or f'nothing, exit {nm.returncode}'}",
                          fix)
    symbols = driver_imports(nm.output)
    src = stub_source(symbols)
    key = hashlib.sha256(src.encode()).hexdigest()[:12]
    d = dest_root / key
    lib = d / "libcuda.so.1"
    if root is not None:
        confine.check_target(root, lib, what="keep the driver stub in", family=VerifyError)
    if not confine.is_plain_file(lib):
        # compiled in a private folder outside the work directory and copied in from the work
        # directory down (``root``), never through a link: by path, a ``verify/`` that was a
        # link to a folder outside had the folder, stub.c and the library gcc wrote made there
        # (issue 41, the seventeenth hostile pass)
        with private_dir("driver-stub") as tmp:
            write_file(tmp / "stub.c", src, root=tmp, family=VerifyError)
            res = run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o",
                       str(tmp / "libcuda.so.1"), str(tmp / "stub.c")], echo=False, check=False)
            if res.returncode != 0:
                raise VerifyError(f"could not build the no-device driver stub: "
                                  f"{res.output.strip()[-300:]}", "install gcc")
            write_file(d / "stub.c", src, root=root, family=VerifyError)
            write_file(lib, (tmp / "libcuda.so.1").read_bytes(), root=root, mode=0o755,
                       family=VerifyError)
    return d, symbols
