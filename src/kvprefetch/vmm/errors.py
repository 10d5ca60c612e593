"""The VMM cache's errors. All are ``KvprefetchError``s (cause + "To fix: ..."). After any of
them the cache is still consistent and usable: nothing is half-mapped in its bookkeeping."""

from __future__ import annotations

from ..errors import KvprefetchError


class VmmError(KvprefetchError):
    """Base class of the VMM cache's errors."""

    exit_code = 9


class VmmUsageError(VmmError):
    """The caller asked for something the cache cannot do: a context beyond ``S_max``, a slot
    that does not exist, a double free, no free slot, a call after teardown."""


class VmmOutOfMemory(VmmError):
    """Physical memory (the device, or the configured budget) ran out while mapping pages.

    ``short`` maps slot -> page groups still missing. The slots keep every page they had; a
    scheduler should preempt a request (``free_reqid``) and call ``step`` again."""

    def __init__(self, cause: str, fix: str | None = None,
                 short: dict[int, int] | None = None) -> None:
        self.short = dict(short or {})
        super().__init__(cause, fix)


class VmmDriverError(VmmError):
    """A CUDA driver call returned an error other than out-of-memory."""

    def __init__(self, call: str, code: int, name: str, text: str) -> None:
        self.call = call
        self.code = code
        self.name = name
        super().__init__(
            f"CUDA driver call {call} failed with {name} ({code}): {text}",
            "check that the GPU is healthy (nvidia-smi) and that the cache was initialised on "
            "this device; rerun with --debug for the traceback",
        )
