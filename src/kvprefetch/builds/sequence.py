"""One tree's build, the same for every mode: ``build_tree`` takes the tree's lock and its
build's lock, skips a tree whose manifest matches the plan's key, makes the log folder and the
environment (recorded as the kit's own) and the environment its commands run in, walks the
plan's steps by name, writes the manifest (its core here, each mode's entries from the mode)
and returns a ``TreeOutcome`` for the closing summary.

What differs between modes is a ``TreeSteps`` (``modes/``): the environment it makes, a
handler per step name and its manifest entries. Two step names belong to the sequence itself:
``create-env`` (the environment is made before the steps, inside the locks) and ``manifest``.
The helpers the modes' steps share (tree-prefixed messages, ninja with progress) are here too;
``pipeline.execute`` runs the trees, concurrently where the mode allows."""

from __future__ import annotations

import abc
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..console import info
from ..errors import BuildError
from ..machine.envs import Env
from ..machine.progress import CompileProgress, heartbeat, previous_seconds
from ..runner import run
from ..workspace import ownership
from ..workspace.confine import (
    check_target,
    ensure_dir,
    first_hard_link,
    is_plain_file,
    what_is,
)
from ..workspace.locks import locked
from ..workspace.workdir import Workdir, write_json_atomic
from .options import ModeInputs
from .plan import BuildPlan, Step, TreePlan, manifest_matches

_print_lock = threading.Lock()

# The steps every plan may hold that the sequence runs itself, not a mode's handler.
CREATE_ENV, MANIFEST = "create-env", "manifest"

StepHandler = Callable[[Step, Path], None]


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


@dataclass
class TreeRun:
    """One tree's build in progress: its plan, what the mode resolved, the outcome being
    filled, and (once made) the environment and the environment its commands run in."""

    tp: TreePlan
    plan: BuildPlan
    inputs: ModeInputs
    out: TreeOutcome
    started: float
    env: Env | None = None
    child: dict[str, str] = field(default_factory=dict)
    env_seconds: float = 0.0          # the locks taken to the environment made

    @property
    def logs(self) -> Path:
        return Path(self.tp.log_dir)

    @property
    def build_dir(self) -> Path:
        return Path(self.tp.build_dir)

    def say(self, msg: str) -> None:
        say(self.tp.tree, msg)

    def need_env(self) -> Env:
        if self.env is None:
            raise BuildError(f"the {self.tp.tree} build has no environment for this step",
                             "report this: the plan and its mode disagree")
        return self.env


class TreeSteps(abc.ABC):
    """A mode's part of one tree's build (its handlers run inside the tree's locks).

    Exception contract: a handler raises a ``KvprefetchError`` (usually ``BuildError``) naming
    the cause and the log; the sequence lets it through, and ``pipeline.execute`` records it
    as the tree's failure."""

    def __init__(self, run: TreeRun) -> None:
        self.run = run

    @abc.abstractmethod
    def make_env(self) -> Env | None:
        """The tree's environment, not created yet (None: the commands run in this process's
        environment, isolated; the smoke has no environment of its own)."""

    @abc.abstractmethod
    def handlers(self) -> Mapping[str, StepHandler]:
        """The handler of each step name the mode's plans hold (``create-env`` and
        ``manifest`` excepted); each gets the step and its log path (``NN-name.log``)."""

    @abc.abstractmethod
    def manifest(self, core: dict[str, Any]) -> dict[str, Any]:
        """``core`` (``manifest_core``) with the mode's entries; may raise instead (nothing is
        recorded for a build that failed its checks)."""

    # Optional hooks, a no-op unless a mode overrides them (hence not abstract).
    def recorded(self) -> None:  # noqa: B027
        """After manifest.json is written, still inside the locks."""

    def finish(self) -> None:  # noqa: B027
        """After the locks are released: the tree's closing line."""


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
            locked(bdir.parent / ".lock", f"the {tp.tree} build", root=wd.root):
        if ownership.owned(wd.root, bdir.parent) is None:
            ownership.record(wd.root, bdir.parent, "build")
        yield


