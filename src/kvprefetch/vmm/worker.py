"""The one persistent mapping thread.

Protocol (what makes it race-free, unlike the reference's detached thread per step, whose
"running" flag was set *inside* the new thread and waited on with a busy spin):

1. At most one job is outstanding. ``submit`` marks the worker busy *under the condition
   variable, in the submitting thread, before the job can run*, so a ``wait`` that follows can
   never miss it.
2. ``wait`` blocks on the condition (no spinning) until the job has finished, then hands back the
   job's exception, if any, exactly once.
3. The thread calls ``init`` once at start (``cuCtxSetCurrent`` on the primary context) and reports
   a failure of ``init`` to the constructor.
4. The cache calls ``wait`` before anything that adds or removes mappings on the calling thread, so
   mapping-changing driver calls come either from the worker while a job runs or from the caller
   while none does; never from both. Bookkeeping shared with ``alloc``/``free`` (which do not wait)
   is guarded by the cache's lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class MappingWorker:
    def __init__(self, init: Callable[[], None], name: str = "kvprefetch-vmm-mapper") -> None:
        self._init = init
        self._cond = threading.Condition()
        self._job: Callable[[], None] | None = None
        self._busy = False
        self._stopping = False
        self._error: BaseException | None = None
        self._started = threading.Event()
        self._init_error: BaseException | None = None
        self.thread_ident: int | None = None
        self.jobs_run = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._started.wait()
        if self._init_error is not None:
            self._thread.join()
            raise self._init_error

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._busy

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, job: Callable[[], None]) -> None:
        with self._cond:
            if self._stopping:
                raise RuntimeError("mapping worker is stopped")
            if self._busy:
                raise RuntimeError("mapping worker already has a job: call wait() first")
            self._job = job
            self._busy = True
            self._cond.notify_all()

    def wait(self) -> BaseException | None:
        with self._cond:
            while self._busy:
                self._cond.wait()
            err, self._error = self._error, None
            return err

    def stop(self) -> BaseException | None:
        err = self.wait()
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()
        return err

    def _run(self) -> None:
        self.thread_ident = threading.get_ident()
        try:
            self._init()
        except BaseException as exc:  # noqa: BLE001 - reported to the constructor
            self._init_error = exc
            self._started.set()
            return
        self._started.set()
        while True:
            with self._cond:
                while self._job is None and not self._stopping:
                    self._cond.wait()
                if self._job is None:  # stopping and idle
                    return
                job, self._job = self._job, None
            error: BaseException | None = None
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - handed to the next wait()
                error = exc
            with self._cond:
                self._error = error
                self._busy = False
                self.jobs_run += 1
                self._cond.notify_all()
