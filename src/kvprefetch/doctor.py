"""The preflight (``kvprefetch doctor``, also run by ``build``): checks the machine against what a
full or kernels-only build of both trees needs, and explains every failure with "To fix: ...".

Each check is a small function returning ``Check`` rows; ``run_doctor`` collects them into a
frozen ``DoctorReport``. What touches the outside world (free disk, memory, network, the GPU
query, where toolkits may live) is a field of ``DoctorProbes`` so tests can simulate a full
disk or an unreachable GitHub; everything else runs the real tools through the runner,
including a real nvcc compile of the bulk-prefetch instruction."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .build.envs import find_conda, refuse_precompiled
from .build.toolchain import (
    DEFAULT_CUDA_ROOTS,
    GIB_PER_NVCC_JOB,
    CudaArch,
    check_nvcc_for_arch,
    cuda_home,
    default_jobs,
    find_cuobjdump,
    find_nvcc,
    fmt_version,
    gencode_flags,
    host_resources,
    nvcc_gpu_archs,
    nvcc_version,
    parse_arch_list,
    vllm_c_archs,
)
from .errors import ConfigError, KvprefetchError
from .runner import run, which
from .workspace import ownership
from .workspace.workdir import Workdir

Status = Literal["ok", "warn", "fail", "skip"]
Mode = Literal["full", "kernels-only", "overlay"]
GIB = 2**30

# Disk estimates. Full: two unpacked trees with their CMake build dirs and FetchContent deps
# (~12 GB each with CUTLASS/FA/FlashMLA objects), two envs with torch 2.8.0 + CUDA wheels
# (~6 GB each) and a shared ccache (~5 GB). Kernels-only: per tree its unpacked sources (40 MB),
# its objects and library (~26 MB) and a small env that inherits torch (~12 MB), plus the
# pristine sources and the sdist (~51 MB) and verify-kernel's cache: the four trees main.sh
# builds took 0.36 GB (issue 42; the estimate was 3 GB). 0.5 GB leaves room for more trees.
# Overlay: see overlay_disk_gb.
DISK_ESTIMATE_GB: dict[str, float] = {"full": 40.0, "kernels-only": 0.5}
# One released vLLM 0.10.2 install (vllm, torch 2.8.0, xformers, triton and the CUDA 12 wheels
# they pull) unpacks to 9.3 GiB (measured: uv's cache after one cold install); the work
# directory's own part (trees, the assembled CUDA 12 toolkit, the two libraries) about 0.5 GiB.
OVERLAY_INSTALL_GB = 10.0
OVERLAY_OWN_GB = 1.0
# torch 2.8.0, which vLLM 0.10.2 pins, is built for CUDA 12.8: the overlay compiles against it.
OVERLAY_TORCH_CUDA = "12.8"
DEFAULT_INDEX = "https://pypi.org/simple/"
CMAKE_MIN = (3, 26, 1)  # vLLM 0.10.2 requirements/build.txt: cmake>=3.26.1
DEPS_VARS = ("VLLM_CUTLASS_SRC_DIR", "VLLM_FLASH_ATTN_SRC_DIR", "FLASH_MLA_SRC_DIR")
GITHUB_URL = "https://github.com/"

# A tiny kernel with the instruction the patch adds, behind the same kind of guard, so every arch
# of the user's list must assemble (sm_90: UBLKPF.L2; older: prefetch.global.L2 -> CCTL).
PROBE_CU = r"""
__global__ void kvprefetch_probe(const char* p, unsigned n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(p), "r"(n) : "memory");
#elif defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" :: "l"(p));
#endif
}
"""


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str | None = None


def _existing(path: Path) -> Path:
    """``path``, or its nearest parent that exists (a work directory not made yet)."""
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _disk_free(path: Path) -> int:
    return shutil.disk_usage(_existing(path)).free


def check_url(url: str = GITHUB_URL, *, timeout: float = 5.0,
              environ: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """(reachable, detail): one HEAD request, through the proxies of ``environ``; any HTTP
    answer, even an error status, means the host is reachable."""
    environ = os.environ if environ is None else environ
    proxies = {k.lower()[:-6]: v for k, v in environ.items()
               if k.lower() in ("http_proxy", "https_proxy") and v}
    opener = urllib.request.build_opener(urllib.request.ProxyHandler(proxies))
    t0 = time.monotonic()
    try:
        with opener.open(urllib.request.Request(url, method="HEAD"), timeout=timeout) as resp:
            code = resp.status
    except urllib.error.HTTPError as exc:
        code = exc.code
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, f"{url} unreachable: {reason}"
    return True, f"{url} answered HTTP {code} in {time.monotonic() - t0:.1f} s"


def _query_gpus(environ: Mapping[str, str]) -> list[tuple[str, str]] | None:
    """[(compute_cap, name)] from nvidia-smi; None when there is no nvidia-smi."""
    if which("nvidia-smi", environ) is None:
        return None
    done = run(["nvidia-smi", "--query-gpu=compute_cap,name", "--format=csv,noheader"],
               env=environ, echo=False, check=False, timeout=30)
    if done.returncode != 0:
        return []
    rows = []
    for line in done.output.splitlines():
        parts = [p.strip() for p in line.split(",", 1)]
        if len(parts) == 2 and re.fullmatch(r"\d+\.\d+", parts[0]):
            rows.append((parts[0], parts[1]))
    return rows


@dataclass(frozen=True)
class DoctorProbes:
    """The outside world, injectable for tests."""

    disk_free: Callable[[Path], int] = _disk_free
    disk_estimate_gb: Mapping[str, float] = field(default_factory=lambda: dict(DISK_ESTIMATE_GB))
    resources: Callable[[], tuple[int, float]] = host_resources
    network: Callable[[Mapping[str, str]], tuple[bool, str]] = (
        lambda env: check_url(GITHUB_URL, timeout=5.0, environ=env))
    gpus: Callable[[Mapping[str, str]], list[tuple[str, str]] | None] = _query_gpus
    index: Callable[[str, Mapping[str, str]], tuple[bool, str]] = (
        lambda url, env: check_url(url, timeout=10.0, environ=env))
    cuda_roots: Sequence[Path] = DEFAULT_CUDA_ROOTS


@dataclass(frozen=True)
class DoctorReport:
    mode: str
    arch_list: str
    checks: tuple[Check, ...]
    mode_reason: str = ""  # why this mode was checked (see choose_mode)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.status == "fail")

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "mode": self.mode, "mode_reason": self.mode_reason,
                "arch_list": self.arch_list, "checks": [c.__dict__ for c in self.checks]}

    def raise_if_failed(self) -> None:
        """ConfigError listing each failing check's cause, then each one's fix."""
        bad = self.failures
        if not bad:
            return
        cause = f"preflight ({self.mode}, --arch {self.arch_list}) found {len(bad)} problem(s):"
        cause += "".join(f"\n  - {c.name}: {c.detail}" for c in bad)
        fix = "".join(f"\n  - {c.name}: {c.fix or 'see above'}" for c in bad)
        raise ConfigError(cause, fix)


# --------------------------------------------------------------------------- the checks

def _check_nvcc(archs: Sequence[CudaArch], environ: Mapping[str, str], mode: Mode,
                probes: DoctorProbes) -> tuple[list[Check], Path | None, tuple[int, int, int] | None]:
    checks: list[Check] = []
    nvcc = find_nvcc(environ, fallback_roots=probes.cuda_roots)
    if nvcc is None:
        explicit = environ.get("CUDA_HOME") or environ.get("CUDA_PATH")
        if explicit:
            where = f"CUDA_HOME/CUDA_PATH={explicit} has no bin/nvcc"
        else:
            roots = "".join(f", {r}/bin" for r in probes.cuda_roots)
            where = f"nvcc not found (looked on PATH{roots})"
        return [Check("nvcc", "fail", where,
                      "install a CUDA toolkit >= 12.8 and set CUDA_HOME to it (or put its "
                      "bin/ on PATH)")], None, None
    try:
        version = nvcc_version(nvcc, environ)
        warns = check_nvcc_for_arch(version, archs, nvcc_gpu_archs(nvcc, environ))
    except KvprefetchError as exc:
        return [Check("nvcc", "fail", f"{nvcc}: {exc.cause}", exc.fix)], nvcc, None
    detail = f"{nvcc} (CUDA {fmt_version(version)})"
    if mode == "full" and version[0] != 12:
        warns += (f"torch 2.8.0, which vLLM 0.10.2 pins, is built for CUDA 12.8; a full "
                  f"build with CUDA {version[0]} is not what vLLM tests"),
    if warns:
        checks.append(Check("nvcc", "warn", detail + "; " + " ".join(warns),
                            "install CUDA 12.8 and set CUDA_HOME to it"))
    else:
        checks.append(Check("nvcc", "ok", detail))
    return checks, nvcc, version


def _check_cuda_libs(environ: Mapping[str, str], probes: DoctorProbes) -> Check:
    """A full build's CMake links _C against CUDA::cuda_driver (libcuda.so, from the toolkit's
    stubs/ on a machine without a driver) and finds CUDA_nvrtc_LIBRARY; a toolkit without them
    stops the configure (shared/deps/README.md records this machine's case)."""
    home = cuda_home(environ, fallback_roots=probes.cuda_roots)
    if home is None:
        return Check("cuda-libs", "skip", "no toolkit found (see cuda-home)")
    libdirs = [home / "lib64", home / "lib64" / "stubs",
               home / "targets" / "x86_64-linux" / "lib",
               home / "targets" / "x86_64-linux" / "lib" / "stubs"]
    missing = [name for name in ("libcuda.so", "libnvrtc.so")
               if not any((d / name).exists() for d in libdirs)]
    if not missing:
        return Check("cuda-libs", "ok", f"libcuda.so (driver or stub) and libnvrtc.so in {home}")
    return Check("cuda-libs", "fail",
                 f"{home} has no {' and no '.join(missing)} (looked in lib64/, lib64/stubs/ and "
                 "targets/x86_64-linux/lib/): vLLM's CMake links _C against CUDA::cuda_driver "
                 "and looks up CUDA_nvrtc_LIBRARY, so the configure stops",
                 "install the toolkit's driver stub and NVRTC (apt: cuda-driver-dev-12-8 and "
                 "cuda-nvrtc-dev-12-8, or NVIDIA's full runfile toolkit)")


def _check_overlay_toolkit(environ: Mapping[str, str], cuda_home_opt: str | None,
                           allow_mismatch: bool, workdir: Path, probes: DoctorProbes
                           ) -> tuple[Check, Path | None, tuple[int, int, int] | None]:
    """Which toolkit an overlay build would compile with, and why (overlay.toolkit). Where the
    machine has no CUDA 12 toolkit, the build assembles one (overlay.cuda12); doctor does not
    download it, only checks that its sources are reachable."""
    from .overlay.cuda12 import DEBIAN_MIRROR, PARTS, RELEASE, toolkit_dir
    from .overlay.toolkit import choose_toolkit

    try:
        tk = choose_toolkit(OVERLAY_TORCH_CUDA, environ, explicit=cuda_home_opt,
                            assembled=toolkit_dir(workdir))
    except KvprefetchError as exc:
        if cuda_home_opt:
            return Check("toolkit", "fail", exc.cause, exc.fix), None, None
        reachable, detail = probes.index(DEBIAN_MIRROR, environ)
        size = sum(p.size for p in PARTS) / 1e6
        if reachable:
            return (Check("toolkit", "ok",
                          f"no CUDA 12 toolkit on this machine; the build will assemble CUDA "
                          f"{RELEASE} ({size:.0f} MB of pinned archives from {DEBIAN_MIRROR} "
                          f"and the package index) into {toolkit_dir(workdir)}, once"),
                    None, None)
        if allow_mismatch:
            try:
                tk = choose_toolkit(OVERLAY_TORCH_CUDA, environ, allow_mismatch=True)
            except KvprefetchError as exc2:
                return Check("toolkit", "fail", exc2.cause, exc2.fix), None, None
        else:
            return (Check("toolkit", "fail", f"{exc.cause}; and {DEBIAN_MIRROR}, where the "
                          f"build would assemble CUDA {RELEASE} from, is unreachable: {detail}",
                          exc.fix), None, None)
    detail = f"{tk.nvcc} (CUDA {fmt_version(tk.version)}): {tk.why}"
    if not tk.matches:
        return (Check("toolkit", "warn", detail,
                      "install a CUDA 12.8 toolkit and pass --cuda-home to match torch 2.8.0"),
                Path(tk.nvcc), tk.version)
    return Check("toolkit", "ok", detail), Path(tk.nvcc), tk.version


def _check_index(environ: Mapping[str, str], probes: DoctorProbes) -> Check:
    """An overlay build installs vllm==0.10.2, torch==2.8.0 and xformers from the index."""
    url = environ.get("UV_INDEX_URL") or environ.get("PIP_INDEX_URL") or DEFAULT_INDEX
    reachable, detail = probes.index(url, environ)
    if reachable:
        return Check("package-index", "ok", detail)
    return Check("package-index", "fail", detail + "; the overlay installs vllm==0.10.2, "
                 "torch==2.8.0 and xformers==0.0.32.post1 from it",
                 "make the index reachable, or point PIP_INDEX_URL / UV_INDEX_URL at a mirror")


@contextmanager
def _scratch(workdir: Path, read_only: bool) -> Iterator[Path]:
    """Where the compile probe writes: the work directory's scratch space when kvprefetch made
    that directory (doctor never creates or adopts one) and the run may write there, else a
    system temp directory. ``kvprefetch doctor`` and dry runs (``read_only``) write nothing
    into the work directory (issue 41, class 6: `build --dry-run` rewrote the ownership record
    to record this scratch folder)."""
    if not read_only and Workdir(workdir).is_tagged():
        with ownership.scratch_dir(workdir, "doctor") as d:
            yield d
    else:
        with tempfile.TemporaryDirectory(prefix="kvprefetch-doctor-") as tmp:
            yield Path(tmp)


def _check_compile(nvcc: Path, archs: Sequence[CudaArch], version: tuple[int, int, int],
                   environ: Mapping[str, str], workdir: Path, read_only: bool = False) -> Check:
    """Compile PROBE_CU for the gencode flags the paged-attention TUs get; count UBLKPF."""
    try:
        flags = gencode_flags(archs, cuda_version=version)
    except ConfigError as exc:
        return Check("nvcc-compile", "fail", exc.cause, exc.fix)
    with _scratch(workdir, read_only) as tmp:
        src, obj = tmp / "probe.cu", tmp / "probe.o"
        src.write_text(PROBE_CU)
        t0 = time.monotonic()
        done = run([str(nvcc), "-c", *flags, "-o", str(obj), str(src)], env=environ,
                   echo=False, check=False, timeout=300)
        took = time.monotonic() - t0
        targets = ", ".join(f.rsplit("code=", 1)[1] for f in flags)
        if done.returncode != 0:
            return Check("nvcc-compile", "fail",
                         f"nvcc could not compile the prefetch probe for {targets}: "
                         + done.output.strip()[-500:],
                         "use a CUDA toolkit >= 12.8 whose nvcc supports every --arch you pass")
        detail = f"compiled the prefetch probe for {targets} in {took:.1f} s"
        hopper = any(a.has_bulk_prefetch for a in vllm_c_archs(archs, version))
        if not hopper:
            return Check("nvcc-compile", "warn",
                         detail + "; no arch >= 9.0 in the list, so the patch compiles only to "
                         "the pre-Hopper prefetch.global.L2",
                         "add 9.0a to --arch to get cp.async.bulk.prefetch (UBLKPF)")
        tools = find_cuobjdump(environ)
        if tools is None:
            return Check("nvcc-compile", "ok", detail + " (no cuobjdump to read the SASS)")
        sass = run([str(tools.cuobjdump), "-sass", str(obj)], env=tools.environ(environ),
                   echo=False, check=False, timeout=120)
        n = sass.output.count("UBLKPF")
        if sass.returncode != 0 or n == 0:
            return Check("nvcc-compile", "fail",
                         detail + f", but the sm_90 SASS holds no UBLKPF ({tools.cuobjdump} "
                         f"exit {sass.returncode})",
                         "check that cuobjdump and nvdisasm come from a CUDA >= 12.0 toolkit")
        return Check("nvcc-compile", "ok", detail + f"; SASS holds {n} UBLKPF.L2")


def _check_cuda_home(environ: Mapping[str, str], probes: DoctorProbes) -> Check:
    explicit = environ.get("CUDA_HOME") or environ.get("CUDA_PATH")
    home = cuda_home(environ, fallback_roots=probes.cuda_roots)
    if explicit:
        ok = home is not None and (home / "bin" / "nvcc").is_file()
        return Check("cuda-home", "ok" if ok else "fail", f"CUDA_HOME={explicit}",
                     None if ok else "point CUDA_HOME at a CUDA toolkit root (with bin/nvcc)")
    if home is None:
        return Check("cuda-home", "fail", "CUDA_HOME is not set and no toolkit was found",
                     "install CUDA >= 12.8 and export CUDA_HOME=/usr/local/cuda-12.8")
    # torch guesses CUDA_HOME as dirname(dirname(which nvcc)) without resolving links.
    guess = which("nvcc", environ)
    torch_guess = Path(guess).parent.parent if guess else home
    if torch_guess != home:
        return Check("cuda-home", "warn",
                     f"CUDA_HOME is not set; the toolkit is {home}, but torch would guess "
                     f"{torch_guess} from {guess}", f"export CUDA_HOME={home}")
    return Check("cuda-home", "ok", f"not set; toolkit found at {home}")


def _tool_version(argv: list[str], environ: Mapping[str, str]) -> tuple[int, ...] | None:
    done = run(argv, env=environ, echo=False, check=False, timeout=60)
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", done.output)
    if done.returncode != 0 or m is None:
        return None
    return tuple(int(x) for x in m.groups(default="0"))


def _check_gcc(environ: Mapping[str, str]) -> Check:
    if which("g++", environ) is None or which("gcc", environ) is None:
        return Check("gcc", "fail", "gcc/g++ not found on PATH (nvcc needs a host compiler)",
                     "install gcc and g++ >= 10 (e.g. apt-get install build-essential)")
    v = _tool_version(["gcc", "-dumpfullversion", "-dumpversion"], environ)
    if v is None:
        return Check("gcc", "fail", "`gcc -dumpfullversion` failed", "reinstall gcc")
    if v[0] < 10:
        return Check("gcc", "warn", f"gcc {fmt_version(v)}: torch >= 2.10 headers need C++20",
                     "install gcc >= 10")
    return Check("gcc", "ok", f"gcc {fmt_version(v)}")


def _check_cmake(environ: Mapping[str, str]) -> Check:
    fix = 'pip install "cmake>=3.26.1" (into the build environment)'
    if which("cmake", environ) is None:
        return Check("cmake", "fail", "cmake not found on PATH", fix)
    v = _tool_version(["cmake", "--version"], environ)
    if v is None or v < CMAKE_MIN:
        shown = fmt_version(v) if v else "unknown"
        return Check("cmake", "fail", f"cmake {shown} < 3.26.1, which vLLM 0.10.2 requires", fix)
    return Check("cmake", "ok", f"cmake {fmt_version(v)}")


# build --mode full --smoke: the unpacked deps, two tree copies, CMake's binary dirs and the
# four attention objects (measured: about 0.4 GiB).
SMOKE_DISK_GB = 2.0


def shares_one_install(backend: str, workdir: Path,
                       environ: Mapping[str, str]) -> tuple[bool, str]:
    """(shared, why): whether the environments' installs hard-link from one copy on the work
    directory's disk. uv links from its cache by default on Linux (``UV_LINK_MODE`` unset or
    ``hardlink``), but only within one file system: elsewhere it copies. pip and conda unpack
    a copy into every environment."""
    if backend != "uv":
        return False, f"{backend} unpacks a copy into each environment"
    mode = environ.get("UV_LINK_MODE") or "hardlink"
    if mode not in ("hardlink", "symlink"):
        return False, f"UV_LINK_MODE={mode}: uv copies into each environment"
    from .overlay.build import find_uv

    uv = find_uv()
    done = run([uv, "cache", "dir"], env=dict(environ), echo=False, check=False,
               timeout=30) if uv else None
    if done is None or done.returncode != 0 or not done.output.strip():
        return False, "uv's cache directory is unknown (`uv cache dir` failed)"
    cache = Path(done.output.strip().splitlines()[-1])
    if _existing(cache).stat().st_dev != _existing(workdir).stat().st_dev:
        return False, (f"uv's cache {cache} is on another file system: uv copies into each "
                       "environment")
    return True, f"uv hard-links every environment from its cache {cache} on this disk"


def overlay_disk_gb(envs: int, shared: bool) -> float:
    """What an overlay build of ``envs`` environments needs on the work directory's disk: one
    install when the environments hard-link from one cache there, else one per environment."""
    return OVERLAY_OWN_GB + OVERLAY_INSTALL_GB * (1 if shared else max(1, envs))


def _check_disk(workdir: Path, mode: Mode, probes: DoctorProbes, smoke: bool = False,
                environ: Mapping[str, str] | None = None, env_backend: str | None = None,
                envs: int = 2) -> Check:
    how = ""
    if smoke:
        need = SMOKE_DISK_GB
    elif mode == "overlay":
        from .overlay.build import default_backend

        shared, why = shares_one_install(env_backend or default_backend(), workdir,
                                         environ if environ is not None else os.environ)
        need = overlay_disk_gb(envs, shared)
        how = f" for {envs} environment(s): {why}"
    else:
        need = probes.disk_estimate_gb[mode]
    free = probes.disk_free(workdir) / GIB
    what = "the full-mode smoke" if smoke else \
        f"{'an' if mode == 'overlay' else 'a'} {mode} build"
    detail = f"{free:.1f} GiB free at {workdir}, {what} needs about {need:.0f} GiB{how}"
    fix = f"free space or pass --workdir on a disk with at least {need:.0f} GiB free"
    if free < need:
        return Check("disk", "fail", detail, fix)
    if free < 1.5 * need:
        return Check("disk", "warn", detail + " (little headroom)", fix)
    return Check("disk", "ok", detail)


def _check_memory(archs: Sequence[CudaArch], probes: DoctorProbes) -> Check:
    cores, mem = probes.resources()
    jobs, threads = default_jobs(cores, mem, n_archs=max(1, len(archs)))
    detail = (f"{cores} cores, {mem:.1f} GiB available: MAX_JOBS={jobs} NVCC_THREADS={threads} "
              f"({GIB_PER_NVCC_JOB} GiB per compile job)")
    if mem < GIB_PER_NVCC_JOB:
        return Check("memory", "warn", detail + "; even one job may run out of memory",
                     "close other programs or add swap; --jobs 1")
    return Check("memory", "ok", detail)


def _check_estimate(archs: Sequence[CudaArch], mode: Mode, probes: DoctorProbes,
                    trees: int) -> Check:
    """How long `build` would compile here, said as `build` says it (build/foresight.py): a
    kernels-only or overlay build of ``trees`` trees with every instantiation; over ten minutes,
    `build` asks first at a terminal (or takes --yes)."""
    from .build.foresight import CONFIRM_OVER_S, compile_seconds
    from .build.progress import clock
    from .build.selection import Selection

    if mode == "full":
        return Check("estimate", "ok", "a full vLLM build takes hours per tree; at a terminal "
                     "`build` asks before starting (--yes does not ask)")
    cores, mem = probes.resources()
    jobs, _ = default_jobs(cores, mem, n_archs=max(1, len(archs)))
    kernels = Selection().kernel_count()
    secs = compile_seconds(trees, kernels, len(vllm_c_archs(archs)) if archs else 1,
                           min(cores, jobs))
    detail = (f"about {clock(secs)} to compile {trees} trees with all {kernels} instantiations "
              f"per source on {cores} cores")
    if secs > CONFIRM_OVER_S:
        detail += ("; `build` asks before starting at a terminal (--yes does not ask; "
                   "--head-sizes 128 --block-sizes 16 narrows it to minutes)")
    return Check("estimate", "ok", detail)


def _check_git_network(environ: Mapping[str, str], mode: Mode, need_network: bool | None,
                       probes: DoctorProbes) -> list[Check]:
    checks = []
    if which("git", environ) is None:
        checks.append(Check("git", "fail" if mode == "full" else "warn", "git not found on PATH",
                            "install git (CMake's FetchContent clones CUTLASS, "
                            "vllm-flash-attn and FlashMLA with it)"))
    else:
        v = _tool_version(["git", "--version"], environ)
        checks.append(Check("git", "ok", f"git {fmt_version(v) if v else '?'}"))
    deps = {v: environ.get(v, "") for v in DEPS_VARS}
    missing_dirs = [f"{k}={d}" for k, d in deps.items() if d and not Path(d).is_dir()]
    if missing_dirs:
        checks.append(Check("deps-dirs", "fail", f"not a directory: {', '.join(missing_dirs)}",
                            "point them at recursive clones of the FetchContent dependencies"))
    if need_network is None:
        need_network = mode == "full" and not all(deps.values())
    if not need_network:
        why = ("local dependency clones given" if mode == "full" else
               "kernels-only builds need no download")
        checks.append(Check("network", "skip", f"not needed: {why}"))
        return checks
    reachable, detail = probes.network(environ)
    if reachable:
        checks.append(Check("network", "ok", detail))
    else:
        checks.append(Check(
            "network", "fail", detail + "; CMake FetchContent clones CUTLASS v4.0.0, "
            "vllm-flash-attn ee4d25bd and FlashMLA a757314c from GitHub during a full build",
            "make github.com reachable (or set https_proxy), or give local recursive clones: "
            "--deps-dir DIR, or VLLM_CUTLASS_SRC_DIR, VLLM_FLASH_ATTN_SRC_DIR and "
            "FLASH_MLA_SRC_DIR; or build with --kernels-only"))
    return checks


def _smoke_checks(environ: Mapping[str, str], wd: Path, torch_from: str | None,
                  cuda_home_opt: str | None
                  ) -> tuple[list[Check], Path | None, tuple[int, int, int] | None]:
    """What ``build --mode full --smoke`` needs (build/full_smoke.py): torch 2.8.0 in some
    environment, a CUDA toolkit of torch's major version, cmake >= 3.26.1 and ninja. Its
    missing driver stub and NVRTC are supplied by the smoke's toolkit view (link-time
    stand-ins), so they are not a failure here."""
    from .build.full_smoke import CMAKE_FIX, default_torch_python, find_cmake
    from .build.kernels_only import probe_torch
    from .overlay.cuda12 import toolkit_dir
    from .overlay.toolkit import choose_toolkit

    env = dict(environ)
    checks: list[Check] = []
    workdir = Workdir(wd.resolve())
    py = torch_from or default_torch_python(workdir)
    torch_cuda = None
    if py is None:
        checks.append(Check("smoke-torch", "fail", "no environment with torch==2.8.0 given",
                            "give --torch-from PYTHON (torch==2.8.0), or build --mode overlay "
                            f"first ({workdir.overlay_env('baseline')} is the default)"))
    else:
        try:
            t = probe_torch(py, env)
            torch_cuda = t.torch_cuda
            ok = t.torch_version.startswith("2.8.0")
            checks.append(Check("smoke-torch", "ok" if ok else "fail",
                                f"{py}: torch {t.torch_version} (CUDA {t.torch_cuda})",
                                None if ok else "vLLM 0.10.2 pins torch==2.8.0: give "
                                "--torch-from an interpreter that has it"))
        except KvprefetchError as exc:
            checks.append(Check("smoke-torch", "fail", exc.cause.splitlines()[0], exc.fix))
    nvcc = version = None
    if torch_cuda:
        try:
            tk = choose_toolkit(torch_cuda, env, explicit=cuda_home_opt,
                                assembled=toolkit_dir(workdir.root))
            nvcc, version = Path(tk.nvcc), tk.version
            checks.append(Check("smoke-toolkit", "ok", tk.why + "; the driver stub, NVRTC and "
                                "CUDA libraries CMake asks for come from a view the smoke makes "
                                "(the environment's nvidia-*-cu12 wheels, link stand-ins)"))
        except KvprefetchError as exc:
            checks.append(Check("smoke-toolkit", "fail", exc.cause.splitlines()[0],
                                f"{exc.fix} (or `kvprefetch build --mode overlay`, which "
                                "assembles CUDA 12.4.1 into the work directory)"))
    else:
        checks.append(Check("smoke-toolkit", "skip", "no torch to match (see smoke-torch)"))
    cm = find_cmake(env, [Path(py).parent] if py else [])
    checks.append(Check("cmake", "ok", f"cmake {fmt_version(cm[1])} ({cm[0]})") if cm else
                  Check("cmake", "fail", "no cmake >= 3.26.1 on PATH or in the torch "
                        "environment (vLLM 0.10.2 requires it)", CMAKE_FIX))
    ninja = which("ninja", env)
    checks.append(Check("ninja", "ok", ninja) if ninja else
                  Check("ninja", "fail", "ninja not found on PATH",
                        "pip install ninja (or apt install ninja-build)"))
    return checks, nvcc, version


def _check_conda(environ: Mapping[str, str]) -> Check:
    exe = find_conda(environ)
    if exe is None:
        return Check("conda", "skip", "not found; environments will use venv (or uv)")
    return Check("conda", "ok", f"{exe} (used with --env-backend conda)")


def _check_gpu(archs: Sequence[CudaArch], environ: Mapping[str, str],
               version: tuple[int, int, int] | None, probes: DoctorProbes) -> Check:
    gpus = probes.gpus(environ)
    if gpus is None:
        return Check("gpu", "skip", "no GPU (nvidia-smi not found); building only")
    if not gpus:
        return Check("gpu", "skip", "nvidia-smi lists no GPU")
    built = vllm_c_archs(archs, version)
    notes: list[str] = []
    status: Status = "ok"
    for cap, name in gpus:
        major, minor = (int(x) for x in cap.split("."))
        runs = [a for a in built if a.major == major and a.minor <= minor]
        if not runs:
            status = "warn"
            notes.append(f"{name} is sm_{major}{minor}, but --arch builds "
                         f"{', '.join('sm_' + a.sm for a in built) or 'nothing'} for it")
        elif major >= 9 and not any(a.has_bulk_prefetch for a in runs):
            status = "warn"
            notes.append(f"{name} ({cap}) runs code without the bulk prefetch")
        else:
            notes.append(f"{name} ({cap}) runs sm_{runs[-1].sm}")
    fix = None if status == "ok" else (
        f"add {gpus[0][0]} (9.0a for Hopper) to --arch to run the build on this machine's GPU")
    return Check("gpu", status, "; ".join(notes), fix)


def run_doctor(arch_list: str | Sequence[CudaArch], *, env: Mapping[str, str] | None = None,
               workdir: str | os.PathLike[str] = ".", need_network: bool | None = None,
               mode: Mode = "full", probes: DoctorProbes | None = None,
               cuda_home_opt: str | None = None, allow_cuda_mismatch: bool = False,
               mode_reason: str = "", smoke: bool = False,
               torch_from: str | None = None, env_backend: str | None = None,
               envs: int = 2, read_only: bool = False) -> DoctorReport:
    """Run every check for building ``arch_list`` in ``mode`` with the environment ``env``
    (default os.environ; pass the build environment's environ()). ``need_network`` None means:
    needed for a full build unless all three FetchContent source dirs are set. ``smoke``: the
    full-mode smoke's needs (``_smoke_checks``) in place of a full build's toolkit, libraries
    and cmake rows. Overlay: ``env_backend`` (None: ``default_backend()``) and ``envs``, the
    number of environments, size the disk check. ``read_only``: write nothing into the work
    directory (``kvprefetch doctor``, dry runs): the compile probe uses a system temp folder."""
    if mode not in ("full", "kernels-only", "overlay"):
        raise ConfigError(f"unknown doctor mode {mode!r}",
                          "use 'full', 'kernels-only' or 'overlay'")
    environ = dict(os.environ if env is None else env)
    probes = probes or DoctorProbes()
    wd = Path(workdir)
    checks: list[Check] = []
    if isinstance(arch_list, str):
        label = arch_list
        try:
            archs: Sequence[CudaArch] = parse_arch_list(arch_list)
            checks.append(Check("arch", "ok", f"{arch_list} -> _C paged attention built for " +
                                ", ".join("sm_" + a.sm for a in vllm_c_archs(archs))))
        except ConfigError as exc:
            archs = ()
            checks.append(Check("arch", "fail", exc.cause, exc.fix))
    else:
        archs = tuple(arch_list)
        label = ";".join(a.spec for a in archs)
        checks.append(Check("arch", "ok", label))
    if archs:
        from .build.foresight import lacking

        missing = lacking(archs)
        if missing:
            checks.append(Check("prefetch-arch", "warn", missing,
                                "add 9.0a to --arch (e.g. '8.0;9.0a') for the prefetch"))
    try:
        refuse_precompiled(environ)
        checks.append(Check("precompiled", "ok", "VLLM_USE_PRECOMPILED and "
                            "VLLM_PRECOMPILED_WHEEL_LOCATION are unset"))
    except ConfigError as exc:
        checks.append(Check("precompiled", "fail", exc.cause, exc.fix))
    smoke_rows: list[Check] = []
    if smoke and mode == "full":
        smoke_rows, nvcc, version = _smoke_checks(environ, wd, torch_from, cuda_home_opt)
        checks += smoke_rows
    elif mode == "overlay":
        tk_check, nvcc, version = _check_overlay_toolkit(environ, cuda_home_opt,
                                                         allow_cuda_mismatch, wd, probes)
        checks.append(tk_check)
    else:
        nvcc_checks, nvcc, version = _check_nvcc(archs, environ, mode, probes)
        checks += nvcc_checks
    if nvcc is not None and version is not None and archs:
        checks.append(_check_compile(nvcc, archs, version, environ, wd, read_only))
    else:
        checks.append(Check("nvcc-compile", "skip", "no usable nvcc or arch list"))
    if mode != "overlay" and not smoke_rows:
        checks.append(_check_cuda_home(environ, probes))
    if mode == "full" and not smoke_rows:
        checks.append(_check_cuda_libs(environ, probes))
    checks.append(_check_gcc(environ))
    if not smoke_rows:
        checks.append(_check_cmake(environ) if mode == "full" else
                      Check("cmake", "skip", f"{mode} builds do not use cmake"))
    checks.append(_check_disk(wd, mode, probes, smoke=bool(smoke_rows), environ=environ,
                              env_backend=env_backend, envs=envs))
    checks.append(_check_memory(archs, probes))
    if not smoke_rows:
        checks.append(_check_estimate(archs, mode, probes, envs))
    if mode == "overlay":
        checks.append(_check_index(environ, probes))
    else:
        checks += _check_git_network(environ, mode, need_network, probes)
    checks.append(_check_conda(environ))
    checks.append(_check_gpu(archs, environ, version, probes))
    return DoctorReport(mode, label, tuple(checks), mode_reason)


AUTO_RULE = "full where a CUDA >= 12.8 toolkit, a GPU and the network exist, else kernels-only"


@dataclass(frozen=True)
class ModeChoice:
    """The build mode for ``--mode`` (``auto`` resolved on this machine), and why."""
    mode: Mode
    reason: str
    full_report: DoctorReport | None = None  # auto's full-mode preflight, when it ran one


def choose_mode(mode: str, arch_list: str | Sequence[CudaArch], *,
                env: Mapping[str, str] | None = None, workdir: str | os.PathLike[str] = ".",
                probes: DoctorProbes | None = None, read_only: bool = False) -> ModeChoice:
    """``auto`` -> full where the full-mode preflight (with the network required) passes and a
    GPU is found, else kernels-only; any other mode as given. ``build`` and ``doctor`` both
    decide here, so plain ``doctor`` checks the mode that plain ``build`` would build."""
    if mode != "auto":
        if mode not in ("full", "kernels-only", "overlay"):
            raise ConfigError(f"unknown build mode {mode!r}",
                              "use auto, full, kernels-only or overlay")
        return ModeChoice(mode, f"--mode {mode}")  # type: ignore[arg-type]
    rep = run_doctor(arch_list, env=env, workdir=workdir, need_network=True, mode="full",
                     probes=probes, read_only=read_only)
    failing = [c for c in rep.checks if c.status == "fail"]
    gpu = [c for c in rep.checks if c.name == "gpu" and c.status == "ok"]
    if not failing and gpu:
        return ModeChoice("full", "--mode auto: the full build's toolkit, GPU and network "
                                  "checks all pass", rep)
    why = "; ".join(f"{c.name}: {c.detail}" for c in failing) or "no GPU found"
    return ModeChoice("kernels-only", f"--mode auto: no full build here ({why})", rep)


def check_machine(mode: str, arch_list: str, *, workdir: str | os.PathLike[str] = ".",
                  local_deps: bool = False, cuda_home_opt: str | None = None,
                  allow_cuda_mismatch: bool = False, smoke: bool = False,
                  torch_from: str | None = None) -> DoctorReport:
    """``kvprefetch doctor``: the preflight of the mode ``mode`` resolves to (choose_mode),
    the report saying which mode it checked and why. ``local_deps``: vLLM's FetchContent
    dependencies are local clones, so a full build needs no network."""
    if smoke:
        return run_doctor(arch_list, workdir=workdir, mode="full",
                          need_network=False if local_deps else None,
                          cuda_home_opt=cuda_home_opt, smoke=True, torch_from=torch_from,
                          read_only=True,
                          mode_reason="--smoke: vLLM's configure and the attention objects only")
    choice = choose_mode(mode, arch_list, workdir=workdir, read_only=True)
    if choice.full_report is not None and choice.mode == "full" and not local_deps:
        return dataclasses.replace(choice.full_report, mode_reason=choice.reason)
    return run_doctor(arch_list, workdir=workdir, mode=choice.mode,
                      need_network=False if local_deps else None, cuda_home_opt=cuda_home_opt,
                      allow_cuda_mismatch=allow_cuda_mismatch, mode_reason=choice.reason,
                      read_only=True)
