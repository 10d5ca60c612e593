"""The full mode (``build --mode full``; a user's H100/H200 box, hours): per tree, in its own
environment, vLLM's pinned build and runtime requirements, then ``pip install
--no-build-isolation`` of the tree (editable unless ``--no-editable``), through ccache or
sccache where one is on PATH so the second tree recompiles only what the patch touches, and a
manifest hashing every ``vllm/*.so``. ``--deps-dir`` gives CMake's FetchContent dependencies
locally (clones, or hash-listed archives unpacked once by the ``unpack-deps`` step)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ... import upstream
from ...errors import BuildError
from ...hashing import sha256_file, walk
from ...machine.envs import Env, make_env
from ...machine.uvconfig import refuse_foreign_cache
from ...runner import run, which
from ...workspace.confine import check_target, what_is
from ...workspace.workdir import Workdir
from ..options import BuildOptions, ModeInputs
from ..plan import UNSET_FOR_BUILD, Step, TreePlan, build_key, deps_steps
from ..sequence import StepHandler, TreeRun, TreeSteps, unpack_deps
from .base import BuildMode, TreeContext

# The commands vLLM's own build runs, in the order of the plan (ccache's only with a cache).
COMMAND_STEPS = ("build-requirements", "cuda-requirements", "ccache-zero", "build")


class FullMode(BuildMode):
    name = "full"
    plan_mode = "full"

    def needs_network(self, opts: BuildOptions) -> bool:
        return opts.deps_dir is None  # CMake's FetchContent clones from GitHub

    def resolve(self, opts: BuildOptions, wd: Workdir, environ: dict[str, str], *,
                env_backend: str, nvcc: Path | None) -> ModeInputs:
        return ModeInputs(editable=opts.editable, deps_dir=opts.deps_dir,
                          ccache=which("ccache") or which("sccache"))

    def tree_plan(self, ctx: TreeContext) -> TreePlan:
        wd, tree, py, env_path = ctx.wd, ctx.tree, ctx.python, ctx.env_path
        editable, ccache = ctx.inputs.editable, ctx.inputs.ccache
        src = wd.tree(tree)
        env_set = dict(ctx.env_set)
        env_set["SETUPTOOLS_SCM_PRETEND_VERSION"] = upstream.VLLM_VERSION
        env_set["VLLM_TARGET_DEVICE"] = "cuda"
        if ccache:
            env_set["CCACHE_DIR"] = str(wd.root / "ccache")
            # ccache reads its settings from $CCACHE_DIR/ccache.conf, in the work directory:
            # one planted there ran its prefix_command and appended its log_file outside
            # (issue 41, the thirty-fourth hostile pass); none is read from the work directory
            env_set["CCACHE_CONFIGPATH"] = os.devnull
            env_set["CCACHE_NOHASHDIR"] = "true"
            env_set["CCACHE_BASEDIR"] = str(wd.root / "trees")
        deps_set, unpack = deps_steps(ctx.inputs.deps_dir, wd.root)
        env_set.update(deps_set)
        key = build_key({"mode": "full", "tree": tree, "source": ctx.src_hash,
                         "patch": ctx.patch, "arch": ctx.arch_list, "editable": editable,
                         "nvcc": ctx.nvcc_version, "env_backend": ctx.env_backend})
        bdir = wd.build_root(tree) / key
        refuse_foreign_cache(os.environ, "pip")  # pip's cache, written by path (uvconfig)
        pip = (py, "-m", "pip")
        install: tuple[str, ...] = (*pip, "install", "--no-build-isolation", "-v")
        install = (*install, *(("-e", ".") if editable else (".",)))
        steps = [
            *unpack,
            Step("create-env", (), f"{ctx.env_backend} environment at {env_path} (Python "
                 f"{sys.version_info.major}.{sys.version_info.minor})"),
            Step("build-requirements", (*pip, "install", "-r", "requirements/build.txt"),
                 "torch==2.8.0 (cu128), cmake>=3.26.1, ninja, setuptools-scm, …", cwd=str(src)),
            Step("cuda-requirements", (*pip, "install", "-r", "requirements/cuda.txt"),
                 "vLLM's runtime requirements, xformers 0.0.32.post1 included (the V0 "
                 "XFORMERS path)", cwd=str(src)),
        ]
        if ccache:
            steps.append(Step("ccache-zero", (ccache, "--zero-stats"), "reset the hit counters"))
        steps.append(Step("build", install, "compile vLLM (hours; resumes through the compiler "
                          "cache)", cwd=str(src)))
        if ccache:
            steps.append(Step("ccache-stats", (ccache, "--show-stats"),
                              "report the cache hit rate"))
        steps.append(Step("manifest", (), f"hash every vllm/*.so into {bdir / 'manifest.json'}"))
        so = ((src / "vllm" / "_C.abi3.so") if editable
              else Path(f"{env_path}/lib/…/site-packages/vllm/_C.abi3.so"))
        return TreePlan(tree, ctx.variant, str(src), ctx.src_hash, ctx.patch, ctx.env_backend,
                        str(env_path), py, str(bdir), str(bdir / "logs"), key, ctx.namespace,
                        (), env_set, UNSET_FOR_BUILD, tuple(steps),
                        (str(so), str(bdir / "manifest.json")))

    def tree_steps(self, run: TreeRun) -> TreeSteps:
        return FullTree(run)


class FullTree(TreeSteps):
    ccache_stats = ""

    def make_env(self) -> Env:
        tp = self.run.tp
        return make_env(tp.env_backend, tp.env_path, log=str(self.run.logs / "01-create-env.log"))

    def handlers(self) -> Mapping[str, StepHandler]:
        return {"unpack-deps": self.unpack_deps, "ccache-stats": self.read_ccache_stats,
                **{name: self.command for name in COMMAND_STEPS}}

    def unpack_deps(self, step: Step, log: Path) -> None:
        unpack_deps(self.run, step)

    def command(self, step: Step, log: Path) -> None:
        if step.name == "ccache-zero":  # the first of the steps ccache runs in
            refuse_linked_cache(Path(self.run.plan.workdir))
        self._run(step, log)

    def read_ccache_stats(self, step: Step, log: Path) -> None:
        self.ccache_stats = self._run(step, log)

    def _run(self, step: Step, log: Path) -> str:
        self.run.say(f"{step.name}: {step.description}")
        return run(list(step.argv), env=self.run.child, cwd=step.cwd, log=log).output

    def manifest(self, core: dict[str, Any]) -> dict[str, Any]:
        run_, tp = self.run, self.run.tp
        so_files = sorted(Path(tp.source_tree, "vllm").rglob("*.so")) or \
            sorted(run_.need_env().site_packages().joinpath("vllm").rglob("*.so"))
        c = [p for p in so_files if p.name.startswith("_C.")]
        if not c:
            raise BuildError(f"the build finished but no vllm/_C*.so was produced for {tp.tree}",
                             f"read the logs in {run_.logs}")
        run_.out.so, run_.out.so_sha256 = str(c[0]), sha256_file(c[0])
        return {**core, "so_path": str(c[0]), "so_sha256": sha256_file(c[0]),
                "inputs": {**core["inputs"], "env_set": tp.env_set},
                "toolchain": run_.plan.toolchain, "ccache_stats": self.ccache_stats,
                "outputs": [{"path": str(p), "sha256": sha256_file(p)} for p in so_files],
                "env": {"backend": tp.env_backend, "path": tp.env_path}}


def refuse_linked_cache(root: Path) -> None:
    """Refuse a compiler cache (``<work dir>/ccache``, CCACHE_DIR) that is, or holds, a link to
    a folder: ccache writes its cache files by path, and a ``ccache/3`` linked to a folder
    outside had them written there (issue 41, the thirty-fourth hostile pass). A link to a file
    is ccache's own business (its locks; it replaces a file, never writes through it). Checked
    before the build, as the build folder's hard links are; a swap while it runs is not."""
    cache = root / "ccache"
    check_target(root, cache, what="keep the compiler cache in", family=BuildError)
    if os.path.lexists(cache) and not cache.is_dir():
        # a file or FIFO there met ccache's own error mid-build (issue 41, left open by the
        # thirty-fifth hostile pass)
        raise BuildError(f"refusing to build with the compiler cache {cache}: it is "
                         f"{what_is(cache)}, not a folder", f"move {cache} away (the build "
                         "makes the folder), then rerun")
    for dirpath, dirnames, _ in walk(cache):  # follows no link, lists a linked folder
        for name in dirnames:
            p = Path(dirpath) / name
            if os.path.islink(p):
                raise BuildError(f"refusing to build with the compiler cache {cache}: {p} is a "
                                 "symlink to a folder, and ccache would write its files "
                                 "through it", f"move the symlink {p} away (its target is "
                                 "left as it is), then rerun")
