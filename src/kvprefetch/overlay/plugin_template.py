"""kvprefetch overlay plugin for vLLM 0.10.2 (installed by `kvprefetch build --mode overlay`;
generated, do not edit).

vLLM runs ``register()`` through its ``vllm.general_plugins`` entry point (name ``kvprefetch``)
in the engine and in every worker process, before any model is built or CUDA graph captured.
It loads this environment's compiled tree kernels (``overlay.json`` names the library) and
makes them the CUDA kernels of vLLM's own ops ``_C::paged_attention_v1`` and
``_C::paged_attention_v2``, so every decode call of the V0 path reaches them.
``KVPREFETCH_OVERLAY=off`` leaves vLLM's own kernels in place (an A/B inside one environment).

A failure raises: vLLM then stops instead of silently serving its stock kernels. This module
uses only the standard library, torch and vLLM; it never imports kvprefetch."""

import json
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG_PATH = os.path.join(_HERE, "overlay.json")
OFF_VALUES = ("off", "0", "false", "no")

# What happened in this process; read by kvprefetch verify-kernel's probe.
STATE = {"calls": 0, "mode": None, "routed": False, "error": None, "config": None,
         "route": None}


def enabled():
    return os.environ.get("KVPREFETCH_OVERLAY", "on").strip().lower() not in OFF_VALUES


def register():
    """The entry point: idempotent (vLLM may call it more than once per process)."""
    STATE["calls"] += 1
    if not enabled():
        STATE["mode"] = "off"
        return
    STATE["mode"] = "on"
    if STATE["routed"]:
        return
    try:
        with open(CONFIG_PATH) as f:
            cfg = json.load(f)
        STATE["config"] = cfg
        import torch

        # vLLM's own registration must exist before ours: the last kernel registered for a
        # dispatch key wins, and vllm._custom_ops swallows a failed `import vllm._C`.
        import vllm._C  # noqa: F401

        library = cfg["library"]
        if not os.path.isfile(library):
            raise FileNotFoundError(f"the kernel library {library} does not exist")
        torch.ops.load_library(library)
        # The op namespace is the library's own (its build.json, written beside it by the
        # build), so the routing always goes to the library the config names.
        namespace = cfg["namespace"]
        record = os.path.join(os.path.dirname(library), "build.json")
        if os.path.isfile(record):
            with open(record) as f:
                namespace = json.load(f).get("namespace", namespace)
        ns = getattr(torch.ops, namespace)
        STATE["route"] = json.loads(ns.route_into_vllm())
        STATE["routed"] = True
    except Exception as exc:
        STATE["error"] = f"{type(exc).__name__}: {exc}"
        raise RuntimeError(
            f"kvprefetch overlay ({CONFIG_PATH}): could not route vLLM's paged_attention_v1/v2 "
            f"to the tree's kernels: {STATE['error']}\nTo fix: rerun `kvprefetch build --mode "
            "overlay` for this environment, or set KVPREFETCH_OVERLAY=off to run vLLM's own "
            "kernels") from exc
