"""``run_doctor``: the preflight of one build mode. It runs the checks that mode needs (``tools``
and ``host``) with the build's environment and collects their rows into a ``DoctorReport``."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import ConfigError
from ..machine.envs import refuse_precompiled
from ..machine.toolchain import CudaArch, parse_arch_list, vllm_c_archs
from .host import (
    check_conda,
    check_disk,
    check_estimate,
    check_git_network,
    check_gpu,
    check_index,
    check_memory,
)
from .probes import DoctorProbes
from .report import Check, DoctorReport, Mode
from .tools import (
    check_cmake,
    check_compile,
    check_cuda_home,
    check_cuda_libs,
    check_gcc,
    check_nvcc,
    check_overlay_toolkit,
    smoke_checks,
)


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
    full-mode smoke's needs (``smoke_checks``) in place of a full build's toolkit, libraries
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
        from ..machine.foresight import lacking

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
        smoke_rows, nvcc, version = smoke_checks(environ, wd, torch_from, cuda_home_opt)
        checks += smoke_rows
    elif mode == "overlay":
        tk_check, nvcc, version = check_overlay_toolkit(environ, cuda_home_opt,
                                                         allow_cuda_mismatch, wd, probes)
        checks.append(tk_check)
    else:
        nvcc_checks, nvcc, version = check_nvcc(archs, environ, mode, probes)
        checks += nvcc_checks
    if nvcc is not None and version is not None and archs:
        checks.append(check_compile(nvcc, archs, version, environ, wd, read_only))
    else:
        checks.append(Check("nvcc-compile", "skip", "no usable nvcc or arch list"))
    if mode != "overlay" and not smoke_rows:
        checks.append(check_cuda_home(environ, probes))
    if mode == "full" and not smoke_rows:
        checks.append(check_cuda_libs(environ, probes))
    checks.append(check_gcc(environ))
    if not smoke_rows:
        checks.append(check_cmake(environ) if mode == "full" else
                      Check("cmake", "skip", f"{mode} builds do not use cmake"))
    checks.append(check_disk(wd, mode, probes, smoke=bool(smoke_rows), environ=environ,
                              env_backend=env_backend, envs=envs))
    checks.append(check_memory(archs, probes))
    if not smoke_rows:
        checks.append(check_estimate(archs, mode, probes, envs))
    if mode == "overlay":
        checks.append(check_index(environ, probes))
    else:
        checks += check_git_network(environ, mode, need_network, probes)
    checks.append(check_conda(environ))
    checks.append(check_gpu(archs, environ, version, probes))
    return DoctorReport(mode, label, tuple(checks), mode_reason)
