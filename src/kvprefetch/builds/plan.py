"""The build plan: every decision about a build, made from the options and the machine before
anything runs, frozen, printable (``--dry-run``) and serialisable (``--json``).

A ``BuildPlan`` holds one ``TreePlan`` per tree (baseline, patched, and paper when present).
Each ``TreePlan`` names its source tree and patch hash, its environment backend and path, the
exact commands and environment variables, the log directory and the expected outputs. What
every plan shares is here (the key, the source hash, the tree's variant, the rendering); each
mode makes its own ``TreePlan`` (``modes/``) and ``pipeline.make_plan`` assembles the
``BuildPlan``."""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import upstream
from ..errors import ConfigError
from ..hashing import MAX_LIBRARY_BYTES, differences, inventory, sha256_file
from ..reading import load_json
from ..workspace import confine, ownership
from ..workspace.workdir import Workdir

# Variables that silently swap binaries or break isolation: never passed to a build.
UNSET_FOR_BUILD = ("PYTHONPATH", "PYTHONHOME", "VLLM_USE_PRECOMPILED",
                   "VLLM_PRECOMPILED_WHEEL_LOCATION", "VLLM_TEST_USE_PRECOMPILED_NIGHTLY_WHEEL")


@dataclass(frozen=True)
class Step:
    name: str
    argv: tuple[str, ...]            # empty for an internal step (done in Python)
    description: str = ""
    cwd: str | None = None


@dataclass(frozen=True)
class TreePlan:
    tree: str
    variant: str | None              # None for baseline
    source_tree: str
    source_sha256: str               # hash over the tree's recorded csrc/ inventory
    patch_sha256: str | None
    env_backend: str
    env_path: str
    python: str
    build_dir: str
    log_dir: str
    key: str
    namespace: str
    defines: tuple[str, ...]
    env_set: dict[str, str]
    env_unset: tuple[str, ...]
    steps: tuple[Step, ...]
    outputs: tuple[str, ...]

    def step(self, name: str) -> Step:
        """The step called ``name`` (steps are found by name, never by position)."""
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"the {self.tree} plan has no step {name!r}")


