"""The CUDA toolchain as kvprefetch sees it: the ``--arch`` / ``TORCH_CUDA_ARCH_LIST`` syntax
(``CudaArch``), the ``-gencode`` flags vLLM really uses for the paged-attention translation
units, finding nvcc / CUDA_HOME / cuobjdump, nvcc's version and what it may build, and the
``MAX_JOBS`` / ``NVCC_THREADS`` sizing rule. Pure functions plus a few probes that run the tools
through ``kvprefetch.runner.run``; nothing here imports torch."""

from __future__ import annotations

import os
import re
import sysconfig
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from ..oserrors import child_limit_fix
from ..runner import Completed, run, which

# --------------------------------------------------------------------------- arch syntax

# Real compute capabilities (torch 2.14's cpp_extension list plus 10.1, which CUDA 12.8/12.9
# and vLLM 0.10.2's CMakeLists still name; CUDA 13 renamed it 11.0).
KNOWN_ARCHS: tuple[tuple[int, int], ...] = (
    (3, 5), (3, 7), (5, 0), (5, 2), (5, 3), (6, 0), (6, 1), (6, 2), (7, 0), (7, 2), (7, 5),
    (8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (10, 0), (10, 1), (10, 3), (10, 7), (11, 0),
    (12, 0), (12, 1),
)

# torch's named arches (cpp_extension._get_cuda_arch_flags); combined names first.
NAMED_ARCHS: tuple[tuple[str, str], ...] = (
    ("Kepler+Tesla", "3.7"), ("Kepler", "3.5+PTX"), ("Maxwell+Tegra", "5.3"),
    ("Maxwell", "5.0;5.2+PTX"), ("Pascal", "6.0;6.1+PTX"), ("Volta+Tegra", "7.2"),
    ("Volta", "7.0+PTX"), ("Turing", "7.5+PTX"), ("Ampere+Tegra", "8.7"),
    ("Ampere", "8.0;8.6+PTX"), ("Ada", "8.9+PTX"), ("Hopper", "9.0+PTX"),
    ("Blackwell+Tegra", "11.0"), ("Blackwell", "10.0;10.3;12.0;12.1+PTX"), ("Rubin", "10.7+PTX"),
)

_ARCH_TOKEN = re.compile(r"^(\d+)\.(\d+)(a?)(\+PTX)?$")
_ARCH_EXAMPLES = '"9.0a", "9.0", "8.0;9.0a", "8.0 8.6 9.0+PTX" or "Hopper"'


@dataclass(frozen=True, order=True)
class CudaArch:
    """One entry of TORCH_CUDA_ARCH_LIST. ``suffix`` is '' or 'a' (arch-specific features,
    e.g. sm_90a's wgmma); ``ptx`` means "+PTX" (also embed PTX for JIT on newer GPUs)."""

    major: int
    minor: int
    suffix: str = ""
    ptx: bool = False

    @property
    def digits(self) -> str:
        """"90" for 9.0 and 9.0a."""
        return f"{self.major}{self.minor}"

    @property
    def sm(self) -> str:
        """The nvcc target number with suffix: "90" for 9.0, "90a" for 9.0a (``sm_{sm}``)."""
        return f"{self.digits}{self.suffix}"

    @property
    def label(self) -> str:
        """"9.0a" (no +PTX)."""
        return f"{self.major}.{self.minor}{self.suffix}"

    @property
    def spec(self) -> str:
        """The TORCH_CUDA_ARCH_LIST token that parses back to this arch: "9.0+PTX"."""
        return self.label + ("+PTX" if self.ptx else "")

    @property
    def base(self) -> CudaArch:
        """The plain arch: no 'a', no +PTX."""
        return CudaArch(self.major, self.minor)

    @property
    def has_bulk_prefetch(self) -> bool:
        """``cp.async.bulk.prefetch.L2`` needs sm_90 / PTX ISA 8.0 (BRIEF: "The instruction")."""
        return self.major >= 9

    def __str__(self) -> str:
        return self.spec


def _bad_arch(cause: str) -> ConfigError:
    return ConfigError(
        cause,
        f"pass --arch (TORCH_CUDA_ARCH_LIST syntax) such as {_ARCH_EXAMPLES}; "
        "separate several with ';', ',' or spaces; 'a' (arch-specific) exists from 9.0 on",
    )


def parse_arch_list(s: str) -> tuple[CudaArch, ...]:
    """Parse torch's TORCH_CUDA_ARCH_LIST syntax (';', ',' or whitespace separated, "+PTX",
    "a" suffix, torch's named arches). Order is kept, duplicates dropped."""
    text = (s or "").strip()
    if not text:
        raise _bad_arch("the CUDA arch list is empty")
    for name, expansion in NAMED_ARCHS:
        text = text.replace(name, expansion)
    tokens = [t for t in re.split(r"[;,\s]+", text) if t]
    if not tokens:
        raise _bad_arch(f"the CUDA arch list {s!r} names no arch")
    out: list[CudaArch] = []
    for tok in tokens:
        m = _ARCH_TOKEN.match(tok)
        if m is None:
            raise _bad_arch(f"{tok!r} in --arch {s!r} is not a CUDA arch")
        major, minor = int(m.group(1)), int(m.group(2))
        if (major, minor) not in KNOWN_ARCHS:
            raise _bad_arch(f"{tok!r} in --arch {s!r} is not a known compute capability")
        suffix = m.group(3)
        if suffix and major < 9:
            raise _bad_arch(f"{tok!r}: the 'a' (arch-specific) variant exists only from 9.0 on")
        arch = CudaArch(major, minor, suffix, bool(m.group(4)))
        if arch not in out:
            out.append(arch)
    return tuple(out)


def format_arch_list(archs: Iterable[CudaArch]) -> str:
    """The TORCH_CUDA_ARCH_LIST value for ``archs`` ("8.0;9.0a")."""
    return ";".join(a.spec for a in archs)


# --------------------------------------------------------------------------- gencode flags

# vLLM 0.10.2 CMakeLists.txt L84-89: CUDA_SUPPORTED_ARCHS, which depends on nvcc's version.
VLLM_SUPPORTED_ARCHS_CUDA_12_8 = "7.0;7.2;7.5;8.0;8.6;8.7;8.9;9.0;10.0;10.1;12.0"
VLLM_SUPPORTED_ARCHS_OLDER = "7.0;7.2;7.5;8.0;8.6;8.7;8.9;9.0"


def vllm_c_archs(archs: Sequence[CudaArch],
                 cuda_version: tuple[int, ...] | None = None) -> tuple[CudaArch, ...]:
    """The archs vLLM 0.10.2 compiles its ``_C`` sources (paged_attention_v1/v2.cu among them)
    for, given TORCH_CUDA_ARCH_LIST = ``archs``.

    This mirrors CMakeLists.txt L141-148: torch turns the list into ``-gencode`` flags,
    ``extract_unique_cuda_archs_ascending`` maps each back to "X.Y" (dropping "+PTX": the two
    flags of "9.0+PTX" both name compute_90), and ``cuda_archs_loose_intersection`` with
    CUDA_SUPPORTED_ARCHS maps every target to the highest supported arch of the same major that
    is <= it. The supported list has no 'a' entries, so 9.0a becomes plain 9.0 and _C ships
    sm_90 SASS and no PTX (research/vllm-0.10.2-build-and-patch.md, "9.0a subtlety"). That is
    fine for the prefetch: ``cp.async.bulk.prefetch`` needs only sm_90. ``cuda_version`` None
    means >= 12.8 (the toolkit torch 2.8.0 is built with)."""
    newer = cuda_version is None or tuple(cuda_version[:2]) >= (12, 8)
    supported = [CudaArch(int(a), int(b)) for a, b in (
        x.split(".") for x in
        (VLLM_SUPPORTED_ARCHS_CUDA_12_8 if newer else VLLM_SUPPORTED_ARCHS_OLDER).split(";"))]
    targets = sorted({a.base for a in archs})
    out: list[CudaArch] = []
    for tgt in targets:
        best = None
        for src in supported:  # ascending
            if (src.major, src.minor) > (tgt.major, tgt.minor):
                break
            if src.major == tgt.major:
                best = src
        if best is not None and best not in out:
            out.append(best)
    return tuple(out)


def gencode_flags(archs: Sequence[CudaArch], *, vllm_semantics: bool = True,
                  cuda_version: tuple[int, ...] | None = None) -> list[str]:
    """nvcc ``-gencode`` flags for the paged-attention translation units.

    With ``vllm_semantics`` (the default, what a kernels-only build must use to produce the same
    machine code as a full vLLM build) the archs go through ``vllm_c_archs``: 9.0a gives
    ``-gencode=arch=compute_90,code=sm_90``, "+PTX" is dropped and unsupported targets vanish.
    Without it, torch's cpp_extension rules apply: 9.0a gives compute_90a/sm_90a and "+PTX"
    adds ``code=compute_XX``. Raises ConfigError when nothing is left to compile for."""
    if vllm_semantics:
        chosen = vllm_c_archs(archs, cuda_version)
        if not chosen:
            raise ConfigError(
                f"vLLM 0.10.2 compiles its _C kernels for none of {format_arch_list(archs)!r} "
                "(its CMakeLists supports 7.0 to 9.0, plus 10.0/10.1/12.0 with CUDA >= 12.8)",
                "pass --arch 9.0a for Hopper (H100/H200/H20), or 8.0 / 8.9 for Ampere / Ada",
            )
    else:
        chosen = tuple(archs)
    flags: list[str] = []
    for a in chosen:
        for code in (f"sm_{a.sm}",) + ((f"compute_{a.sm}",) if a.ptx else ()):
            flag = f"-gencode=arch=compute_{a.sm},code={code}"
            if flag not in flags:
                flags.append(flag)
    return flags


# --------------------------------------------------------------------------- nvcc / CUDA_HOME

DEFAULT_CUDA_ROOTS: tuple[Path, ...] = (Path("/usr/local/cuda"),)


def is_toolkit(root: Path) -> bool:
    return (root / "bin" / "nvcc").is_file() and (root / "include" / "cuda_runtime.h").is_file()


def cuda_home(env: Mapping[str, str] | None = None, *,
              fallback_roots: Sequence[Path] = DEFAULT_CUDA_ROOTS) -> Path | None:
    """The CUDA toolkit root a build would use: CUDA_HOME, then CUDA_PATH (returned as given,
    even if wrong, so a bad value is reported rather than silently bypassed), then the toolkit
    around ``nvcc`` on the child's PATH (following symlinks; a wrapper script such as
    /usr/local/bin/nvcc is skipped because no toolkit surrounds it), then ``fallback_roots``."""
    env = os.environ if env is None else env
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            return Path(env[var])
    found = which("nvcc", env)
    if found:
        for p in (Path(found), Path(os.path.realpath(found))):
            if is_toolkit(p.parent.parent):
                return p.parent.parent
    for root in fallback_roots:
        if is_toolkit(root):
            return root
    return None


def find_nvcc(env: Mapping[str, str] | None = None, *,
              fallback_roots: Sequence[Path] = DEFAULT_CUDA_ROOTS) -> Path | None:
    """The nvcc a build would run. vLLM's setup.py forces ``$CUDA_HOME/bin/nvcc`` when CUDA_HOME
    is set, so an explicit CUDA_HOME/CUDA_PATH wins (None if it holds no nvcc); otherwise nvcc on
    the child's PATH, then ``<root>/bin/nvcc`` for each fallback root."""
    env = os.environ if env is None else env
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            cand = Path(env[var]) / "bin" / "nvcc"
            return cand if cand.is_file() and os.access(cand, os.X_OK) else None
    found = which("nvcc", env)
    if found:
        return Path(found)
    for root in fallback_roots:
        cand = root / "bin" / "nvcc"
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
    return None


_NVCC_V = re.compile(r"release (\d+)\.(\d+), V(\d+)\.(\d+)\.(\d+)")
_NVCC_RELEASE = re.compile(r"release (\d+)\.(\d+)")


def parse_nvcc_version(text: str) -> tuple[int, int, int]:
    """(12, 8, 93) from ``nvcc --version`` output ("release 12.8, V12.8.93")."""
    m = _NVCC_V.search(text)
    if m:
        return int(m.group(3)), int(m.group(4)), int(m.group(5))
    m = _NVCC_RELEASE.search(text)
    if m:
        return int(m.group(1)), int(m.group(2)), 0
    raise ConfigError(
        "could not read a CUDA version from `nvcc --version`; it printed:\n" + text.strip()[-400:],
        "make sure CUDA_HOME / PATH point at a real CUDA toolkit's nvcc (>= 12.8 recommended)",
    )


def _nvcc_probe(nvcc: str | os.PathLike[str], flag: str,
                env: Mapping[str, str] | None) -> Completed:
    """``nvcc FLAG`` with ``TMPDIR`` a private folder of its own (``ownership.private_dir``),
    removed after: nvcc writes ``tmpxft_*`` files into ``TMPDIR`` even for ``--version`` and
    ``--list-gpu-arch``, which were left in the user's TMPDIR when it was stopped (issue 41, the
    twelfth pass left it open; the builds already had their own folder)."""
    from ..workspace.ownership import private_dir

    child_env = dict(env) if env is not None else dict(os.environ)
    with private_dir("nvcc-probe") as tmp:
        child_env["TMPDIR"] = str(tmp)
        return run([str(nvcc), flag], env=child_env, echo=False, check=False, timeout=60)


def nvcc_version(nvcc: str | os.PathLike[str],
                 env: Mapping[str, str] | None = None) -> tuple[int, int, int]:
    """Run ``nvcc --version`` and parse it."""
    done = _nvcc_probe(nvcc, "--version", env)
    if done.returncode != 0:
        raise ConfigError(
            f"`{nvcc} --version` failed with exit code {done.returncode}:\n{done.output[-400:]}",
            child_limit_fix(done.output)  # `ulimit -n 10`: not the toolkit
            or "fix or replace that CUDA toolkit; point CUDA_HOME at a working one (>= 12.8)",
        )
    return parse_nvcc_version(done.output)


def nvcc_gpu_archs(nvcc: str | os.PathLike[str],
                   env: Mapping[str, str] | None = None) -> frozenset[str] | None:
    """The ``compute_XX`` digits nvcc can target (``nvcc --list-gpu-arch``), e.g. {"75", "90"};
    None where this nvcc cannot list them."""
    done = _nvcc_probe(nvcc, "--list-gpu-arch", env)
    found = frozenset(re.findall(r"compute_(\d+)", done.output))
    return found if done.returncode == 0 and found else None


def fmt_version(v: Sequence[int]) -> str:
    return ".".join(str(x) for x in v)


def check_nvcc_for_arch(version: Sequence[int], archs: Sequence[CudaArch],
                        supported: frozenset[str] | None = None) -> tuple[str, ...]:
    """Refuse a toolkit that cannot (or must not) build ``archs``; return warnings.

    - Hopper (any 9.x) with CUDA 12.6.x: refused. ptxas 12.6 segfaults on vllm-flash-attn's FA3
      Hopper kernels (vllm#15452, Dao-AILab/flash-attention#1453), hours into a full build.
    - sm_90 with CUDA < 12.0: refused; ``cp.async.bulk.prefetch`` needs PTX ISA 8.0 (CUDA 12.0).
    - an arch nvcc cannot target (from ``nvcc --list-gpu-arch``, when given): refused.
    - CUDA 12.x below 12.8: a warning; torch 2.8.0 and vLLM 0.10.2's wheels use 12.8, and vLLM
      appends "+cuXYZ" to its version for any other nvcc."""
    v = tuple(version) + (0,) * (3 - len(version))
    hopper = any(a.major == 9 for a in archs)
    if hopper and v[:2] == (12, 6):
        raise ConfigError(
            f"nvcc {fmt_version(v)} (CUDA 12.6.x) is refused for a Hopper build: its ptxas "
            "crashes (signal 11) on vllm-flash-attn's FA3 Hopper kernels (vllm#15452, "
            "flash-attention#1453)",
            "install CUDA >= 12.8 (the toolkit torch 2.8.0 is built with) and point CUDA_HOME at "
            "it, e.g. CUDA_HOME=/usr/local/cuda-12.8",
        )
    if any(a.has_bulk_prefetch for a in archs) and v[:2] < (12, 0):
        raise ConfigError(
            f"nvcc {fmt_version(v)} cannot build the prefetch for sm_90: "
            "cp.async.bulk.prefetch.L2 needs PTX ISA 8.0, i.e. CUDA >= 12.0",
            "install CUDA >= 12.8 and point CUDA_HOME at it",
        )
    if supported is not None:
        missing = [a.label for a in archs if a.digits not in supported]
        if missing:
            raise ConfigError(
                f"nvcc {fmt_version(v)} cannot target {', '.join(missing)} "
                f"(it lists compute_{', compute_'.join(sorted(supported, key=int))})",
                "drop those archs from --arch, or use a CUDA toolkit that supports them "
                "(CUDA 13 removed sm_50 to sm_72; sm_100/sm_120 need >= 12.8)",
            )
    warnings: list[str] = []
    if v[0] == 12 and v[:2] < (12, 8):
        warnings.append(
            f"nvcc {fmt_version(v)} is older than 12.8, the CUDA torch 2.8.0 and vLLM 0.10.2 "
            f"are built with; vLLM will add '+cu{v[0]}{v[1]}' to its version. CUDA >= 12.8 is "
            "recommended")
    return tuple(warnings)


# --------------------------------------------------------------------------- cuobjdump

@dataclass(frozen=True)
class DisasmTools:
    """Where cuobjdump lives, and what must go on PATH so it finds nvdisasm (needed for sm_90
    SASS; the PyPI wheels put both in ``nvidia/cu13/bin``)."""

    cuobjdump: Path
    nvdisasm: Path | None
    path_prepend: tuple[Path, ...] = field(default=())

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        if self.path_prepend:
            parts = [str(p) for p in self.path_prepend]
            env["PATH"] = os.pathsep.join([*parts, env.get("PATH", os.defpath)])
        return env


# Layouts of the PyPI wheels: nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm (cu13 puts both in
# nvidia/cu13/bin; the cu12 wheels use one directory per package).
_WHEEL_BIN_DIRS = ("nvidia/cu13/bin", "nvidia/cuda_cuobjdump/bin", "nvidia/cuda_nvdisasm/bin")


def _site_dirs(extra: Sequence[Path]) -> list[Path]:
    dirs = [Path(p) for p in extra]
    for key in ("purelib", "platlib"):
        p = Path(sysconfig.get_paths()[key])
        if p not in dirs:
            dirs.append(p)
    return dirs


def find_cuobjdump(env: Mapping[str, str] | None = None, *,
                   site_packages: Sequence[Path] = ()) -> DisasmTools | None:
    """Find cuobjdump: ``$CUDA_HOME/bin``, the child's PATH, then the PyPI wheels in
    ``site_packages`` and the current interpreter's site-packages. nvdisasm is looked for next to
    it, on PATH, then in the wheels; its directory goes into ``path_prepend`` when the PATH of
    ``env`` would not find it."""
    env = os.environ if env is None else env
    wheel_bins = [d / sub for d in _site_dirs(site_packages) for sub in _WHEEL_BIN_DIRS]
    candidates: list[Path] = []
    home = cuda_home(env)
    if home is not None:
        candidates.append(home / "bin" / "cuobjdump")
    on_path = which("cuobjdump", env)
    if on_path:
        candidates.append(Path(on_path))
    candidates += [b / "cuobjdump" for b in wheel_bins]
    cuobjdump = next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)
    if cuobjdump is None:
        return None
    nv_on_path = which("nvdisasm", env)
    nvdisasm: Path | None = Path(nv_on_path) if nv_on_path else None
    for cand in [cuobjdump.parent / "nvdisasm"] + [b / "nvdisasm" for b in wheel_bins]:
        if cand.is_file() and os.access(cand, os.X_OK):
            nvdisasm = cand
            break
    prepend: tuple[Path, ...] = ()
    if nvdisasm is not None and (nv_on_path is None or
                                 os.path.realpath(nv_on_path) != os.path.realpath(nvdisasm)):
        prepend = (nvdisasm.parent,)
    return DisasmTools(cuobjdump, nvdisasm, prepend)


