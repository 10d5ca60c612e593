"""The overlay mode (``kvprefetch build --mode overlay``): a servable vLLM per tree with no
vLLM compile. Each environment gets the released ``vllm==0.10.2`` wheel with its pinned torch
and xformers; the tree's real attention sources are compiled against that environment's torch
(as the kernels-only build does) together with ``csrc/kvprefetch_route.cpp``; and a small
plugin, registered under vLLM's ``vllm.general_plugins`` entry point, makes that library's
launchers the CUDA kernels of vLLM's own ``_C::paged_attention_v1/v2`` in every vLLM process.

- ``toolkit``: which CUDA toolkit compiles it, and why; ``cuda12``: the CUDA 12.4.1 toolkit
  assembled from pinned archives where the machine has none;
- ``install``: the pins, the overlay's options, the installer's commands, the environment's
  CUDA runtime;
- ``plugin`` (and ``plugin_template``): the plugin wheel (written by us, installed by pip/uv);
- ``verify``: the probes that prove vLLM's ops are routed to the tree's library;
- ``driverstub``: the no-device ``libcuda.so.1`` that lets verify-kernel load vLLM's ``_C`` on a
  machine without an NVIDIA driver (host-side dispatch only).

The build mode that uses these parts (its plan and steps) is ``builds/modes/overlay.py``, a
layer above; nothing here imports ``builds``."""
