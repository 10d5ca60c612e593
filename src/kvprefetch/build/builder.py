"""Building one tree of a ``BuildPlan`` in kernels-only or full mode: walks the ``TreePlan``'s
steps under a per-tree lock, skipping a tree whose manifest matches, and returns a
``TreeOutcome`` for the closing summary. What every mode's tree build shares (the outcome, the
lock, the skip, the child environment, the tree-prefixed messages) is here too; the overlay
mode's is in ``overlay_mode``, and ``pipeline.execute`` runs the trees concurrently."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..console import info
from ..errors import BuildError
from ..hashing import sha256_file
from ..machine.progress import CompileProgress, heartbeat, previous_seconds
from ..runner import run
from ..workspace import ownership
from ..workspace.locks import locked
from ..workspace.workdir import Workdir, write_json_atomic
from .plan import BuildPlan, TreePlan, manifest_matches

_print_lock = threading.Lock()


@dataclass
class TreeOutcome:
    tree: str
    status: str = "pending"          # built | up-to-date | failed | planned
    seconds: float = 0.0
    log_dir: str = ""
    so: str | None = None
    so_sha256: str | None = None
    error: str | None = None
    error_kind: str | None = None     # the KvprefetchError class name, e.g. LockError
    steps: list[dict[str, Any]] = field(default_factory=list)


def say(tree: str, msg: str) -> None:
    with _print_lock:
        info(f"[{tree}] {msg}")


@contextmanager
def tree_locks(tp: TreePlan, plan: BuildPlan) -> Iterator[None]:
    """The tree's own lock (shared with fetch, apply and clean: nobody changes the sources
    being compiled) and the build's lock; build/<tree> is recorded as the kit's own."""
    wd = Workdir(Path(plan.workdir))
    bdir = Path(tp.build_dir)
    with locked(wd.tree_lock(tp.tree), f"the tree {tp.tree}"), \
            locked(bdir.parent / ".lock", f"the {tp.tree} build"):
        if ownership.owned(wd.root, bdir.parent) is None:
            ownership.record(wd.root, bdir.parent, "build")
        yield


def skip_if_up_to_date(tp: TreePlan, force: bool, out: TreeOutcome) -> bool:
    """Fill ``out`` and return True when the tree's manifest matches the plan's key."""
    existing = None if force else manifest_matches(tp)
    if existing is None:
        return False
    out.status, out.so, out.so_sha256 = "up-to-date", existing["so_path"], existing["so_sha256"]
    say(tp.tree, f"up to date (manifest {Path(tp.build_dir) / 'manifest.json'} matches key "
                  f"{tp.key})")
    return True


def _env_for(tp: TreePlan, plan: BuildPlan, torch_from: str | None) -> Any:
    from ..machine.envs import make_env

    opts: dict[str, Any] = {"log": str(Path(tp.log_dir) / "01-create-env.log")}
    if plan.mode == "kernels-only" and tp.env_backend == "venv":
        opts.update(python=torch_from or tp.steps[0].argv[0], system_site_packages=True,
                    with_pip=False)
    return make_env(tp.env_backend, tp.env_path, **opts)


def child_env(env_obj: Any, tp: TreePlan) -> dict[str, str]:
    e = env_obj.environ()
    for k in tp.env_unset:
        e.pop(k, None)
    e.update(tp.env_set)
    return e


def compile_with_progress(tree: str, argv: list[str], *, env: dict[str, str], log: Path,
                          fix: str, started: float, build_root: Path,
                          selection: dict[str, Any], heavy: int | None = None,
                          jobs: int = 1) -> None:
    """Run ninja, showing its ``[n/N]`` with the time elapsed since ``started`` (the tree's
    build) and an estimate of the time left. ninja prints a counter only as each edge ends,
    minutes apart for a full launcher source, so a heartbeat repeats the line in between.
    ``heavy``: how many of the edges are nvcc's (the pace counts only those; progress.py)."""
    prog = CompileProgress(started, previous_seconds(build_root, selection), heavy=heavy,
                           light_first=jobs > 1)
    lock = threading.Lock()

    def show() -> None:
        with lock:
            say(tree, prog.line(time.monotonic()))

    def progress(n: int, total: int) -> None:
        with lock:
            prog.update(n, total)
        show()

    with heartbeat(show):
        run(argv, env=env, log=log, on_progress=progress, fix=fix)


def ninja_jobs(argv: tuple[str, ...] | list[str]) -> int:
    """The ``-j N`` of a ninja command line (1 when absent or unreadable)."""
    args = list(argv)
    for i, a in enumerate(args[:-1]):
        if a == "-j" and args[i + 1].isdigit():
            return int(args[i + 1])
    return 1


def prepare_tree(tp: TreePlan, plan: BuildPlan, force: bool, out: TreeOutcome,
                 make_env: Callable[[], Any]) -> tuple[Any, dict[str, str]] | None:
    """The start every mode's tree build shares, inside the tree's lock: None when the tree is
    up to date (``out`` says so); else the log folder made, the environment ``make_env()``
    created (recorded as the kit's own) and the environment its commands run in."""
    if skip_if_up_to_date(tp, force, out):
        return None
    Path(tp.log_dir).mkdir(parents=True, exist_ok=True)
    say(tp.tree, f"creating environment {tp.env_path}")
    env_obj = make_env()
    env_obj.create(owner=Path(plan.workdir))
    return env_obj, child_env(env_obj, tp)


