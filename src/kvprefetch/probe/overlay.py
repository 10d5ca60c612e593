"""Overlay probe: run with an overlay environment's OWN python, from a neutral working
directory. Prints one JSON line saying, for this process and for a child started the way vLLM
starts its workers (multiprocessing spawn, which then calls load_general_plugins() itself):

- the ``vllm.general_plugins`` entry points, and whether ``kvprefetch`` is among them;
- what ``vllm.plugins.load_general_plugins()`` did (errors vLLM only logs are captured);
- the plugin's own state (routed or not, ``KVPREFETCH_OVERLAY``, its config);
- the CUDA kernel the dispatcher holds for ``_C::paged_attention_v1/v2`` (who registered it);
- the routed library, from ``dladdr`` of the function the dispatcher calls, with its sha256,
  whether it is mapped (/proc/self/maps) and the build info compiled into it;
- dispatch calls: ``vllm._custom_ops.paged_attention_v1/v2`` and ``torch.ops._C.*`` called
  with CPU tensors under a CUDA dispatch key, with the library's probe switch on, so the routed
  function counts each call and returns before touching a device (no GPU is needed; on a GPU
  machine the same calls would launch the kernels). Without routing the calls reach vLLM's
  own kernel, which raises on CPU tensors.

Stdlib, torch and vLLM only; never imports kvprefetch."""

import hashlib
import importlib.metadata
import json
import logging
import os
import sys

OPS = ("paged_attention_v1", "paged_attention_v2")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def mapped_files():
    out = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    p = os.path.realpath(parts[5].strip())
                    if p not in out:
                        out.append(p)
    except OSError:
        pass
    return out


def cuda_kernel_site(torch, op):
    """Who registered the CUDA kernel of _C::<op>, from the dispatcher's own dump."""
    try:
        dump = torch._C._dispatch_dump(f"_C::{op}")
    except Exception as exc:  # noqa: BLE001 -- report, never crash
        return {"error": f"{type(exc).__name__}: {exc}"}
    for line in dump.splitlines():
        if line.startswith("CUDA:"):
            site = line[len("CUDA: registered at "):].split(" :: ")[0]
            file, _, lineno = site.rpartition(":")
            return {"registered_at": file if lineno.isdigit() else site,
                    "line": int(lineno) if lineno.isdigit() else None}
    return {"registered_at": None}


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.records = []

    def emit(self, record):
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            text += f": {type(exc).__name__}: {exc}"
        self.records.append(text)


