"""The preflight's checks of the machine around the toolchain: disk (against ``estimates``),
memory and the compile jobs it allows, how long the build would take, git and the network a
full build's FetchContent needs, the package index an overlay installs from, conda, and
whether the GPU runs what ``--arch`` builds."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..machine.envs import find_conda
from ..machine.toolchain import GIB_PER_NVCC_JOB, CudaArch, default_jobs, fmt_version, vllm_c_archs
from ..runner import which
from .estimates import GIB, SMOKE_DISK_GB, existing, overlay_disk_gb, shares_one_install
from .probes import DoctorProbes
from .report import Check, Mode, Status
from .tools import tool_version

DEFAULT_INDEX = "https://pypi.org/simple/"
DEPS_VARS = ("VLLM_CUTLASS_SRC_DIR", "VLLM_FLASH_ATTN_SRC_DIR", "FLASH_MLA_SRC_DIR")


def check_index(environ: Mapping[str, str], probes: DoctorProbes) -> Check:
    """An overlay build installs vllm==0.10.2, torch==2.8.0 and xformers from the index."""
    url = environ.get("UV_INDEX_URL") or environ.get("PIP_INDEX_URL") or DEFAULT_INDEX
    reachable, detail = probes.index(url, environ)
    if reachable:
        return Check("package-index", "ok", detail)
    return Check("package-index", "fail", detail + "; the overlay installs vllm==0.10.2, "
                 "torch==2.8.0 and xformers==0.0.32.post1 from it",
                 "make the index reachable, or point PIP_INDEX_URL / UV_INDEX_URL at a mirror")


def _gib(size: float) -> str:
    """A size in GiB as a person reads it: a kernels-only build's 0.5 GiB said "needs about 0
    GiB ... a disk with at least 0 GiB free" on a disk with 0.3 GiB (issue 41, the fifteenth
    hostile pass)."""
    return f"{size:.0f}" if size >= 10 else f"{size:.1f}"


def _no_folder(workdir: Path) -> Path | None:
    """What stands where the work directory (or a folder above it) must be: a file, FIFO,
    socket or device. ``doctor --workdir FILE`` (``/dev/zero``, a FIFO, ``FILE/sub``) said
    "62.6 GiB free at FILE ... all checks passed", and the build then refused the work
    directory (issue 41, the twenty-second hostile pass)."""
    here = existing(workdir)
    return None if here.is_dir() else here


def _what_is(path: Path) -> str:
    import stat

    mode = path.stat().st_mode
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a file"


def check_disk(workdir: Path, mode: Mode, probes: DoctorProbes, smoke: bool = False,
                environ: Mapping[str, str] | None = None, env_backend: str | None = None,
                envs: int = 2) -> Check:
    how = ""
    if smoke:
        need = SMOKE_DISK_GB
    elif mode == "overlay":
        from ..overlay.install import default_backend

        shared, why = shares_one_install(env_backend or default_backend(), workdir,
                                         environ if environ is not None else os.environ)
        need = overlay_disk_gb(envs, shared)
        how = f" for {envs} environment(s): {why}"
    else:
        need = probes.disk_estimate_gb[mode]
    what = "the full-mode smoke" if smoke else \
        f"{'an' if mode == 'overlay' else 'a'} {mode} build"
    blocker = _no_folder(workdir)
    if blocker is not None:
        return Check("disk", "fail",
                     f"the work directory {workdir} cannot be made: {blocker} is "
                     f"{_what_is(blocker)}, not a folder, and {what} makes its trees, builds "
                     "and state in a folder",
                     f"pass --workdir a folder of yours (or a path not made yet), or move "
                     f"{blocker} away if it is yours")
    if any(ord(c) < 0x20 or ord(c) == 0x7f for c in os.fspath(workdir)):
        # the build wrote the path into build.ninja, which has no escape for a newline, and
        # refused it only after making its environment (issue 41, left open by the
        # thirty-sixth hostile pass)
        return Check("disk", "fail",
                     f"the work directory's path {os.fspath(workdir)!r} holds a control "
                     f"character (a newline, tab, escape, ...): {what} writes it into "
                     "build.ninja and compiler command lines, which cannot carry one",
                     "rename the folder (or choose another) without it and pass that to "
                     "--workdir")
    if probes.disk_read_only(workdir):
        # the free space of a read-only disk is beside the point: the line said only "0.3
        # GiB free" with a fix about space, and nothing said the build could not write at
        # all (issue 41, the fifteenth hostile pass)
        return Check("disk", "fail",
                     f"{workdir} is on a read-only file system: {what} writes its trees, "
                     "builds and state there",
                     "remount that file system read-write (mount -o remount,rw MOUNTPOINT) "
                     "or pass --workdir on a writable disk")
    if probes.disk_no_symfollow(workdir):
        # the build named it only once its first environment could not run (issue 41, left
        # open by the thirty-sixth hostile pass)
        return Check("disk", "fail",
                     f"{workdir} is on a file system mounted nosymfollow: every environment's "
                     f"bin/python is a symlink, which no program follows there, so {what} "
                     "cannot run the environments it makes",
                     f"remount it with symfollow (`findmnt -T {existing(workdir)}` shows its "
                     "options; mount -o remount,symfollow MOUNTPOINT) or pass --workdir on "
                     "another file system")
    free = probes.disk_free(workdir) / GIB
    detail = f"{free:.1f} GiB free at {workdir}, {what} needs about {_gib(need)} GiB{how}"
    fix = f"free space or pass --workdir on a disk with at least {_gib(need)} GiB free"
    if free < need:
        return Check("disk", "fail", detail, fix)
    if free < 1.5 * need:
        return Check("disk", "warn", detail + " (little headroom)", fix)
    return Check("disk", "ok", detail)


def check_memory(archs: Sequence[CudaArch], probes: DoctorProbes) -> Check:
    cores, mem = probes.resources()
    jobs, threads = default_jobs(cores, mem, n_archs=max(1, len(archs)))
    detail = (f"{cores} cores, {mem:.1f} GiB available: MAX_JOBS={jobs} NVCC_THREADS={threads} "
              f"({GIB_PER_NVCC_JOB} GiB per compile job)")
    if mem < GIB_PER_NVCC_JOB:
        return Check("memory", "warn", detail + "; even one job may run out of memory",
                     "close other programs or add swap; --jobs 1")
    return Check("memory", "ok", detail)


def check_estimate(archs: Sequence[CudaArch], mode: Mode, probes: DoctorProbes,
                    trees: int) -> Check:
    """How long `build` would compile here, said as `build` says it (builds/foresight.py): a
    kernels-only or overlay build of ``trees`` trees with every instantiation; over ten minutes,
    `build` asks first at a terminal (or takes --yes)."""
    from ..kernels.selection import Selection
    from ..machine.foresight import CONFIRM_OVER_S, compile_seconds
    from ..machine.progress import clock

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


def check_git_network(environ: Mapping[str, str], mode: Mode, need_network: bool | None,
                       probes: DoctorProbes) -> list[Check]:
    checks = []
    if which("git", environ) is None:
        checks.append(Check("git", "fail" if mode == "full" else "warn", "git not found on PATH",
                            "install git (CMake's FetchContent clones CUTLASS, "
                            "vllm-flash-attn and FlashMLA with it)"))
    else:
        v = tool_version(["git", "--version"], environ)
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


def check_conda(environ: Mapping[str, str]) -> Check:
    exe = find_conda(environ)
    if exe is None:
        return Check("conda", "skip", "not found; environments will use venv (or uv)")
    return Check("conda", "ok", f"{exe} (used with --env-backend conda)")


def check_gpu(archs: Sequence[CudaArch], environ: Mapping[str, str],
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