def build_kernels_tree(tp: TreePlan, plan: BuildPlan, torch_from: str | None,
                       force: bool) -> TreeOutcome:
    from .kernels_only import probe_torch
    from .library import install_library, library_manifest, write_library_ninja

    out = TreeOutcome(tp.tree, log_dir=tp.log_dir)
    logs = Path(tp.log_dir)
    t0 = time.monotonic()
    with tree_locks(tp, plan):
        ready = prepare_tree(tp, plan, force, out, lambda: _env_for(tp, plan, torch_from))
        if ready is None:
            return out
        env_obj, child = ready
        tinfo = probe_torch(str(env_obj.python), child, log=logs / "02-probe-torch.log")
        cuda_home = plan.toolchain.get("cuda_home")
        nvcc = plan.toolchain.get("nvcc")
        if not cuda_home or not nvcc:
            raise BuildError("no CUDA toolkit was found for the kernels-only build",
                             "install the CUDA toolkit (nvcc) and set CUDA_HOME; "
                             "`kvprefetch doctor` shows what is missing")
        lib = write_library_ninja(tp, plan, tinfo, Path(cuda_home), Path(nvcc))
        step_t = time.monotonic()
        compile_with_progress(
            tp.tree, list(tp.steps[3].argv), env=child, log=logs / "04-compile.log",
            fix=f"read {logs / '04-compile.log'}; fix the cause and rerun: finished objects are "
                "kept and the build resumes",
            started=t0, build_root=Path(tp.build_dir).parent, selection=plan.selection,
            heavy=len(lib.sources), jobs=ninja_jobs(tp.steps[3].argv))
        out.steps.append({"step": "compile", "seconds": round(time.monotonic() - step_t, 1)})
        installed, so_sha = install_library(tp, plan, lib, env_obj.site_packages())
        write_json_atomic(Path(tp.build_dir) / "manifest.json", library_manifest(
            tp, plan, lib, mode=plan.mode, installed=installed, so_sha=so_sha, tinfo=tinfo,
            env_python=str(env_obj.python), started=t0))
    out.status, out.so, out.so_sha256 = "built", str(installed), so_sha
    out.seconds = round(time.monotonic() - t0, 1)
    say(tp.tree, f"built {lib.so.name} in {out.seconds:.0f} s -> {installed}")
    return out


def build_full_tree(tp: TreePlan, plan: BuildPlan, force: bool) -> TreeOutcome:
    """Full mode: the env, vLLM's pinned requirements, ``pip install --no-build-isolation``."""
    out = TreeOutcome(tp.tree, log_dir=tp.log_dir)
    bdir = Path(tp.build_dir)
    logs = Path(tp.log_dir)
    t0 = time.monotonic()
    with tree_locks(tp, plan):
        ready = prepare_tree(tp, plan, force, out, lambda: _env_for(tp, plan, None))
        if ready is None:
            return out
        env_obj, child = ready
        stats = ""
        for i, s in enumerate(tp.steps, 1):
            if s.name == "unpack-deps":
                from ..sources.deps import unpack_archives

                say(tp.tree, s.description)
                unpack_archives(Path(str(s.cwd)),
                                Path(tp.env_set["VLLM_CUTLASS_SRC_DIR"]).parent)
                continue
            if not s.argv:
                continue
            say(tp.tree, f"{s.name}: {s.description}")
            res = run(list(s.argv), env=child, cwd=s.cwd, log=logs / f"{i:02d}-{s.name}.log")
            if s.name == "ccache-stats":
                stats = res.output
        so_files = sorted(Path(tp.source_tree, "vllm").rglob("*.so")) or \
            sorted(env_obj.site_packages().joinpath("vllm").rglob("*.so"))
        c = [p for p in so_files if p.name.startswith("_C.")]
        if not c:
            raise BuildError(f"the build finished but no vllm/_C*.so was produced for {tp.tree}",
                             f"read the logs in {logs}")
        outputs = [{"path": str(p), "sha256": sha256_file(p)} for p in so_files]
        write_json_atomic(bdir / "manifest.json", {
            "kvprefetch": __version__, "mode": plan.mode, "tree": tp.tree, "variant": tp.variant or "stock",
            "key": tp.key, "so_path": str(c[0]), "so_sha256": sha256_file(c[0]),
            "inputs": {"source_tree": tp.source_tree, "source_sha256": tp.source_sha256,
                       "patch_sha256": tp.patch_sha256, "arch_list": plan.arch_list,
                       "env_set": tp.env_set},
            "toolchain": plan.toolchain, "ccache_stats": stats, "outputs": outputs,
            "env": {"backend": tp.env_backend, "path": tp.env_path},
        })
        out.status, out.so, out.so_sha256 = "built", str(c[0]), sha256_file(c[0])
    out.seconds = round(time.monotonic() - t0, 1)
    return out