def refuse_hard_links(tp: TreePlan, plan: BuildPlan) -> None:
    """Refuse a build folder (and, for a full build, which writes into it, the tree) holding a
    file with more than one hard link: the compilers, ninja and the logs write their files in
    place, so they would write the same file under its other name, perhaps outside the work
    directory (issue 41, the ninth hostile pass: a log and ninja's files hard-linked to files
    outside had the build's output written into them). The kit never makes a hard link there."""
    tops = [Path(tp.build_dir).parent] + ([Path(tp.source_tree)] if plan.mode == "full" else [])
    for top in tops:
        found = first_hard_link(top)
        if found is not None:
            path, links = found
            raise BuildError(
                f"the {tp.tree} build refuses {path}: it has {links} hard links (the same file "
                "under another name, perhaps outside the work directory), and a build writes "
                "its files in place",
                f"move {path} away (the build makes its own), then rerun"
                + ("; or `kvprefetch clean --what builds` and build again"
                   if top == Path(tp.build_dir).parent else ""))


def refuse_a_taken_manifest(tp: TreePlan, root: Path) -> None:
    """Refuse, before anything compiles, a ``manifest.json`` the build could not replace: a
    symlink (the writer never writes through one), a folder, a FIFO. The build found it only
    when it wrote the manifest, after minutes of nvcc (issue 41, left open by the thirty-fourth
    hostile pass). A link on the way in the work directory ``root`` is named first: a build
    folder planted as a link to a folder outside holding a ``manifest.json`` folder was told
    "move <build folder>/manifest.json away", and doing so moved the folder outside (issue 41,
    the thirty-seventh hostile pass)."""
    m = Path(tp.build_dir) / "manifest.json"
    check_target(root, m, what="record the build in", family=BuildError)
    if os.path.lexists(m) and not is_plain_file(m):
        raise BuildError(f"the {tp.tree} build cannot record itself in {m}: it is "
                         f"{'a symlink' if m.is_symlink() else what_is(m)}, which the build "
                         "never writes through or replaces",
                         f"move {m} away (its target, if a link, is left as it is), then rerun")


def skip_if_up_to_date(tp: TreePlan, force: bool, out: TreeOutcome) -> bool:
    """Fill ``out`` and return True when the tree's manifest matches the plan's key."""
    existing = None if force else manifest_matches(tp)
    if existing is None:
        return False
    out.status, out.so, out.so_sha256 = "up-to-date", existing["so_path"], existing["so_sha256"]
    say(tp.tree, f"up to date (manifest {Path(tp.build_dir) / 'manifest.json'} matches key "
                  f"{tp.key})")
    return True


def child_env(env_obj: Env, tp: TreePlan) -> dict[str, str]:
    e = env_obj.environ()
    for k in tp.env_unset:
        e.pop(k, None)
    e.update(tp.env_set)
    return e


def isolated_environ(tp: TreePlan) -> dict[str, str]:
    """This process's environment without what the plan unsets, plus what it sets."""
    e = {k: v for k, v in os.environ.items() if k not in tp.env_unset}
    e.update(tp.env_set)
    return e


def manifest_core(tp: TreePlan, plan: BuildPlan) -> dict[str, Any]:
    """What every mode's manifest.json records: the kit, the mode, the tree and its variant,
    the key, and the inputs that make the key (each mode adds its own to ``inputs``)."""
    return {"kvprefetch": __version__, "mode": plan.mode, "tree": tp.tree,
            "variant": tp.variant or "stock", "key": tp.key,
            "inputs": {"source_tree": tp.source_tree, "source_sha256": tp.source_sha256,
                       "patch_sha256": tp.patch_sha256, "arch_list": plan.arch_list}}


def build_tree(tp: TreePlan, plan: BuildPlan, inputs: ModeInputs, force: bool,
               start: Callable[[TreeRun], TreeSteps]) -> TreeOutcome:
    """Build one tree of ``plan`` with the mode's steps (``start``); raises the first step's
    KvprefetchError (``pipeline.execute`` collects it)."""
    out = TreeOutcome(tp.tree, log_dir=tp.log_dir)
    run_ = TreeRun(tp, plan, inputs, out, time.monotonic())
    steps = start(run_)
    with tree_locks(tp, plan):  # the tree's lock too: no apply changes what is compiled
        locked_at = time.monotonic()
        if skip_if_up_to_date(tp, force, out):
            return out
        refuse_hard_links(tp, plan)
        refuse_a_taken_manifest(tp, Path(plan.workdir))
        # made from the work directory down, never through a link: a build folder planted as
        # a link to a folder outside had the logs and the copied sources written there (issue
        # 41, the thirteenth hostile pass)
        ensure_dir(run_.logs, root=Path(plan.workdir), family=BuildError)
        env = steps.make_env()
        if env is None:
            run_.child = isolated_environ(tp)
        else:
            say(tp.tree, f"creating environment {tp.env_path}")
            env.create(owner=Path(plan.workdir))
            run_.env, run_.child = env, child_env(env, tp)
        run_.env_seconds = round(time.monotonic() - locked_at, 1)
        handlers = steps.handlers()
        with compilers_tmpdir(run_):
            for i, s in enumerate(tp.steps, 1):
                if s.name == CREATE_ENV:
                    continue
                if s.name == MANIFEST:
                    write_json_atomic(run_.build_dir / "manifest.json",
                                      steps.manifest(manifest_core(tp, plan)))
                    steps.recorded()
                    continue
                handler = handlers.get(s.name)
                if handler is None:
                    raise BuildError(f"the {plan.mode} build of {tp.tree} has no step "
                                     f"{s.name!r}", "report this: the plan and its mode disagree")
                handler(s, run_.logs / f"{i:02d}-{s.name}.log")
    out.status = "built"
    out.seconds = round(time.monotonic() - run_.started, 1)
    steps.finish()
    return out


