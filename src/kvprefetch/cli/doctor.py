"""CLI: ``kvprefetch doctor`` (thin over kvprefetch.doctor.mode): the build preflight as a table or
JSON; exits non-zero when any check fails."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .common import json_option, workdir_option

_MARK = {"ok": "✓", "warn": "!", "fail": "✕", "skip": "-"}


@click.command()
@click.option("--arch", default="9.0a", show_default=True,
              help="CUDA archs to build for (TORCH_CUDA_ARCH_LIST syntax: 9.0a, '8.0;9.0a').")
@click.option("--mode", type=click.Choice(["auto", "full", "kernels-only", "overlay"]),
              default="auto", show_default=True,
              help="Which build to check for; auto: the mode `build --mode auto` picks here "
                   "(full where a CUDA >= 12.8 toolkit, a GPU and the network exist, else "
                   "kernels-only).")
@click.option("--cuda-home", default=None, help="Overlay: the CUDA 12.x toolkit to compile with.")
@click.option("--allow-cuda-mismatch", is_flag=True,
              help="Overlay: accept a toolkit whose major version differs from torch's CUDA.")
@click.option("--kernels-only", "kernels_only", is_flag=True, help="Same as --mode kernels-only.")
@click.option("--deps-dir", type=click.Path(path_type=Path), default=None,
              help="Local clones of vLLM's FetchContent dependencies: the network is not needed.")
@click.option("--smoke", is_flag=True,
              help="Check for `build --mode full --smoke` (vLLM's configure and the attention "
                   "objects only): torch 2.8.0, a CUDA 12 toolkit, cmake >= 3.26.1, ninja.")
@click.option("--torch-from", default=None, metavar="PYTHON",
              help="--smoke: the interpreter with torch==2.8.0 to configure against.")
@workdir_option
@json_option
def doctor(arch: str, mode: str, cuda_home: str | None, allow_cuda_mismatch: bool,
           kernels_only: bool, deps_dir: Path | None, smoke: bool, torch_from: str | None,
           workdir: Path, as_json: bool) -> None:
    """Check this machine for building both trees: nvcc and a real compile of the prefetch
    instruction, CUDA_HOME, gcc, cmake, disk, memory, git and network, conda, and the GPU."""
    from ..console import emit_json, info, table
    from ..doctor.mode import check_machine

    report = check_machine("kernels-only" if kernels_only else mode, arch, workdir=workdir,
                           local_deps=deps_dir is not None, cuda_home_opt=cuda_home,
                           allow_cuda_mismatch=allow_cuda_mismatch, smoke=smoke,
                           torch_from=torch_from)
    if as_json:
        emit_json(report.to_dict())
    else:
        info(f"checking the {report.mode} build ({report.mode_reason})")
        rows = [(f"{_MARK[c.status]} {c.status}", c.name, c.detail, c.fix or "")
                for c in report.checks]
        table(["status", "check", "detail", "to fix"], rows,
              title=f"kvprefetch doctor: {report.mode}, --arch {arch}")
        failed = len(report.failures)
        click.echo(f"{report.mode}: all checks passed" if report.ok
                   else f"{report.mode}: {failed} check(s) failed", err=True)
    if not report.ok:
        from ..errors import ConfigError

        sys.exit(ConfigError.exit_code)
