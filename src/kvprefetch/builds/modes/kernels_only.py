"""The kernels-only mode (``build --mode kernels-only``, minutes, no GPU): per tree, a venv
that inherits the kit's torch (``--torch-from``) and the kernels library (``library.py``: the
tree's real ``paged_attention_v1.cu``/``v2.cu`` and ``csrc/kvprefetch_ops.cpp``) compiled
against that torch and installed into it as ``kvprefetch_kernels``, for kvprefetch's own
benchmarks. Steps: create-env, probe-torch, write-sources, compile, install, manifest."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ... import upstream
from ...errors import BuildError
from ...machine.envs import Env, make_env
from ...machine.torch_probe import TorchInfo, probe_script, probe_torch
from ...workspace.workdir import Workdir
from ..library import (
    LibraryBuild,
    compile_flags,
    install_library,
    library_manifest,
    write_library_ninja,
)
from ..options import BuildOptions, ModeInputs
from ..plan import UNSET_FOR_BUILD, Step, TreePlan, build_key, kit_python
from ..sequence import StepHandler, TreeRun, TreeSteps, compile_with_progress, ninja_jobs
from .base import BuildMode, TreeContext


class KernelsOnlyMode(BuildMode):
    name = "kernels-only"
    plan_mode = "kernels-only"
    compiles_kernels = True

    def resolve(self, opts: BuildOptions, wd: Workdir, environ: dict[str, str], *,
                env_backend: str, nvcc: Path | None) -> ModeInputs:
        # the torch the envs will inherit, so the plan's compile commands are the exact ones
        tinfo = (probe_torch(opts.torch_from or sys.executable, environ)
                 if nvcc is not None else None)
        return ModeInputs(torch_from=opts.torch_from, torch_info=tinfo)

    def tree_plan(self, ctx: TreeContext) -> TreePlan:
        wd, tree, tinfo = ctx.wd, ctx.tree, ctx.inputs.torch_info
        ops_cpp = upstream.kit_source("kvprefetch_ops.cpp")  # checked: never a FIFO or a link
        key = build_key({
            "mode": "kernels-only", "tree": tree, "source": ctx.src_hash, "patch": ctx.patch,
            "ops_cpp": hashlib.sha256(ops_cpp.read_bytes()).hexdigest(),
            "gencode": ctx.gencode, "selection": ctx.selection.to_dict(),
            "namespace": ctx.namespace,
            "torch": tinfo.torch_version if tinfo is not None else None,
            "nvcc": ctx.nvcc_version, "env_backend": ctx.env_backend,
            "defines": list(ctx.defines),
        })
        bdir = wd.build_root(tree) / key
        so = bdir / f"{ctx.namespace}_C.so"
        nvcc_flags: list[str] = []
        if tinfo is not None and ctx.cuda_home:
            build_info = json.dumps({"tree": tree, "variant": ctx.variant,
                                     "patch_sha256": ctx.patch, "key": key})
            nvcc_flags, _, _ = compile_flags(tinfo, Path(ctx.cuda_home), list(ctx.gencode),
                                             ctx.namespace, wd.tree(tree) / "csrc", build_info,
                                             ctx.defines)
        base_py = ctx.inputs.torch_from or kit_python()
        env_path, backend = ctx.env_path, ctx.env_backend
        steps = (
            Step("create-env", (base_py, "-m", "venv", "--without-pip", str(env_path))
                 if backend == "venv" else (),
                 f"{backend} environment at {env_path}, inheriting torch from {base_py}"),
            Step("probe-torch", (ctx.python, str(probe_script("torch_info.py"))),
                 "read the env's torch include/library paths and ABI", cwd="/"),
            Step("write-sources", (), "narrowed launcher copies + build.ninja in the build dir"
                 if not ctx.selection.full
                 else "build.ninja in the build dir (full instantiation set)"),
            Step("compile", ("ninja", "-C", str(bdir), "-j", str(ctx.jobs)),
                 f"nvcc {' '.join(nvcc_flags)}" if nvcc_flags else "nvcc with torch's flags"),
            Step("install", (), f"copy {so.name} into {env_path}/…/site-packages/"
                 "kvprefetch_kernels/"),
            Step("manifest", (), f"write {bdir / 'manifest.json'}"),
        )
        return TreePlan(tree, ctx.variant, str(wd.tree(tree)), ctx.src_hash, ctx.patch, backend,
                        str(env_path), ctx.python, str(bdir), str(bdir / "logs"), key,
                        ctx.namespace, ctx.defines, ctx.env_set, UNSET_FOR_BUILD, steps,
                        (str(so), str(bdir / "manifest.json")))

    def tree_steps(self, run: TreeRun) -> TreeSteps:
        return KernelsOnlyTree(run)


class KernelsOnlyTree(TreeSteps):
    tinfo: TorchInfo
    lib: LibraryBuild
    installed: Path
    so_sha: str

    def make_env(self) -> Env:
        tp = self.run.tp
        opts: dict[str, Any] = {"log": str(self.run.logs / "01-create-env.log")}
        if tp.env_backend == "venv":
            opts.update(python=self.run.inputs.torch_from or tp.step("create-env").argv[0],
                        system_site_packages=True, with_pip=False)
        return make_env(tp.env_backend, tp.env_path, **opts)

    def handlers(self) -> Mapping[str, StepHandler]:
        return {"probe-torch": self.probe_torch, "write-sources": self.write_sources,
                "compile": self.compile, "install": self.install}

    def probe_torch(self, step: Step, log: Path) -> None:
        self.tinfo = probe_torch(str(self.run.need_env().python), self.run.child, log=log)

    def write_sources(self, step: Step, log: Path) -> None:
        plan = self.run.plan
        cuda_home = plan.toolchain.get("cuda_home")
        nvcc = plan.toolchain.get("nvcc")
        if not cuda_home or not nvcc:
            raise BuildError("no CUDA toolkit was found for the kernels-only build",
                             "install the CUDA toolkit (nvcc) and set CUDA_HOME; "
                             "`kvprefetch doctor` shows what is missing")
        self.lib = write_library_ninja(self.run.tp, plan, self.tinfo, Path(cuda_home),
                                       Path(nvcc))

    def compile(self, step: Step, log: Path) -> None:
        run = self.run
        t = time.monotonic()
        compile_with_progress(
            run.tp.tree, list(step.argv), env=run.child, log=log,
            fix=f"read {log}; fix the cause and rerun: finished objects are kept and the build "
                "resumes",
            started=run.started, build_root=run.build_dir.parent, selection=run.plan.selection,
            heavy=len(self.lib.sources), jobs=ninja_jobs(step.argv), workdir=Path(run.plan.workdir))
        run.out.steps.append({"step": "compile", "seconds": round(time.monotonic() - t, 1)})

    def install(self, step: Step, log: Path) -> None:
        self.installed, self.so_sha = install_library(self.run.tp, self.run.plan, self.lib,
                                                      self.run.need_env().site_packages())

    def manifest(self, core: dict[str, Any]) -> dict[str, Any]:
        run = self.run
        run.out.so, run.out.so_sha256 = str(self.installed), self.so_sha
        return library_manifest(core, run.tp, run.plan, self.lib, installed=self.installed,
                                so_sha=self.so_sha, tinfo=self.tinfo,
                                env_python=str(run.need_env().python), started=run.started)

    def finish(self) -> None:
        run = self.run
        run.say(f"built {self.lib.so.name} in {run.out.seconds:.0f} s -> {self.installed}")