@dataclass(frozen=True)
class BuildPlan:
    mode: str
    workdir: str
    arch_list: str
    gencode: tuple[str, ...]
    jobs: int
    nvcc_threads: int
    selection: dict[str, Any]
    toolchain: dict[str, Any]
    trees: tuple[TreePlan, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    # How many trees build at once; jobs is per tree, so parallel_trees * jobs <= MAX_JOBS and
    # the memory bound behind MAX_JOBS (one heavy nvcc per job) holds.
    parallel_trees: int = 1
    # Trees whose manifest already records this plan's key with intact outputs: the build
    # skips them (unless --force).
    up_to_date: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# What a build compiles from a tree: its sources and build files.
_SOURCE_DIRS = ("csrc", "cmake", "requirements")
_SOURCE_FILES = ("CMakeLists.txt", "setup.py", "pyproject.toml")


def _compiled(path: str) -> bool:
    return path.startswith(tuple(f"{d}/" for d in _SOURCE_DIRS)) or path in _SOURCE_FILES


def source_hash(state: dict[str, Any]) -> str:
    """Identity of what a build compiles from a tree: the recorded csrc/ and build files."""
    inv = state.get("inventory", {})
    keep = sorted((p, h) for p, h in inv.items() if _compiled(p))
    return hashlib.sha256(json.dumps(keep).encode()).hexdigest()


def modified_sources(tree: Path, state: dict[str, Any]) -> list[str]:
    """The compiled files of ``tree`` that differ from what fetch/apply recorded (``M path``)
    or are gone (``D path``). Added files are not counted: a full build generates sources into
    csrc/ (vLLM's Marlin kernels), and a new file is only compiled through a changed one."""
    recorded = {p: h for p, h in state.get("inventory", {}).items() if _compiled(p)}
    current: dict[str, str] = {}
    for d in _SOURCE_DIRS:
        if (tree / d).is_dir():
            current.update({f"{d}/{p}": h for p, h in inventory(tree / d).items()})
    current.update({f: sha256_file(tree / f) for f in _SOURCE_FILES if (tree / f).is_file()})
    return [d for d in differences(recorded, current) if not d.startswith("A ")]


def build_key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _in_plan_folders(tp: TreePlan, path: Path) -> bool:
    """Whether an output a manifest lists is in this plan's own folders (its build folder, its
    environment, its tree: all in this work directory). A manifest is data: copied with its
    work directory (``cp -a``), it names the original's outputs, which still matched, so
    ``build`` called the copy "up to date" and skipped it, while verify-kernel refused the
    copy's manifests (an interpreter outside its envs/) with the fix to run ``kvprefetch
    build`` (issue 41, the nineteenth hostile pass: a wrong-way message)."""
    from ..workspace.confine import inside

    return any(inside(Path(d), path) for d in (tp.build_dir, tp.env_path, tp.source_tree))


def manifest_matches(tp: TreePlan) -> dict[str, Any] | None:
    """The existing manifest when it records this exact key and its outputs are intact (a
    corrupt manifest matches nothing: the build runs again and rewrites it)."""
    mpath = Path(tp.build_dir) / "manifest.json"
    if not mpath.is_file():
        return None
    try:
        m: dict[str, Any] = load_json(mpath)
        if not isinstance(m, dict) or m.get("key") != tp.key:
            return None
        # what `build` reports of an up-to-date tree: a manifest recording the key without its
        # library (or with another type) ended `build` in a KeyError traceback (issue 41, the
        # thirty-first hostile pass); absent or not text is corrupt, and the build runs again
        if not all(isinstance(m.get(k, 0), (str, type(None))) for k in ("so_path", "so_sha256")):
            return None
        for out in m.get("outputs", []):
            p = Path(out["path"])
            if not _in_plan_folders(tp, p):
                return None
            # read bounded (a library's size at most): a sparse 15 TB file at an output's
            # name was hashed for hours (the nineteenth hostile pass); larger is an OSError,
            # so no match
            if not p.is_file() or sha256_file(p, limit=MAX_LIBRARY_BYTES) != out["sha256"]:
                return None
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return m


def tree_variant(wd: Workdir, tree: str) -> tuple[dict[str, Any], str | None, str | None]:
    state = wd.read_state(tree)
    if state is None or not wd.tree(tree).is_dir():
        raise ConfigError(f"there is no kvprefetch tree {tree!r} in {wd.root}",
                          "run `kvprefetch fetch` (and `kvprefetch apply`) first")
    link = confine.first_symlink(wd.root, wd.tree(tree))
    if link is not None:
        # the build works in the tree by path (full mode's `pip install -e .` runs its setup.py
        # and writes build/, .deps/ and *.egg-info there): a trees/ linked to a folder outside
        # was hashed through the link as "unchanged" and planned (issue 41, the forty-third
        # hostile pass)
        raise ConfigError(f"the {tree!r} tree {wd.tree(tree)} lies behind the symlink {link}, "
                          "and kvprefetch never builds (writes) through one",
                          f"replace the symlink {link} by a real directory (or move it away), "
                          "then `kvprefetch fetch`")
    applied = state.get("applied") or {}
    if tree != "baseline" and not applied:
        raise ConfigError(f"the {tree!r} tree is pristine: building it would compare stock "
                          "against stock", f"run `kvprefetch apply --tree {tree}` first")
    if tree == "baseline" and applied:
        raise ConfigError("the baseline tree carries a patch", "run `kvprefetch fetch --force`")
    changed = modified_sources(wd.tree(tree), state)
    if changed:
        more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
        shown = ", ".join(changed[:4]) + more
        restore = "`kvprefetch fetch --force`"
        if tree != "baseline":
            restore += (f", then `kvprefetch apply --variant {applied.get('variant', 'prefetch')}"
                        f" --tree {tree}`")
        raise ConfigError(
            f"the {tree!r} tree was edited after kvprefetch recorded it ({shown}): its build "
            "would be labelled with sources it does not hold",
            f"restore it with {restore} (the edited tree is moved to backup/); try a change as "
            "a -D with `build --tree-define` or as a variant's diff in patches/")
    variant = applied.get("variant")
    return state, upstream.canonical_variant(variant) if variant else None, \
        applied.get("patch_sha256")


def default_trees(wd: Workdir) -> tuple[str, ...]:
    """baseline and patched, then every other tree that carries a patch (paper, extra trees)."""
    trees = list(upstream.TREE_NAMES)
    adopted = wd.is_adopted()
    for name in wd.existing_trees():
        if name in trees or (adopted and not _kit_tree(wd, name)):
            continue
        if (wd.read_state(name) or {}).get("applied"):
            trees.append(name)
    return tuple(trees)


def _kit_tree(wd: Workdir, name: str) -> bool:
    """Whether ``trees/<name>`` is a tree the kit made, by the ownership record. In a work
    directory adopted with the user's files, a ``trees/mine/`` with a ``state/mine.json`` of
    their own is theirs: reading it as the kit's stopped every ``build`` with "run `kvprefetch
    fetch --repair`", which never touches a tree the kit did not make (issue 41, the
    twenty-first hostile pass)."""
    return (ownership.owned(wd.root, wd.tree(name)) or {}).get("kind") == "tree"


def kit_python() -> str:
    return sys.executable


def env_set_common(arch_list: str, jobs: int, nvcc_threads: int,
                   cuda_home: str | None) -> dict[str, str]:
    env = {"TORCH_CUDA_ARCH_LIST": arch_list, "MAX_JOBS": str(jobs),
           "NVCC_THREADS": str(nvcc_threads)}
    if cuda_home:
        env["CUDA_HOME"] = cuda_home
    return env


def render_plan(plan: BuildPlan) -> str:
    """The human-readable plan with every command and variable (what --dry-run prints)."""
    import shlex

    out = [f"mode: {plan.mode}   arch: {plan.arch_list} -> {' '.join(plan.gencode)}",
           (f"jobs: MAX_JOBS={plan.jobs} per tree, {plan.parallel_trees} tree(s) at a time, "
            f"NVCC_THREADS={plan.nvcc_threads}   workdir: {plan.workdir}")]
    if plan.mode == "kernels-only":
        out.append(f"instantiations: {json.dumps(plan.selection)}")
    for k, v in plan.toolchain.items():
        out.append(f"{k}: {v}")
    for n in plan.notes:
        out.append(f"note: {n}")
    todo = [t.tree for t in plan.trees if t.tree not in plan.up_to_date]
    out.append(f"trees: {len(plan.trees)}; up to date: {', '.join(plan.up_to_date) or 'none'}; "
               f"to build: {', '.join(todo) or 'none'}")
    for t in plan.trees:
        if t.tree in plan.up_to_date:
            # nothing of it will run: one line, not its steps (issue 42: an up-to-date build
            # printed 81 lines of plans for trees it skipped); --json has the whole plan
            out.append(f"[{t.tree}] up to date: {Path(t.build_dir) / 'manifest.json'} records key "
                       f"{t.key}; skipped unless --force")
            continue
        out.append("")
        out.append(f"[{t.tree}] variant={t.variant or 'stock'} patch={t.patch_sha256 or '-'} "
                   f"source={t.source_sha256[:16]} key={t.key}")
        out.append("  status: to build")
        out.append(f"  tree: {t.source_tree}")
        out.append(f"  env:  {t.env_backend} {t.env_path} (python {t.python})")
        if t.defines:
            out.append("  defines: " + " ".join(f"-D{d}" for d in t.defines))
        out.append(f"  logs: {t.log_dir}")
        out.append("  environment: "
                   + " ".join(f"{k}={shlex.quote(v)}" for k, v in t.env_set.items())
                   + "   unset: " + " ".join(t.env_unset))
        for i, s in enumerate(t.steps, 1):
            cmd = (" ".join(shlex.quote(a) for a in s.argv) if s.argv
                   else f"(internal) {s.description}")
            where = f"  (cwd {s.cwd})" if s.cwd else ""
            out.append(f"  {i:2d}. {s.name}: {cmd}{where}")
        out.append("  outputs: " + ", ".join(t.outputs))
    return "\n".join(out)


def deps_steps(deps_dir: Path | None, root: Path) -> tuple[dict[str, str], list[Step]]:
    """--deps-dir for a full-mode plan: the environment that points vLLM's CMake at the three
    dependencies, and where ``deps_dir`` holds the hash-listed archives, the internal step that
    unpacks them under ``root``/deps once (its cwd names the archives' directory)."""
    if deps_dir is None:
        return {}, []
    from ..sources.deps import find_archives

    unpack_root = root / "deps"
    steps = []
    if find_archives(deps_dir, unpack_root):
        steps.append(Step("unpack-deps", (), f"check {deps_dir}/SHA256SUMS and unpack the "
                          f"archives into {unpack_root} (once)", cwd=str(deps_dir.resolve())))
    return deps_env(deps_dir, unpack_root), steps


def deps_env(deps_dir: Path, unpack_root: Path | None = None) -> dict[str, str]:
    """--deps-dir D: recursive clones D/cutlass (v4.0.0), D/flash-attention (ee4d25bd) and
    D/FlashMLA (a757314c), or the hash-listed archives of shared/deps/ (unpacked under
    ``unpack_root`` by the plan's unpack-deps step); CMake then skips its downloads."""
    from ..sources.deps import deps_env as _deps_env

    return _deps_env(deps_dir, unpack_root or deps_dir.parent / "deps-unpacked")
