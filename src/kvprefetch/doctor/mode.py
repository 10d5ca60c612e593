"""Which build mode to check and build: ``choose_mode`` resolves ``--mode auto`` on this machine
(``build`` and ``doctor`` both decide here, so plain ``doctor`` checks the mode that plain
``build`` would build), and ``check_machine`` is ``kvprefetch doctor``'s library call."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import ConfigError
from ..machine.toolchain import CudaArch
from .preflight import run_doctor
from .probes import DoctorProbes
from .report import DoctorReport, Mode

AUTO_RULE = "full where a CUDA >= 12.8 toolkit, a GPU and the network exist, else kernels-only"


@dataclass(frozen=True)
class ModeChoice:
    """The build mode for ``--mode`` (``auto`` resolved on this machine), and why."""
    mode: Mode
    reason: str
    full_report: DoctorReport | None = None  # auto's full-mode preflight, when it ran one
    fallback: bool = False                    # auto found no full build here


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
    return ModeChoice("kernels-only", f"--mode auto: no full build here ({why})", rep,
                      fallback=True)


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