# --------------------------------------------------------------------------- parallelism

# vLLM's heaviest translation units (FA3 / CUTLASS sm90 GEMMs / Marlin, thousands of template
# instantiations) peak at roughly 4-5 GiB of host memory per cicc/ptxas process; a full build
# with MAX_JOBS = cores on a box with less than ~4.5 GiB per core gets OOM-killed. We budget
# 4.5 GiB per concurrent nvcc worker and leave 2 GiB for the system, the linker and pip.
GIB_PER_NVCC_JOB = 4.5
RESERVED_GIB = 2.0


def default_jobs(cores: int, mem_gib: float, *, n_archs: int = 1) -> tuple[int, int]:
    """(MAX_JOBS, NVCC_THREADS) for a machine with ``cores`` CPUs and ``mem_gib`` of available
    memory. MAX_JOBS = min(cores, (mem - 2 GiB) / 4.5 GiB), at least 1. vLLM's setup.py runs
    MAX_JOBS // NVCC_THREADS compile jobs, each with ``nvcc --threads=NVCC_THREADS``; nvcc's
    threads only parallelise across -gencode targets, so NVCC_THREADS is 1 for one arch and
    min(n_archs, 4) otherwise, but never more than MAX_JOBS (the total worker count stays the
    same, so the memory bound holds either way)."""
    by_mem = int(max(0.0, mem_gib - RESERVED_GIB) // GIB_PER_NVCC_JOB)
    max_jobs = max(1, min(max(1, cores), by_mem))
    threads = 1 if n_archs <= 1 else min(n_archs, 4, max_jobs)
    return max_jobs, max(1, threads)


def host_resources() -> tuple[int, float]:
    """(usable CPU count, available memory in GiB), honouring CPU affinity and a cgroup v2
    memory limit where present."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    avail_kib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail_kib = int(line.split()[1])
                break
    except OSError:
        pass
    mem = (avail_kib or 0) / 2**20
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
            mem = min(mem, (int(limit) - used) / 2**30) if mem else (int(limit) - used) / 2**30
    except (OSError, ValueError):
        pass
    return cores, max(0.0, mem)
