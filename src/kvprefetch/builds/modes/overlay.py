"""The overlay mode (``build --mode overlay``), one tree at a time: its plan and its steps.
What is the overlay's own (the pins, the installer, the plugin, the CUDA 12 toolkit, the
probes) stays in the ``overlay`` package, below; this module only builds with it.

Steps, per tree, in the tree's own environment (venv, uv or conda):

1. create the environment;
2. install the released ``vllm==0.10.2`` with its pins ``torch==2.8.0`` and
   ``xformers==0.0.32.post1`` from the package index (pip, or ``uv pip``: uv hard-links from
   its cache, so the second environment costs seconds);
3. read the environment's torch (include/library paths, ABI, CUDA version);
4. choose the CUDA toolkit (``toolkit.choose_toolkit``: one of torch's CUDA major on this
   machine, else CUDA 12.4.1 assembled once into the work directory from pinned package
   archives (``cuda12.py``), else refused unless ``--allow-cuda-mismatch``);
5. compile the tree's real ``paged_attention_v1.cu``/``v2.cu`` (narrowable as in kernels-only),
   ``csrc/kvprefetch_ops.cpp`` and ``csrc/kvprefetch_route.cpp`` into one library, linked
   against the environment's own ``libcudart.so.12`` (the one torch loads);
6. install it as ``kvprefetch_kernels`` and the plugin wheel (``plugin.py``) that routes vLLM's
   ops to it;
7. write ``manifest.json`` (mode ``overlay``): library sha256, toolkit and why, installed
   versions of vllm/torch/xformers, the plugin's config."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ... import upstream
from ...errors import BuildError
from ...hashing import sha256_file
from ...machine.envs import Env, make_env
from ...machine.torch_probe import TorchInfo, probe_script, probe_torch
from ...overlay.cuda12 import ensure_cuda12, toolkit_dir
from ...overlay.install import (
    INSTALLING,
    PINS,
    ROUTE_CPP,
    TORCH_VERSION,
    OverlayOptions,
    cudart_imports,
    default_backend,
    env_cudart,
    find_uv,
    install_argv,
    installed_versions,
    link_against,
    plugin_install_flags,
)
from ...overlay.plugin import ENTRY_GROUP, ENTRY_NAME, TEMPLATE, write_plugin_wheel
from ...overlay.toolkit import Toolkit, choose_toolkit
from ...runner import NEUTRAL_CWD, run
from ...workspace import confine
from ...workspace.workdir import Workdir
from ..library import LibraryBuild, install_library, library_manifest, write_library_ninja
from ..options import BuildOptions, ModeInputs
from ..plan import UNSET_FOR_BUILD, Step, TreePlan, build_key
from ..sequence import StepHandler, TreeRun, TreeSteps, compile_with_progress, ninja_jobs
from .base import BuildMode, TreeContext


def refuse_linked_env(run_: TreeRun, what: str) -> None:
    """Refuse to run pip (or uv, or conda's pip) into the tree's environment when the
    environment, its ``bin/`` or its ``site-packages`` inside the work directory is, or has on
    its way, a symlink: those installers write the environment by path, so through such a link
    they would write outside the work directory. Checked just before the installer starts; a
    swap during the install is not caught (the installer's own writes cannot be made relative
    to a descriptor without rewriting it: issue 41, the thirteenth hostile pass)."""
    root = Path(run_.plan.workdir)
    env = run_.need_env()
    for p in (env.path, Path(env.python).parent, env.site_packages()):
        if confine.inside(root, p):
            confine.check_target(root, p, what=what, family=BuildError)


class OverlayMode(BuildMode):
    name = "overlay"
    plan_mode = "overlay"
    compiles_kernels = True

    def default_env_backend(self) -> str:
        return default_backend()

    def resolve(self, opts: BuildOptions, wd: Workdir, environ: dict[str, str], *,
                env_backend: str, nvcc: Path | None) -> ModeInputs:
        return ModeInputs(overlay=OverlayOptions(
            cuda_home=opts.cuda_home, allow_cuda_mismatch=opts.allow_cuda_mismatch,
            uv=find_uv() if env_backend == "uv" else None,
            index_url=environ.get("PIP_INDEX_URL") or None))

    def env_path(self, wd: Workdir, tree: str) -> Path:
        # An overlay env (vLLM installed) lives beside the kernels-only one, not in its place:
        # the two kinds differ in options, and either mode may be built after the other.
        return wd.overlay_env(tree)

    def tree_plan(self, ctx: TreeContext) -> TreePlan:
        opts = ctx.inputs.overlay or OverlayOptions()
        wd, tree, env_path, py = ctx.wd, ctx.tree, ctx.env_path, ctx.python
        backend = ctx.env_backend
        key = build_key({
            "mode": "overlay", "tree": tree, "source": ctx.src_hash, "patch": ctx.patch,
            "ops_cpp": sha256_file(upstream.kit_source("kvprefetch_ops.cpp")),
            "route_cpp": sha256_file(upstream.kit_source(ROUTE_CPP)),
            "plugin": sha256_file(TEMPLATE),
            "gencode": ctx.gencode, "selection": ctx.selection.to_dict(),
            "namespace": ctx.namespace, "pins": PINS, "env_backend": backend,
            "env_path": str(env_path),
            "defines": list(ctx.defines), "cuda_home": opts.cuda_home,
            "allow_cuda_mismatch": opts.allow_cuda_mismatch,
        })
        bdir = wd.build_root(tree) / key
        so = bdir / f"{ctx.namespace}_C.so"
        whl = bdir / "plugin" / "kvprefetch_vllm_overlay-0.1.0-py3-none-any.whl"
        env_set = dict(ctx.env_set)
        env_set.pop("CUDA_HOME", None)  # set per environment once the toolkit is chosen
        if backend == "uv" and opts.index_url:
            env_set["UV_INDEX_URL"] = opts.index_url
        steps = (
            Step("create-env", (), f"{backend} environment at {env_path} (Python "
                 f"{sys.version_info.major}.{sys.version_info.minor}"
                 + (")" if backend == "uv" else ", with pip)")),
            Step("install-vllm", install_argv(backend, py, opts.uv, *PINS),
                 "the released vLLM wheel with its pinned torch (CUDA 12.8) and xformers"),
            Step("probe-torch", (py, str(probe_script("torch_info.py"))),
                 "read the env's torch include/library paths, ABI and CUDA version", cwd="/"),
            Step("choose-toolkit", (), "a CUDA toolkit with torch's CUDA major version ("
                 + (f"--cuda-home {opts.cuda_home}" if opts.cuda_home else
                    "--cuda-home, CUDA_HOME, nvcc on PATH, /usr/local/cuda-*")
                 + ("; --allow-cuda-mismatch" if opts.allow_cuda_mismatch else "") + ")"),
            Step("write-sources", (), "narrowed launcher copies + build.ninja in the build dir"
                 if not ctx.selection.full
                 else "build.ninja in the build dir (full instantiation set)"),
            Step("compile", ("ninja", "-C", str(bdir), "-j", str(ctx.jobs)),
                 f"nvcc with the env's torch flags: the tree's paged_attention_v1/v2.cu, "
                 f"kvprefetch_ops.cpp and {ROUTE_CPP} -> {so.name}"),
            Step("install-kernels", (), f"copy {so.name} into {env_path}/…/site-packages/"
                 "kvprefetch_kernels/"),
            Step("install-plugin", install_argv(backend, py, opts.uv, str(whl),
                                                extra=plugin_install_flags(backend)),
                 "the kvprefetch_overlay plugin (entry point vllm.general_plugins: kvprefetch)"),
            Step("manifest", (), f"write {bdir / 'manifest.json'}"),
        )
        return TreePlan(tree, ctx.variant, str(wd.tree(tree)), ctx.src_hash, ctx.patch, backend,
                        str(env_path), py, str(bdir), str(bdir / "logs"), key, ctx.namespace,
                        ctx.defines, env_set, UNSET_FOR_BUILD, steps,
                        (str(so), str(whl), str(bdir / "manifest.json")))

    def tree_steps(self, run: TreeRun) -> TreeSteps:
        return OverlayTree(run)


class OverlayTree(TreeSteps):
    versions: dict[str, str]
    tinfo: TorchInfo
    tk: Toolkit
    cudart: Path | None
    lib: LibraryBuild
    imports: dict[str, str]
    installed: Path
    so_sha: str
    config: dict[str, Any]
    whl: Path

    def __init__(self, run: TreeRun) -> None:
        super().__init__(run)
        self.opts = run.inputs.overlay or OverlayOptions()
        self.timings: list[dict[str, Any]] = []

    def timed(self, name: str, t: float) -> None:
        self.timings.append({"step": name, "seconds": round(time.monotonic() - t, 1)})

    def make_env(self) -> Env:
        tp = self.run.tp
        log = str(self.run.logs / "01-create-env.log")
        if tp.env_backend == "uv":
            return make_env("uv", tp.env_path, python=sys.executable, uv=self.opts.uv, log=log)
        if tp.env_backend == "conda":
            v = sys.version_info
            return make_env("conda", tp.env_path, python=f"{v.major}.{v.minor}", log=log)
        return make_env("venv", tp.env_path, python=sys.executable, with_pip=True, log=log)

    def handlers(self) -> Mapping[str, StepHandler]:
        return {"install-vllm": self.install_vllm, "probe-torch": self.probe_torch,
                "choose-toolkit": self.choose_toolkit, "write-sources": self.write_sources,
                "compile": self.compile, "install-kernels": self.install_kernels,
                "install-plugin": self.install_plugin}

    def install_vllm(self, step: Step, log: Path) -> None:
        run_ = self.run
        self.timings.append({"step": "create-env", "seconds": run_.env_seconds})
        t = time.monotonic()
        run_.say("installing " + " ".join(PINS))
        with INSTALLING:
            refuse_linked_env(run_, "install vLLM, torch and xformers into")
            run(list(step.argv), env=run_.child, log=log, cwd=NEUTRAL_CWD,
                fix=f"read {log}; check that the package index is reachable (PIP_INDEX_URL / "
                    "UV_INDEX_URL) and rerun")
        self.versions = installed_versions(str(run_.need_env().python), run_.child, log)
        self.timed("install-vllm", t)

    def probe_torch(self, step: Step, log: Path) -> None:
        run_ = self.run
        tinfo = probe_torch(str(run_.need_env().python), run_.child, log=log)
        if tinfo.torch_version.split("+")[0] != TORCH_VERSION or not tinfo.torch_cuda:
            raise BuildError(f"the environment's torch is {tinfo.torch_version} (CUDA "
                             f"{tinfo.torch_cuda}), not the {TORCH_VERSION} CUDA build vLLM "
                             "0.10.2 pins", f"remove {run_.tp.env_path} and rerun the build")
        self.tinfo = tinfo

    def choose_toolkit(self, step: Step, log: Path) -> None:
        run_ = self.run
        workdir = Path(run_.plan.workdir)
        self.tk = tk = choose_toolkit(
            str(self.tinfo.torch_cuda), run_.child, explicit=self.opts.cuda_home,
            allow_mismatch=self.opts.allow_cuda_mismatch, assembled=toolkit_dir(workdir),
            assemble=lambda: ensure_cuda12(workdir, say=run_.say))
        run_.say(f"toolkit: {tk.why}")
        # torch's own extension builds put $CUDA_HOME/include first: read the paths again
        # with it set, so the compiler and the CUDA headers come from the same toolkit.
        run_.child["CUDA_HOME"] = tk.cuda_home
        self.tinfo = probe_torch(str(run_.need_env().python), run_.child,
                                 log=log.with_name(log.name.replace(step.name, "probe-torch")))

    def write_sources(self, step: Step, log: Path) -> None:
        run_ = self.run
        cuda_home = Path(self.tk.cuda_home)
        self.cudart = cudart = env_cudart(run_.need_env().site_packages())
        self.lib = write_library_ninja(
            run_.tp, run_.plan, self.tinfo, cuda_home, Path(self.tk.nvcc),
            link=lambda flags: link_against(flags, cudart, cuda_home),
            extra_cpp_sources=(upstream.kit_source(ROUTE_CPP),))

    def compile(self, step: Step, log: Path) -> None:
        run_, so = self.run, self.lib.so
        t = time.monotonic()
        compile_with_progress(
            run_.tp.tree, list(step.argv), env=run_.child, log=log,
            fix=f"read {log}; fix the cause and rerun: finished objects are kept and the build "
                "resumes",
            started=run_.started, build_root=run_.build_dir.parent,
            selection=run_.plan.selection, heavy=len(self.lib.sources),
            jobs=ninja_jobs(step.argv), workdir=Path(run_.plan.workdir))
        self.timed("compile", t)
        self.imports = cudart_imports(run(["nm", "-D", "--undefined-only", str(so)],
                                          echo=False, log=log).output)
        foreign = sorted(f"{s}@{v}" for s, v in self.imports.items()
                         if self.cudart is not None and v != "libcudart.so.12")
        if foreign:
            raise BuildError(f"{so} imports CUDA runtime symbols from another libcudart than "
                             f"the environment's libcudart.so.12: {', '.join(foreign[:5])}",
                             "report this; build with a CUDA 12.x toolkit (--cuda-home)")

    def install_kernels(self, step: Step, log: Path) -> None:
        run_, tp = self.run, self.run.tp
        self.installed, self.so_sha = install_library(
            tp, run_.plan, self.lib, run_.need_env().site_packages(), mode="overlay")
        self.config = {"tree": tp.tree, "variant": tp.variant or "stock",
                       "namespace": tp.namespace, "library": str(self.installed),
                       "so_sha256": sha256_file(self.installed), "key": tp.key}
        self.whl = write_plugin_wheel(run_.build_dir / "plugin", self.config,
                                      root=Path(run_.plan.workdir))

    def install_plugin(self, step: Step, log: Path) -> None:
        refuse_linked_env(self.run, "install the plugin into")
        run(list(step.argv), env=self.run.child, log=log, cwd=NEUTRAL_CWD)

    def manifest(self, core: dict[str, Any]) -> dict[str, Any]:
        """The library's manifest with the overlay's additions: the toolkit and the runtime
        it links, the installed pins, the plugin, the step timings."""
        run_ = self.run
        manifest = library_manifest(
            core, run_.tp, run_.plan, self.lib, installed=self.installed, so_sha=self.so_sha,
            tinfo=self.tinfo, env_python=str(run_.need_env().python), started=run_.started,
            toolchain={**self.tk.to_dict(), "cudart": str(self.cudart) if self.cudart else None,
                       "cudart_imports": len(self.imports)})
        manifest["installed"] = self.versions
        manifest["overlay"] = {
            "plugin_wheel": str(self.whl), "plugin_wheel_sha256": sha256_file(self.whl),
            "entry_point": f"{ENTRY_GROUP}: {ENTRY_NAME} = kvprefetch_overlay:register",
            "config": self.config, "off_switch": "KVPREFETCH_OVERLAY=off"}
        manifest["steps"] = self.timings
        run_.out.so, run_.out.so_sha256 = str(self.installed), self.so_sha
        run_.out.steps = self.timings
        return manifest

    def finish(self) -> None:
        run_ = self.run
        run_.say(f"built {self.lib.so.name} in {run_.out.seconds:.0f} s -> {self.installed}; "
                 "plugin installed")
