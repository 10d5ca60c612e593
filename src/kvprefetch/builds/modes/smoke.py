"""The full-mode smoke (``build --mode full --smoke``; any machine, minutes): vLLM's real CMake
configure of a copy of each tree against a torch 2.8.0 environment and a CUDA 12 toolkit view,
then only the attention objects of ``_C`` through the generated build.ninja, their SASS
checked for UBLKPF. Its plan and steps are here; its parts (the inputs, the copy, the view, the
object check) are ``full_smoke.py``. The plan calls itself ``full`` (``--mode full``), its
toolchain carries ``smoke`` and its manifest says ``full-smoke``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ... import __version__
from ...errors import BuildError
from ...hashing import sha256_file
from ...runner import run
from ...workspace.workdir import Workdir, write_json_atomic
from ..full_smoke import (
    ATTENTION_FILES,
    SMOKE_SOURCES,
    SmokeInputs,
    check_objects,
    copy_tree,
    generated_commands,
    make_toolkit_view,
    object_target,
    parse_objects,
    resolve_inputs,
    smoke_dir,
)
from ..options import BuildOptions, ModeInputs
from ..plan import UNSET_FOR_BUILD, Step, TreePlan, build_key, deps_steps
from ..sequence import (
    MANIFEST,
    StepHandler,
    TreeRun,
    TreeSteps,
    compile_with_progress,
    unpack_deps,
)
from .base import BuildMode, TreeContext


class SmokeMode(BuildMode):
    name = "smoke"
    plan_mode = "full"
    says_what_archs_lack = False   # its own SASS check says what each object holds
    smoke_preflight = True

    def needs_network(self, opts: BuildOptions) -> bool:
        return opts.deps_dir is None

    def resolve(self, opts: BuildOptions, wd: Workdir, environ: dict[str, str], *,
                env_backend: str, nvcc: Path | None) -> ModeInputs:
        return ModeInputs(deps_dir=opts.deps_dir, smoke=resolve_inputs(
            wd, environ, torch_from=opts.torch_from, cuda_home_opt=opts.cuda_home,
            objects=parse_objects(opts.smoke_objects)))

    def plan_toolchain(self, toolchain: dict[str, Any], inputs: ModeInputs) -> dict[str, Any]:
        # the smoke compiles with its own toolkit (a view of it), not the machine's nvcc
        smoke = self._inputs(inputs)
        return {**toolchain, "nvcc": f"{smoke.cuda_home}/bin/nvcc",
                "nvcc_version": smoke.nvcc_version, "cuda_home": smoke.cuda_home,
                "smoke": smoke.to_dict()}

    def plan_notes(self, inputs: ModeInputs) -> list[str]:
        return [("smoke: vLLM's real CMake configure, then only the attention objects of _C; "
                 "nothing is linked or installed")]

    @staticmethod
    def _inputs(inputs: ModeInputs) -> SmokeInputs:
        if inputs.smoke is None:
            raise BuildError("the smoke's inputs were not resolved before its plan",
                             "report this: prepare_build resolves them")
        return inputs.smoke

    def tree_plan(self, ctx: TreeContext) -> TreePlan:
        inputs = self._inputs(ctx.inputs)
        wd, tree = ctx.wd, ctx.tree
        src = wd.tree(tree)
        bdir = smoke_dir(wd, tree)
        copy = bdir / "src"
        view = bdir / "cuda"
        cbuild = bdir / "cmake"
        env_set = dict(ctx.env_set)
        env_set["CUDA_HOME"] = str(view)
        env_set["VLLM_TARGET_DEVICE"] = "cuda"
        deps_set, steps = deps_steps(ctx.inputs.deps_dir, wd.root)
        env_set.update(deps_set)
        steps.append(Step("copy-tree", (), f"copy {src} to {copy} (vLLM's configure writes "
                          "generated sources into its source directory)"))
        steps.append(Step("toolkit-view", (), f"symlink view of {inputs.cuda_home} with the "
                          f"torch environment's CUDA libraries and headers at {view}"))
        steps.append(Step("configure", (
            inputs.cmake, "-G", "Ninja", "-S", str(copy), "-B", str(cbuild),
            "-DCMAKE_BUILD_TYPE=Release", "-DVLLM_TARGET_DEVICE=cuda",
            f"-DVLLM_PYTHON_EXECUTABLE={inputs.torch_python}",
            f"-DCMAKE_CUDA_COMPILER={view / 'bin' / 'nvcc'}", f"-DCUDAToolkit_ROOT={view}",
            f"-DCUDA_TOOLKIT_ROOT_DIR={view}"), "vLLM's real CMakeLists.txt (FetchContent from "
            "the three *_SRC_DIR variables)"))
        steps.append(Step("commands", (), "read the generated compile command of each "
                          "attention object (ninja -t commands)"))
        targets = tuple(object_target(SMOKE_SOURCES[o]) for o in inputs.objects)
        if targets:
            steps.append(Step("compile", ("ninja", "-C", str(cbuild), "-j", str(ctx.jobs),
                                          *targets),
                              "only the attention objects of _C, with the commands CMake "
                              "generated"))
            steps.append(Step("sass", (), "cuobjdump -sass each object; count UBLKPF per "
                              "paged_attention kernel"))
        steps.append(Step("manifest", (), f"write {bdir / 'manifest.json'}"))
        key = build_key({"mode": "full-smoke", "tree": tree, "source": ctx.src_hash,
                         "patch": ctx.patch, "arch": ctx.arch_list, "inputs": inputs.to_dict(),
                         "deps": {k: v for k, v in env_set.items() if k.endswith("_SRC_DIR")},
                         "kit": __version__})
        outs = (*(str(cbuild / t) for t in targets), str(bdir / "manifest.json"))
        return TreePlan(tree, ctx.variant, str(src), ctx.src_hash, ctx.patch, "none",
                        inputs.torch_python, inputs.torch_python, str(bdir), str(bdir / "logs"),
                        key, "_C", (), env_set, UNSET_FOR_BUILD, tuple(steps), outs)

    def tree_steps(self, run: TreeRun) -> TreeSteps:
        return SmokeTree(run)


class SmokeTree(TreeSteps):
    """The smoke's steps; each is timed into the manifest with its log, and every command's
    argv recorded."""

    def __init__(self, run: TreeRun) -> None:
        super().__init__(run)
        self.smoke: dict[str, Any] = run.plan.toolchain["smoke"]
        self.timings: list[dict[str, Any]] = []
        self.generated: dict[str, str] = {}
        self.commands: list[list[str]] = []
        self.results: dict[str, dict[str, Any]] = {}

    def make_env(self) -> None:
        return None  # configured against the torch environment it names, from this process's

    def handlers(self) -> Mapping[str, StepHandler]:
        steps: dict[str, StepHandler] = {
            "unpack-deps": lambda s, _log: unpack_deps(self.run, s),
            "copy-tree": self.copy_tree, "toolkit-view": self.toolkit_view,
            "configure": self.configure, "commands": self.read_commands,
            "compile": self.compile, "sass": self.sass}
        return {name: self._timed(fn) for name, fn in steps.items()}

    def _timed(self, fn: StepHandler) -> StepHandler:
        def timed(step: Step, log: Path) -> None:
            t = time.monotonic()
            fn(step, log)
            if step.argv:
                self.commands.append(list(step.argv))
            self._record(step.name, t, log)
        return timed

    def _record(self, name: str, t: float, log: Path | None) -> None:
        self.timings.append({"step": name, "seconds": round(time.monotonic() - t, 1),
                             "log": str(log) if log is not None and log.exists() else None})
        self.run.out.steps.append(self.timings[-1])

    def copy_tree(self, step: Step, log: Path) -> None:
        copy_tree(Path(self.run.plan.workdir), Path(self.run.tp.source_tree),
                  self.run.build_dir / "src", self.run.tp.source_sha256)

    def toolkit_view(self, step: Step, log: Path) -> None:
        make_toolkit_view(Path(self.run.plan.workdir), self.run.build_dir / "cuda",
                          Path(self.smoke["cuda_home"]),
                          Path(self.smoke["site_packages"]))

    def configure(self, step: Step, log: Path) -> None:
        self.run.say("configure: vLLM's CMake project (about a minute)")
        log.unlink(missing_ok=True)
        run(list(step.argv), env=self.run.child, cwd=str(self.run.build_dir), log=log,
            fix=f"read {log}; `kvprefetch doctor --mode full --smoke` names missing tools")

    def read_commands(self, step: Step, log: Path) -> None:
        self.generated = generated_commands(self.run.build_dir / "cmake", self.run.child, log)

    def compile(self, step: Step, log: Path) -> None:
        run_ = self.run
        run_.say(f"compile: {' '.join(step.argv[5:])}")
        compile_with_progress(run_.tp.tree, list(step.argv), env=run_.child, log=log,
                              fix=f"read {log}; rerun to resume", started=run_.started,
                              build_root=run_.build_dir.parent, selection={})

    def sass(self, step: Step, log: Path) -> None:
        tp = self.run.tp
        objs = {Path(o).name: Path(o) for o in tp.outputs[:-1]}
        disasm_env = dict(self.run.child, CUDA_HOME=str(self.run.build_dir / "cuda"))
        self.results = check_objects(objs, tp.variant, disasm_env, log)

    def manifest(self, core: dict[str, Any]) -> dict[str, Any]:
        """The smoke's record: the commands (run and generated), each step's time, each
        object's hash and UBLKPF verdict; refused (manifest.failed.json) when an object fails
        its check or the configure changed the attention sources of the copy."""
        run_, tp, bdir = self.run, self.run.tp, self.run.build_dir
        self._record(MANIFEST, time.monotonic(), None)
        results = self.results
        first = next(iter(results.values()), None)
        manifest: dict[str, Any] = {
            **core, "mode": "full-smoke",
            # the first object stands where other modes name their library (the summary's)
            "so_path": first["path"] if first else None,
            "so_sha256": first["sha256"] if first else None,
            "inputs": {**core["inputs"], "env_set": tp.env_set,
                       "sources": {s: sha256_file(Path(tp.source_tree) / s)
                                   for s in ATTENTION_FILES},
                       "copied_sources": {s: sha256_file(bdir / "src" / s)
                                          for s in ATTENTION_FILES}},
            "toolchain": {**run_.plan.toolchain, "smoke": self.smoke},
            "commands": self.commands, "generated_commands": self.generated,
            "steps": self.timings, "objects": results,
            "outputs": [{"path": r["path"], "sha256": r["sha256"]} for r in results.values()],
            "seconds": round(time.monotonic() - run_.started, 1),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        changed = [f for f in ATTENTION_FILES if sha256_file(Path(tp.source_tree) / f)
                   != sha256_file(bdir / "src" / f)]
        if changed:
            raise BuildError(f"the configure changed {', '.join(changed)} in {bdir / 'src'}",
                             "the objects would not be the tree's; report this")
        bad = {n: r for n, r in results.items() if not r["ok"]}
        if bad:
            write_json_atomic(bdir / "manifest.failed.json", manifest)
            raise BuildError(f"the {tp.tree} tree's attention objects fail the UBLKPF check: "
                             + "; ".join(f"{n}: {r['problems'][:2]}" for n, r in bad.items()),
                             f"read {bdir / 'manifest.failed.json'}")
        if first:
            run_.out.so, run_.out.so_sha256 = first["path"], first["sha256"]
        return manifest

    def recorded(self) -> None:
        (self.run.build_dir / "manifest.failed.json").unlink(missing_ok=True)

    def finish(self) -> None:
        results = self.results
        self.run.say("smoke: " + (", ".join(f"{n} {r['kernels']} kernels, {r['with_ublkpf']} "
                                            "with UBLKPF" for n, r in results.items())
                                  or "configured; no object compiled (--smoke-objects none)"))
