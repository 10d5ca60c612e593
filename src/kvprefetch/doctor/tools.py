"""The preflight's toolchain checks: nvcc (or the overlay's or the smoke's CUDA 12 toolkit) and a
real compile of the bulk-prefetch instruction for every arch of the list, CUDA_HOME and the
libraries a full configure links, gcc and cmake. Each returns ``Check`` rows; what they run
goes through the runner."""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from ..errors import ConfigError, KvprefetchError
from ..machine.cmake import CMAKE_FIX, CMAKE_MIN, find_cmake
from ..machine.toolchain import (
    CudaArch,
    check_nvcc_for_arch,
    cuda_home,
    find_cuobjdump,
    find_nvcc,
    fmt_version,
    gencode_flags,
    nvcc_gpu_archs,
    nvcc_version,
    vllm_c_archs,
)
from ..oserrors import child_limit_fix, describe
from ..runner import run, which
from ..workspace import ownership
from ..workspace.workdir import Workdir
from .probes import DoctorProbes
from .report import Check, Mode

# torch 2.8.0, which vLLM 0.10.2 pins, is built for CUDA 12.8: the overlay compiles against it.
OVERLAY_TORCH_CUDA = "12.8"

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


def check_nvcc(
    archs: Sequence[CudaArch], environ: Mapping[str, str], mode: Mode, probes: DoctorProbes,
) -> tuple[list[Check], Path | None, tuple[int, int, int] | None]:
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


def check_cuda_libs(environ: Mapping[str, str], probes: DoctorProbes) -> Check:
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


def check_overlay_toolkit(environ: Mapping[str, str], cuda_home_opt: str | None,
                           allow_mismatch: bool, workdir: Path, probes: DoctorProbes
                           ) -> tuple[Check, Path | None, tuple[int, int, int] | None]:
    """Which toolkit an overlay build would compile with, and why (overlay.toolkit). Where the
    machine has no CUDA 12 toolkit, the build assembles one (overlay.cuda12); doctor does not
    download it, only checks that its sources are reachable."""
    from ..overlay.cuda12 import DEBIAN_MIRROR, PARTS, RELEASE, toolkit_dir
    from ..overlay.toolkit import choose_toolkit

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


@contextmanager
def _scratch(workdir: Path, read_only: bool) -> Iterator[Path]:
    """Where the compile probe writes: a private folder of the kit's outside the work directory
    (``ownership.private_dir``: 0700, a random name in the system temp, its removal never
    broken off by a stop), never the work directory. nvcc writes ``probe.o`` and its
    ``tmpxft_*`` files by path, and the probe's source was written by path too: in the work
    directory's ``tmp/doctor-<pid>-<hex>`` (a real build's preflight), a ``tmp/`` swapped for a
    link to a folder outside (a ``renameat2`` loop) had the folder made there, and left there
    (issue 41, the seventeenth hostile pass; the threat model's rule for programs that write by
    path, the eleventh). ``kvprefetch doctor`` and dry runs (``read_only``) wrote nothing into
    the work directory already (class 6); a real build refuses a TMPDIR inside the work
    directory for this folder as for its compilers' (``outside``), and so does ``kvprefetch
    doctor --workdir W`` (``read_only``): with TMPDIR inside W (or a link into it) the probe's
    folder was made in W, and a watcher that renamed it and put a link to a folder outside in
    its place had nvcc write probe.o there (issue 41, the eighteenth hostile pass; doctor
    makes no Workdir, so ``confine.trusted_roots`` did not name W)."""
    del read_only  # the same folder either way; kept for the callers' signature
    with ownership.private_dir("doctor", outside=workdir) as tmp:
        yield tmp


