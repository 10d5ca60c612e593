"""The GPU side of ``bench kernel``: device facts, the copy-bandwidth yardstick, and the two
backends ``bench_shape`` runs on: CUDA graphs timed with CUDA events (every reported number), and
an eager, host-clock stand-in that lets the unit tests run the same control flow on CPU.

torch is imported inside functions only.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from .schema import Device

DEFAULT_L2_BYTES_IF_UNKNOWN = 50 * 1024 * 1024  # H100/H200 L2, only if torch cannot say
DEFAULT_SMEM_OPTIN_IF_UNKNOWN = 227 * 1024     # sm_90 opt-in shared memory per block, likewise


def require_torch(command: str) -> None:
    """Refuse ``bench <command>`` up front, naming torch, when this python cannot import it
    (not installed, or installed but broken: a missing CUDA library is an ImportError or an
    OSError), instead of a traceback from the first ``import torch`` deep in a run."""
    import sys

    from ..errors import BenchError

    try:
        import torch  # noqa: F401
    except Exception as exc:  # ImportError, OSError; a broken or planted torch may raise
        # anything while it imports (issue 41, ninth hostile pass)
        raise BenchError(
            f"`kvprefetch bench {command}` needs torch (a CUDA build), and this python "
            f"({sys.executable}) cannot import it: {exc}",
            "run scripts/setup-venv.sh (it installs the kit's CUDA build of torch into "
            ".venv) and run the kit from that venv, or `pip install torch` into this "
            "environment; `--dry-run` plans without torch") from exc


def require_gpu(command: str) -> None:
    """A BenchError unless torch sees a CUDA GPU: every GPU bench asks here first (issue 41,
    third pass: ``bench decode`` without one was torch's RuntimeError traceback). Before any
    kernel loads, the caches CUDA writes by path are checked (``machine/gpu_folders``)."""
    import torch

    from ..errors import BenchError
    from ..machine.gpu_folders import refuse_foreign_gpu_folders

    if not torch.cuda.is_available():
        raise BenchError(f"bench {command} needs a CUDA GPU and none is visible",
                         "run it on the GPU machine (scripts/device/bench.sh); `--dry-run` "
                         "plans without one")
    refuse_foreign_gpu_folders()


def device_facts(device: Any = None, command: str = "kernel") -> Device:
    import torch

    require_gpu(command)
    dev = torch.device(device or "cuda")
    props = torch.cuda.get_device_properties(dev)
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    smem = int(getattr(props, "shared_memory_per_block_optin", 0) or 0)
    return {"name": props.name, "sm_count": props.multi_processor_count,
            "capability": f"{props.major}.{props.minor}",
            "l2_bytes": l2 or DEFAULT_L2_BYTES_IF_UNKNOWN, "l2_reported": bool(l2),
            "smem_optin_bytes": smem or DEFAULT_SMEM_OPTIN_IF_UNKNOWN, "smem_reported": bool(smem),
            "total_memory": props.total_memory, "torch": torch.__version__,
            "cuda": torch.version.cuda}


def measure_copy_bandwidth(nbytes: int = 1 << 31, iters: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    import torch

    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e-3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(times)


class GraphReplay:
    """A captured CUDA graph plus the step it was captured from. The step's closure holds every
    tensor the graph's kernels address (outputs, v2 workspace, inputs); the graph itself holds
    only raw pointers, so without this reference those tensors could be freed (and unmapped by
    the next capture's ``empty_cache``) while the graph still writes to them."""

    def __init__(self, graph: Any, step: Callable[[], None]) -> None:
        self.graph = graph
        self.step = step

    def __call__(self) -> None:
        self.graph.replay()


class CudaBackend:
    """CUDA graphs and CUDA events: what every reported number comes from."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.device = "cuda"

    def free_bytes(self) -> int:
        return int(self.torch.cuda.mem_get_info()[0])

    def smem_optin_bytes(self) -> int:
        return int(device_facts(self.device)["smem_optin_bytes"])

    def capture(self, step: Callable[[], None]) -> Callable[[], None]:
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()  # eager warm-up: surfaces launch errors before capture
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):  # note: empties the allocator's cache first
            step()
        replay = GraphReplay(g, step)
        replay()
        return replay

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def time_s(self, fn: Callable[[], None]) -> float:
        start = self.torch.cuda.Event(enable_timing=True)
        end = self.torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) * 1e-3


class HostBackend:
    """Eager calls and the host clock, for running the same control flow on CPU in the unit
    tests (with in-process reference ops). Its times are meaningless and never reported."""

    device = "cpu"

    def free_bytes(self) -> int:
        return 1 << 40

    def smem_optin_bytes(self) -> int:
        return DEFAULT_SMEM_OPTIN_IF_UNKNOWN

    def capture(self, step: Callable[[], None]) -> Callable[[], None]:
        step()
        return step

    def sync(self) -> None:
        pass

    def time_s(self, fn: Callable[[], None]) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
