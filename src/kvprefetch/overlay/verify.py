"""verify-kernel's overlay checks: from inside each overlay environment (its own python,
``probe/overlay.py``), that vLLM's own plugin loader runs the kvprefetch plugin, that the CUDA
kernels the dispatcher holds for ``_C::paged_attention_v1/v2`` are this tree's library (path,
sha256, the tree and build key compiled into it), that calls through ``vllm._custom_ops`` and
``torch.ops._C`` reach them, that all of this also holds in a child started with
multiprocessing spawn (as vLLM starts its workers), and that ``KVPREFETCH_OVERLAY=off`` leaves
vLLM's own kernels in place.

Where the machine has no NVIDIA driver the probe runs against the no-device ``libcuda.so.1``
of ``driverstub`` (so vLLM's ``_C`` can load); the report says so. What only a GPU shows --
that the routed launchers' kernels run, under CUDA-graph capture too, and what they compute --
is reported "not checked" here."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..runner import run
from ..workspace.ownership import private_dir

OPS = ("paged_attention_v1", "paged_attention_v2")
SITE_PREFIX = "kvprefetch-overlay:"
CALLS = 4  # v1 and v2, each through vllm._custom_ops and through torch.ops._C


def probe_overlay(python: str, *, off: bool = False, child: bool = True,
                  stub_dir: Path | None = None) -> dict[str, Any]:
    """Run probe/overlay.py with the env's python from an empty temp directory."""
    from ..machine.envs import ISOLATION_STRIP

    script = Path(__file__).resolve().parent.parent / "probe" / "overlay.py"
    environ = {k: v for k, v in os.environ.items() if k not in ISOLATION_STRIP}
    environ["PYTHONNOUSERSITE"] = "1"
    environ.pop("KVPREFETCH_OVERLAY", None)
    if off:
        environ["KVPREFETCH_OVERLAY"] = "off"
    if stub_dir is not None:
        environ["LD_LIBRARY_PATH"] = os.pathsep.join(
            [str(stub_dir)]
            + [p for p in environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p])
    argv = [python, str(script)] + ([] if child else ["--no-child"])
    with private_dir("overlay-probe") as cwd:
        res = run(argv, env=environ, cwd=cwd, echo=False, check=False, timeout=900)
    lines = [ln for ln in res.output.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        return {"errors": [f"probe exited {res.returncode}: {res.output.strip()[-800:]}"]}
    data: dict[str, Any] = json.loads(lines[-1])
    return data


def _real(p: str | None) -> str | None:
    return os.path.realpath(p) if p else None


def routing_problems(tree: str, manifest: dict[str, Any], probe: dict[str, Any]) -> list[str]:
    """Why ``probe`` (one process) does not show vLLM's ops routed to this tree's library;
    empty when it does. Each message names both sides."""
    problems: list[str] = []
    if probe.get("errors") and not probe.get("dispatch"):
        return [f"the probe failed: {'; '.join(probe['errors'])}"]
    if probe.get("entry_point") != "kvprefetch_overlay:register":
        problems.append("no `kvprefetch = kvprefetch_overlay:register` entry point in the "
                        f"vllm.general_plugins group (found: {probe.get('entry_points')})")
    allowed = probe.get("vllm_plugins_env")
    if allowed is not None and "kvprefetch" not in allowed.split(","):
        problems.append(f"VLLM_PLUGINS={allowed!r} excludes the kvprefetch plugin")
    state = probe.get("plugin_state") or {}
    loaded = probe.get("load_general_plugins")
    if loaded != "ok" or probe.get("plugin_import_error") or not state.get("routed"):
        why = "; ".join(filter(None, [
            None if loaded == "ok" else f"load_general_plugins() {loaded}",
            probe.get("plugin_import_error"), *probe.get("plugin_log_errors", []),
            state.get("error"), "" if state else "the plugin never ran"]))
        problems.append(f"the kvprefetch plugin failed to load or route in {tree}'s env: {why}")
        named = (state.get("config") or {}).get("library")
        if named and _real(named) != _real(manifest.get("so_path")):
            problems.append(f"{tree}'s plugin names the library {named}, but this "
                            f"environment's tree is {tree!r}: its library is "
                            f"{manifest.get('so_path')}")
    lib = probe.get("routed_library") or {}
    want_path, want_sha = _real(manifest.get("so_path")), manifest.get("so_sha256")
    built = lib.get("build_info") or {}
    if lib:
        if (_real(lib.get("path")) != want_path or lib.get("sha256") != want_sha
                or built.get("tree") != tree or built.get("key") != manifest.get("key")):
            problems.append(
                f"{tree}'s plugin routes _C::paged_attention_v1/v2 to {lib.get('path')} "
                f"(sha256 {str(lib.get('sha256'))[:16]}…, built from tree "
                f"{built.get('tree')!r}, key {built.get('key')}), but this environment's tree "
                f"is {tree!r}: its library is {want_path} (sha256 {str(want_sha)[:16]}…, key "
                f"{manifest.get('key')})")
        if _real(lib.get("path")) not in probe.get("mapped", []):
            problems.append(f"the routed library {lib.get('path')} is not in /proc/self/maps")
    for op in OPS:
        site = (probe.get("dispatch", {}).get(op) or {}).get("registered_at") or ""
        if lib and site != SITE_PREFIX + str(lib.get("path")):
            problems.append(f"the dispatcher's CUDA kernel for _C::{op} is registered at "
                            f"{site or 'nothing'}, not by the routed library")
    hits = probe.get("hits")
    calls = probe.get("calls") or []
    if state.get("routed") and (hits != [2, 2] or any(c[1] != "returned" for c in calls)):
        problems.append(f"dispatch calls did not all reach the routed kernels (hits v1/v2 "
                        f"{hits}, expected [2, 2]; calls: {calls})")
    return problems


def _vllm_site(probe: dict[str, Any]) -> bool:
    """The dispatcher holds vLLM's own CUDA kernels (not kvprefetch's) for both ops."""
    sites = [(probe.get("dispatch", {}).get(op) or {}).get("registered_at") or "" for op in OPS]
    return all(s and not s.startswith(SITE_PREFIX) for s in sites)


def check_overlay(rep: Any, tree: str, manifest: dict[str, Any], stub: dict[str, Any] | None,
                  python: str, refused: str | None) -> None:
    """Add the overlay rows for ``tree`` to the verify report ``rep``: its environment's
    ``python`` probed, unless the caller ``refused`` it (``verify.manifests.python_refused``:
    no program a record names outside the work directory's environments is run)."""
    stub_dir = Path(stub["dir"]) if stub else None
    on: dict[str, Any] = ({"errors": [refused]} if refused else
                          probe_overlay(python, stub_dir=stub_dir))
    off: dict[str, Any] = ({"errors": [refused]} if refused else
                           probe_overlay(python, off=True, child=False, stub_dir=stub_dir))
    rep.overlay[tree] = {"on": on, "off": off, "driver_stub": stub}
    main = routing_problems(tree, manifest, on)
    lib = on.get("routed_library") or {}
    rep.add("vLLM's paged_attention_v1/v2 route to this tree's library", tree, not main,
            "; ".join(main) if main else
            f"load_general_plugins() ran the kvprefetch plugin; the dispatcher's CUDA kernels "
            f"for _C::paged_attention_v1/v2 are in {lib.get('path')} (sha256 "
            f"{str(lib.get('sha256'))[:16]}… = manifest, compiled from tree "
            f"{(lib.get('build_info') or {}).get('tree')!r}); vllm._custom_ops and torch.ops._C "
            f"calls reached them {CALLS}/{CALLS}")
    child = on.get("child") or {}
    fresh = _vllm_site({"dispatch": child.get("before_plugins", {})})
    problems = routing_problems(tree, manifest, child) if child else ["no child report"]
    if child and not fresh:
        problems.append("the spawned child's dispatcher was not vLLM's before its plugins "
                        "loaded (it should start fresh)")
    rep.add("routing holds in a spawned worker process", tree, not problems,
            "; ".join(problems) if problems else
            f"multiprocessing spawn child (pid {child.get('pid')}): vLLM's kernels until its "
            f"load_general_plugins(), then the same library (sha256 "
            f"{str((child.get('routed_library') or {}).get('sha256'))[:16]}…), calls "
            f"{CALLS}/{CALLS}")
    off_state = off.get("plugin_state") or {}
    raised = [c for c in off.get("calls") or [] if c[1].startswith("raised")]
    off_ok = (off_state.get("mode") == "off" and not off_state.get("routed")
              and _vllm_site(off) and len(raised) == CALLS)
    sites = {op: (off.get("dispatch", {}).get(op) or {}).get("registered_at") for op in OPS}
    rep.add("KVPREFETCH_OVERLAY=off keeps vLLM's own kernels", tree, off_ok,
            f"plugin mode {off_state.get('mode')!r}; CUDA kernels registered at {sites}; "
            f"{len(raised)}/{CALLS} calls reached vLLM's kernel (it raises on CPU tensors)"
            + ("" if off_ok else f"; errors: {off.get('errors')}"))
    if stub:
        rep.add("routed kernels run under vLLM on a GPU", tree, None,
                f"no NVIDIA driver here: vllm/_C.abi3.so was loaded against a generated "
                f"no-device libcuda.so.1 ({', '.join(stub['symbols'])}, each returning "
                "CUDA_ERROR_NO_DEVICE), so only host-side dispatch was checked; launches, "
                "CUDA-graph capture and outputs need a GPU (`kvprefetch bench e2e` there)")