@contextmanager
def compilers_tmpdir(run_: TreeRun) -> Iterator[None]:
    """The build's commands get a ``TMPDIR`` of their own, removed when the tree's steps end,
    however they end: a build stopped mid-compile (Ctrl-C, SIGTERM, SIGHUP) left nvcc's
    ``tmpxft_*`` files, about 34 MB, in the system temp (issue 41, the ninth and tenth passes
    left it open). The folder is private (``ownership.private_dir``, 0700 in the system temp,
    under the user's own TMPDIR when set), not in the work directory: nvcc writes its
    temporaries there by predictable names, which in a folder others may write would be
    places to plant a link. Only a SIGKILL of the kit itself still leaves it."""
    with ownership.private_dir(f"build-{run_.tp.tree}",
                               outside=Path(run_.plan.workdir)) as tmp:
        old = run_.child.get("TMPDIR")
        run_.child["TMPDIR"] = str(tmp)
        try:
            yield
        finally:
            if old is None:
                run_.child.pop("TMPDIR", None)
            else:
                run_.child["TMPDIR"] = old


def compile_with_progress(tree: str, argv: list[str], *, env: dict[str, str], log: Path,
                          fix: str, started: float, build_root: Path,
                          selection: dict[str, Any], heavy: int | None = None,
                          jobs: int = 1, workdir: Path | None = None) -> None:
    """Run ninja, showing its ``[n/N]`` with the time elapsed since ``started`` (the tree's
    build) and an estimate of the time left. ninja prints a counter only as each edge ends,
    minutes apart for a full launcher source, so a heartbeat repeats the line in between.
    ``heavy``: how many of the edges are nvcc's (the pace counts only those; progress.py).
    With ``workdir``, ninja runs in a private copy of its build folder
    (``ninjadir.private_ninja``), whose outputs come back into ``workdir``'s build folder
    through ``confine`` (a build.ninja whose outputs are all at its top: the library builds;
    cmake's build tree of the smoke runs in place)."""
    from .ninjadir import private_ninja

    prog = CompileProgress(started, previous_seconds(build_root, selection), heavy=heavy,
                           light_first=jobs > 1)
    lock = threading.Lock()

    def show() -> None:
        with lock:
            say(tree, prog.line(time.monotonic()))

    sync: Callable[[], None] = lambda: None

    def progress(n: int, total: int) -> None:
        with lock:
            prog.update(n, total)
        show()
        sync()  # the edge that just ended: its output into the build folder now

    with ExitStack() as stack:
        if workdir is not None:
            argv, sync = stack.enter_context(private_ninja(argv, root=workdir, tree=tree))
        with heartbeat(show):
            run(argv, env=env, log=log, on_progress=progress, fix=fix)


def unpack_deps(run_: TreeRun, step: Step) -> None:
    """The ``unpack-deps`` step of a full or smoke plan (``plan.deps_steps``): the hash-listed
    archives of ``step.cwd`` unpacked once into the work directory's ``deps/`` (where the
    plan's VLLM_CUTLASS_SRC_DIR points)."""
    from ..sources.deps import unpack_archives

    run_.say(step.description)
    unpack_archives(Path(str(step.cwd)), Path(run_.plan.workdir))


def ninja_jobs(argv: tuple[str, ...] | list[str]) -> int:
    """The ``-j N`` of a ninja command line (1 when absent or unreadable)."""
    args = list(argv)
    for i, a in enumerate(args[:-1]):
        if a == "-j" and args[i + 1].isdigit():
            return int(args[i + 1])
    return 1