def check_compile(nvcc: Path, archs: Sequence[CudaArch], version: tuple[int, int, int],
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
        # nvcc's own tmpxft_* files in the probe's folder too: an nvcc stopped early leaves
        # some behind (issue 41, the ninth hostile pass: in the system temp folder). It runs
        # in that folder as well: what nvcc writes by a relative name goes into its current
        # folder, and NVCC_APPEND_FLAGS=-keep (a user's, kept from debugging PTX) had it write
        # the probe's intermediates, 3.5 MB of probe.*, into the caller's folder, outside the
        # work directory, or through links planted in the work directory run from there (the
        # twenty-fifth hostile pass)
        done = run([str(nvcc), "-c", *flags, "-o", str(obj), str(src)],
                   env={**environ, "TMPDIR": os.path.abspath(tmp)}, echo=False, check=False,
                   timeout=300, cwd=tmp)
        took = time.monotonic() - t0
        targets = ", ".join(f.rsplit("code=", 1)[1] for f in flags)
        if done.returncode != 0:
            fix = "use a CUDA toolkit >= 12.8 whose nvcc supports every --arch you pass"
            if "Failed to preprocess host compiler properties" in done.output:
                # nvcc starts its host compiler by name from PATH: a PATH without gcc (or one
                # of relative entries only, `PATH=:`) was sent to another toolkit, while the
                # gcc row beside it named the cause (issue 41, the thirty-fifth hostile pass)
                fix = ("nvcc could not run its host compiler (gcc/g++, started by name from "
                       "PATH): install gcc and g++ >= 10 (e.g. apt-get install "
                       "build-essential) or put their folder on PATH, then rerun")
            # nvcc adds these to every command it runs: a stale `--bogus` there failed the
            # probe with "Unknown option", and doctor sent the user to another toolkit (issue
            # 41, the twenty-fifth hostile pass)
            extra = [f"{v}={environ[v]!r}" for v in ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS")
                     if environ.get(v)]
            if extra:
                fix = (f"nvcc adds {' and '.join(extra)} to every command, this probe's and the "
                       "build's: correct or unset it (e.g. `unset NVCC_APPEND_FLAGS "
                       "NVCC_PREPEND_FLAGS`) and rerun; if it still fails, " + fix)
            for code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
                # nvcc's files in the probe's folder, in the system temp: a full TMPDIR was
                # sent to another toolkit (issue 41, the twenty-fourth hostile pass)
                if os.strerror(code) in done.output:
                    fix = describe(OSError(code, os.strerror(code), str(obj)))[1]
            fix = child_limit_fix(done.output) or fix  # `ulimit -f`/`-v`: not the toolkit
            return Check("nvcc-compile", "fail",
                         f"nvcc could not compile the prefetch probe for {targets}: "
                         + done.output.strip()[-500:], fix)
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
        # cuobjdump writes tmpxft_* files too (the cubin it hands to nvdisasm): killed by a
        # second Ctrl-C it left them in the system temp (issue 41, the twelfth hostile pass)
        sass = run([str(tools.cuobjdump), "-sass", str(obj)],
                   env={**tools.environ(environ), "TMPDIR": os.path.abspath(tmp)},
                   echo=False, check=False, timeout=120, cwd=tmp)
        n = sass.output.count("UBLKPF")
        if sass.returncode != 0 or n == 0:
            return Check("nvcc-compile", "fail",
                         detail + f", but the sm_90 SASS holds no UBLKPF ({tools.cuobjdump} "
                         f"exit {sass.returncode})",
                         "check that cuobjdump and nvdisasm come from a CUDA >= 12.0 toolkit")
        return Check("nvcc-compile", "ok", detail + f"; SASS holds {n} UBLKPF.L2")


def check_cuda_home(environ: Mapping[str, str], probes: DoctorProbes) -> Check:
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


def tool_version(argv: list[str], environ: Mapping[str, str]) -> tuple[int, ...] | None:
    done = run(argv, env=environ, echo=False, check=False, timeout=60)
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", done.output)
    if done.returncode != 0 or m is None:
        return None
    return tuple(int(x) for x in m.groups(default="0"))


def check_gcc(environ: Mapping[str, str]) -> Check:
    if which("g++", environ) is None or which("gcc", environ) is None:
        return Check("gcc", "fail", "gcc/g++ not found on PATH (nvcc needs a host compiler)",
                     "install gcc and g++ >= 10 (e.g. apt-get install build-essential)")
    v = tool_version(["gcc", "-dumpfullversion", "-dumpversion"], environ)
    if v is None:
        return Check("gcc", "fail", "`gcc -dumpfullversion` failed", "reinstall gcc")
    if v[0] < 10:
        return Check("gcc", "warn", f"gcc {fmt_version(v)}: torch >= 2.10 headers need C++20",
                     "install gcc >= 10")
    return Check("gcc", "ok", f"gcc {fmt_version(v)}")


def check_cmake(environ: Mapping[str, str]) -> Check:
    fix = 'pip install "cmake>=3.26.1" (into the build environment)'
    if which("cmake", environ) is None:
        return Check("cmake", "fail", "cmake not found on PATH", fix)
    v = tool_version(["cmake", "--version"], environ)
    if v is None or v < CMAKE_MIN:
        shown = fmt_version(v) if v else "unknown"
        return Check("cmake", "fail", f"cmake {shown} < 3.26.1, which vLLM 0.10.2 requires", fix)
    return Check("cmake", "ok", f"cmake {fmt_version(v)}")


def smoke_checks(environ: Mapping[str, str], wd: Path, torch_from: str | None,
                  cuda_home_opt: str | None
                  ) -> tuple[list[Check], Path | None, tuple[int, int, int] | None]:
    """What ``build --mode full --smoke`` needs (builds/modes/smoke.py): torch 2.8.0 in some
    environment, a CUDA toolkit of torch's major version, cmake >= 3.26.1 and ninja. Its
    missing driver stub and NVRTC are supplied by the smoke's toolkit view (link-time
    stand-ins), so they are not a failure here."""
    from ..machine.torch_probe import default_torch_python, probe_torch
    from ..overlay.cuda12 import toolkit_dir
    from ..overlay.toolkit import choose_toolkit

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
