"""The preflight (``kvprefetch doctor``, also run by ``build``): checks the machine against what a
full, kernels-only or overlay build of both trees needs, and explains every failure with
"To fix: ...".

One module per concern, importing downward only:

- ``report``: the vocabulary (``Check``, ``Status``, ``Mode``) and the frozen ``DoctorReport``;
- ``estimates``: how much disk each mode needs (and whether the overlay's environments share
  one install);
- ``probes``: ``DoctorProbes``, the outside world (free disk, memory, network, the GPU query,
  where toolkits may live) as fields, so tests can simulate a full disk or an unreachable GitHub;
- ``tools``: the toolchain checks (nvcc and a real compile of the bulk-prefetch instruction,
  CUDA_HOME and its libraries, the overlay's and the smoke's toolkits, gcc, cmake);
- ``host``: the machine's checks (disk, memory, build time, git and network, the package
  index, conda, the GPU);
- ``preflight``: ``run_doctor``, which runs the checks of one mode into a report;
- ``mode``: ``choose_mode`` (what ``--mode auto`` builds here, and why) and ``check_machine``,
  the ``kvprefetch doctor`` command's library call.

Import from the module that owns a name; this package re-exports nothing."""