def call_ops(torch, ops_module):
    """Call v1/v2 through vllm._custom_ops and torch.ops._C with CPU tensors under the CUDA
    dispatch key; returns a list of (path, outcome)."""
    z = torch.zeros
    i32 = torch.int32
    q = z(1, 1, 128)
    k = z(1, 1, 16, 16, 8)
    v = z(1, 1, 128, 16)
    bt = z(1, 1, dtype=i32)
    sl = torch.ones(1, dtype=i32)
    s1 = z(1)
    v1 = (z(1, 1, 128), q, k, v, 1, 1.0, bt, sl, 16, 1, None, "auto", s1, s1)
    v2 = (z(1, 1, 128), z(1, 1, 1), z(1, 1, 1), z(1, 1, 1, 128), q, k, v, 1, 1.0, bt, sl, 16, 1,
          None, "auto", s1, s1)
    tail = (0, 0, 0, 64, 0)
    calls = [("vllm._custom_ops.paged_attention_v1", lambda: ops_module.paged_attention_v1(*v1)),
             ("vllm._custom_ops.paged_attention_v2", lambda: ops_module.paged_attention_v2(*v2)),
             ("torch.ops._C.paged_attention_v1",
              lambda: torch.ops._C.paged_attention_v1(*v1, *tail)),
             ("torch.ops._C.paged_attention_v2",
              lambda: torch.ops._C.paged_attention_v2(*v2, *tail))]
    out = []
    for name, fn in calls:
        try:
            with torch._C._IncludeDispatchKeyGuard(torch._C.DispatchKey.CUDA):
                fn()
            out.append([name, "returned"])
        except Exception as exc:  # noqa: BLE001 -- vLLM's kernel raises on CPU tensors
            out.append([name, f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"])
    return out


def inspect(label):
    rep = {"label": label, "pid": os.getpid(), "executable": sys.executable,
           "prefix": sys.prefix, "overlay_env": os.environ.get("KVPREFETCH_OVERLAY"),
           "vllm_plugins_env": os.environ.get("VLLM_PLUGINS"), "errors": []}
    try:
        eps = importlib.metadata.entry_points(group="vllm.general_plugins")
        rep["entry_points"] = [f"{ep.name} = {ep.value}" for ep in eps]
        mine = [ep for ep in eps if ep.name == "kvprefetch"]
        rep["entry_point"] = mine[0].value if mine else None
        if mine:
            try:
                dist = mine[0].dist
                rep["entry_point_dist"] = (f"{dist.metadata['Name']} {dist.version}"
                                           if dist else None)
            except Exception as exc:  # noqa: BLE001
                rep["errors"].append(f"entry point distribution: {exc}")
    except Exception as exc:  # noqa: BLE001
        rep["errors"].append(f"entry points: {type(exc).__name__}: {exc}")
    import torch

    # vLLM's engine and workers import vllm._custom_ops (and with it vllm._C) before they
    # load plugins; so does the probe, then reads the dispatcher as vLLM left it.
    try:
        import vllm._C
        import vllm._custom_ops
    except Exception as exc:  # noqa: BLE001
        rep["errors"].append(f"import vllm._C: {type(exc).__name__}: {exc}")
    rep["before_plugins"] = {op: cuda_kernel_site(torch, op) for op in OPS}
    collect = _Collect()
    logging.getLogger("vllm.plugins").addHandler(collect)
    try:
        import vllm.plugins

        vllm.plugins.load_general_plugins()
        rep["load_general_plugins"] = "ok"
    except Exception as exc:  # noqa: BLE001
        rep["load_general_plugins"] = f"raised {type(exc).__name__}: {exc}"
    rep["plugin_log_errors"] = collect.records
    try:
        import kvprefetch_overlay

        rep["plugin_file"] = os.path.realpath(kvprefetch_overlay.__file__)
        rep["plugin_state"] = json.loads(json.dumps(kvprefetch_overlay.STATE, default=str))
    except Exception as exc:  # noqa: BLE001
        rep["plugin_import_error"] = f"{type(exc).__name__}: {exc}"
        rep["plugin_state"] = None
    rep["vllm_c_loaded"] = "vllm._C" in sys.modules
    rep["dispatch"] = {op: cuda_kernel_site(torch, op) for op in OPS}
    state = rep.get("plugin_state") or {}
    ns_name = ((state.get("route") or {}).get("namespace")
               or (state.get("config") or {}).get("namespace"))
    ns = None
    if ns_name and state.get("routed"):
        try:
            ns = getattr(torch.ops, ns_name)
            route = json.loads(ns.route_state())
            rep["route"] = route
            lib = route.get("routed_v1_library")
            if lib and os.path.isfile(lib):
                rep["routed_library"] = {"path": lib, "sha256": sha256(lib)}
                try:
                    rep["routed_library"]["build_info"] = json.loads(ns.build_info())
                except Exception as exc:  # noqa: BLE001
                    rep["errors"].append(f"build_info: {exc}")
        except Exception as exc:  # noqa: BLE001
            rep["errors"].append(f"route_state: {type(exc).__name__}: {exc}")
            ns = None
    try:
        import vllm._custom_ops as ops_module

        if ns is not None:
            ns.route_probe(True)
        try:
            rep["calls"] = call_ops(torch, ops_module)
        finally:
            if ns is not None:
                ns.route_probe(False)
        rep["hits"] = list(ns.route_hits()) if ns is not None else None
    except Exception as exc:  # noqa: BLE001
        rep["errors"].append(f"dispatch calls: {type(exc).__name__}: {exc}")
    maps = mapped_files()
    rep["mapped"] = [p for p in maps if "/vllm/" in p or "kvprefetch" in p
                     or os.path.basename(p).startswith("libcuda.")]
    return rep


def _child(queue):
    try:
        queue.put(inspect("spawned child"))
    except BaseException as exc:  # noqa: BLE001
        queue.put({"label": "spawned child", "errors": [f"{type(exc).__name__}: {exc}"]})


def main():
    report = inspect("main process")
    if "--no-child" not in sys.argv:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=_child, args=(q,))
        p.start()
        try:
            report["child"] = q.get(timeout=600)
        except Exception as exc:  # noqa: BLE001
            report["child"] = {"label": "spawned child",
                               "errors": [f"no report: {type(exc).__name__}: {exc}"]}
        p.join(timeout=60)
        report["child"]["exitcode"] = p.exitcode
    print(json.dumps(report))


if __name__ == "__main__":
    main()
