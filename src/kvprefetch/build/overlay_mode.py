"""The overlay build mode, one tree at a time: its plan (``overlay_tree_plan``, part of the frozen ``BuildPlan``)
and its execution (``build_overlay_tree``).

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
from pathlib import Path
from typing import Any

from ..errors import BuildError
from ..hashing import sha256_file
from ..overlay.install import (
    INSTALLING,
    PINS,
    ROUTE_CPP,
    TORCH_VERSION,
    OverlayOptions,
    cudart_imports,
    env_cudart,
    install_argv,
    installed_versions,
    link_against,
    plugin_install_flags,
)
from ..runner import run
from .builder import TreeOutcome
from .plan import UNSET_FOR_BUILD, BuildPlan, Step, TreePlan, build_key


def overlay_tree_plan(wd: Any, tree: str, variant: str | None, patch: str | None,
                      state: dict[str, Any], src_hash: str, env_backend: str, env_path: Path,
                      py: str, namespace: str, env_set: dict[str, str],
                      gencode: tuple[str, ...], selection: Any, jobs: int,
                      overlay: OverlayOptions | None, defines: tuple[str, ...] = ()) -> TreePlan:
    from ..overlay.plugin import TEMPLATE
    from ..upstream import kit_root

    opts = overlay or OverlayOptions()
    csrc = kit_root() / "csrc"
    key = build_key({
        "mode": "overlay", "tree": tree, "source": src_hash, "patch": patch,
        "ops_cpp": sha256_file(csrc / "kvprefetch_ops.cpp"), "route_cpp": sha256_file(csrc / ROUTE_CPP),
        "plugin": sha256_file(TEMPLATE), "gencode": gencode, "selection": selection.to_dict(),
        "namespace": namespace, "pins": PINS, "env_backend": env_backend,
        "env_path": str(env_path),
        "defines": list(defines), "cuda_home": opts.cuda_home,
        "allow_cuda_mismatch": opts.allow_cuda_mismatch,
    })
    bdir = wd.build_root(tree) / key
    so = bdir / f"{namespace}_C.so"
    whl = bdir / "plugin" / "kvprefetch_vllm_overlay-0.1.0-py3-none-any.whl"
    env_set = dict(env_set)
    env_set.pop("CUDA_HOME", None)  # set per environment once the toolkit is chosen
    if env_backend == "uv" and opts.index_url:
        env_set["UV_INDEX_URL"] = opts.index_url
    steps = (
        Step("create-env", (), f"{env_backend} environment at {env_path} (Python "
             f"{sys.version_info.major}.{sys.version_info.minor}"
             + (")" if env_backend == "uv" else ", with pip)")),
        Step("install-vllm", install_argv(env_backend, py, opts.uv, *PINS),
             "the released vLLM wheel with its pinned torch (CUDA 12.8) and xformers"),
        Step("probe-torch", (py, str(Path(__file__).resolve().parent.parent / "probe"
                                     / "torch_info.py")),
             "read the env's torch include/library paths, ABI and CUDA version", cwd="/"),
        Step("choose-toolkit", (), "a CUDA toolkit with torch's CUDA major version ("
             + (f"--cuda-home {opts.cuda_home}" if opts.cuda_home else
                "--cuda-home, CUDA_HOME, nvcc on PATH, /usr/local/cuda-*")
             + ("; --allow-cuda-mismatch" if opts.allow_cuda_mismatch else "") + ")"),
        Step("write-sources", (), "narrowed launcher copies + build.ninja in the build dir"
             if not selection.full else "build.ninja in the build dir (full instantiation set)"),
        Step("compile", ("ninja", "-C", str(bdir), "-j", str(jobs)),
             f"nvcc with the env's torch flags: the tree's paged_attention_v1/v2.cu, "
             f"kvprefetch_ops.cpp and {ROUTE_CPP} -> {so.name}"),
        Step("install-kernels", (), f"copy {so.name} into {env_path}/…/site-packages/"
             "kvprefetch_kernels/"),
        Step("install-plugin", install_argv(env_backend, py, opts.uv, str(whl),
                                            extra=plugin_install_flags(env_backend)),
             "the kvprefetch_overlay plugin (entry point vllm.general_plugins: kvprefetch)"),
        Step("manifest", (), f"write {bdir / 'manifest.json'}"),
    )
    return TreePlan(tree, variant, str(wd.tree(tree)), src_hash, patch, env_backend,
                    str(env_path), py, str(bdir), str(bdir / "logs"), key, namespace, defines,
                    env_set, UNSET_FOR_BUILD, steps, (str(so), str(whl),
                                                      str(bdir / "manifest.json")))


def _make_env(tp: TreePlan, opts: OverlayOptions) -> Any:
    from ..machine.envs import make_env

    log = str(Path(tp.log_dir) / "01-create-env.log")
    if tp.env_backend == "uv":
        return make_env("uv", tp.env_path, python=sys.executable, uv=opts.uv, log=log)
    if tp.env_backend == "conda":
        v = sys.version_info
        return make_env("conda", tp.env_path, python=f"{v.major}.{v.minor}", log=log)
    return make_env("venv", tp.env_path, python=sys.executable, with_pip=True, log=log)


def build_overlay_tree(tp: TreePlan, plan: BuildPlan, force: bool,
                       overlay: OverlayOptions | None) -> TreeOutcome:
    from ..overlay.cuda12 import ensure_cuda12, toolkit_dir
    from ..overlay.plugin import ENTRY_GROUP, ENTRY_NAME, write_plugin_wheel
    from ..overlay.toolkit import choose_toolkit
    from ..upstream import kit_root
    from ..workspace.workdir import write_json_atomic
    from .builder import (
        compile_with_progress,
        ninja_jobs,
        prepare_tree,
        say,
        tree_locks,
    )
    from .kernels_only import probe_torch
    from .library import install_library, library_manifest, write_library_ninja

    opts = overlay or OverlayOptions()
    out = TreeOutcome(tp.tree, log_dir=tp.log_dir)
    bdir, logs = Path(tp.build_dir), Path(tp.log_dir)
    t0 = time.monotonic()
    timings: list[dict[str, Any]] = []

    def timed(name: str, t: float) -> None:
        timings.append({"step": name, "seconds": round(time.monotonic() - t, 1)})

    with tree_locks(tp, plan):  # the tree's lock too: no apply changes what is compiled
        t = time.monotonic()
        ready = prepare_tree(tp, plan, force, out, lambda: _make_env(tp, opts))
        if ready is None:
            return out
        env_obj, child = ready
        timed("create-env", t)
        t = time.monotonic()
        say(tp.tree, "installing " + " ".join(PINS))
        with INSTALLING:
            run(list(tp.steps[1].argv), env=child, log=logs / "02-install-vllm.log",
                fix=f"read {logs / '02-install-vllm.log'}; check that the package index is "
                    "reachable (PIP_INDEX_URL / UV_INDEX_URL) and rerun")
        versions = installed_versions(str(env_obj.python), child, logs / "02-install-vllm.log")
        timed("install-vllm", t)
        tinfo = probe_torch(str(env_obj.python), child, log=logs / "03-probe-torch.log")
        if tinfo.torch_version.split("+")[0] != TORCH_VERSION or not tinfo.torch_cuda:
            raise BuildError(f"the environment's torch is {tinfo.torch_version} (CUDA "
                             f"{tinfo.torch_cuda}), not the {TORCH_VERSION} CUDA build vLLM "
                             "0.10.2 pins", f"remove {tp.env_path} and rerun the build")
        tk = choose_toolkit(tinfo.torch_cuda, child, explicit=opts.cuda_home,
                            allow_mismatch=opts.allow_cuda_mismatch,
                            assembled=toolkit_dir(Path(plan.workdir)),
                            assemble=lambda: ensure_cuda12(Path(plan.workdir),
                                                           say=lambda m: say(tp.tree, m)))
        say(tp.tree, f"toolkit: {tk.why}")
        # torch's own extension builds put $CUDA_HOME/include first: read the paths again
        # with it set, so the compiler and the CUDA headers come from the same toolkit.
        child["CUDA_HOME"] = tk.cuda_home
        tinfo = probe_torch(str(env_obj.python), child, log=logs / "04-probe-torch.log")
        cuda_home = Path(tk.cuda_home)
        site = env_obj.site_packages()
        cudart = env_cudart(site)
        lib = write_library_ninja(
            tp, plan, tinfo, cuda_home, Path(tk.nvcc),
            link=lambda flags: link_against(flags, cudart, cuda_home),
            extra_cpp_sources=(kit_root() / "csrc" / ROUTE_CPP,))
        so = lib.so
        t = time.monotonic()
        compile_with_progress(
            tp.tree, list(tp.steps[5].argv), env=child, log=logs / "06-compile.log",
            fix=f"read {logs / '06-compile.log'}; fix the cause and rerun: finished objects are "
                "kept and the build resumes",
            started=t0, build_root=bdir.parent, selection=plan.selection,
            heavy=len(lib.sources), jobs=ninja_jobs(tp.steps[5].argv))
        timed("compile", t)
        imports = cudart_imports(run(["nm", "-D", "--undefined-only", str(so)], echo=False,
                                     log=logs / "06-compile.log").output)
        foreign = sorted(f"{s}@{v}" for s, v in imports.items()
                         if cudart is not None and v != "libcudart.so.12")
        if foreign:
            raise BuildError(f"{so} imports CUDA runtime symbols from another libcudart than "
                             f"the environment's libcudart.so.12: {', '.join(foreign[:5])}",
                             "report this; build with a CUDA 12.x toolkit (--cuda-home)")
        installed, so_sha = install_library(tp, plan, lib, site, mode="overlay")
        config = {"tree": tp.tree, "variant": tp.variant or "stock", "namespace": tp.namespace,
                  "library": str(installed), "so_sha256": sha256_file(installed),
                  "key": tp.key}
        whl = write_plugin_wheel(bdir / "plugin", config)
        run(list(tp.steps[7].argv), env=child, log=logs / "08-install-plugin.log")
        manifest = library_manifest(
            tp, plan, lib, mode="overlay", installed=installed, so_sha=so_sha, tinfo=tinfo,
            env_python=str(env_obj.python), started=t0,
            toolchain={**tk.to_dict(), "cudart": str(cudart) if cudart else None,
                       "cudart_imports": len(imports)})
        manifest["installed"] = versions
        manifest["overlay"] = {
            "plugin_wheel": str(whl), "plugin_wheel_sha256": sha256_file(whl),
            "entry_point": f"{ENTRY_GROUP}: {ENTRY_NAME} = kvprefetch_overlay:register",
            "config": config, "off_switch": "KVPREFETCH_OVERLAY=off"}
        manifest["steps"] = timings
        write_json_atomic(bdir / "manifest.json", manifest)
    out.status, out.so, out.so_sha256 = "built", str(installed), so_sha
    out.steps = timings
    out.seconds = round(time.monotonic() - t0, 1)
    say(tp.tree, f"built {so.name} in {out.seconds:.0f} s -> {installed}; plugin installed")
    return out
