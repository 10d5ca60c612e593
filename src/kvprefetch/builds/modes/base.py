"""The ``BuildMode`` interface: what one way of building a tree supplies, so that
``pipeline`` (prepare, plan, execute) and ``sequence`` (one tree's build) never ask which mode
they hold. A mode supplies:

- its preflight (``preflight``): which of doctor's checks a build in this mode runs. Doctor owns
  the checks and sits below ``builds``; the mode calls it (``run_doctor``), never the reverse;
- what it resolves on this machine before planning (``resolve`` -> ``ModeInputs``) and its
  default environment kind;
- its tree plan (``tree_plan``: the key, the named steps, the outputs) and what it adds to the
  plan's toolchain and notes;
- its part of a tree's build (``tree_steps``: the environment it makes, a handler per step
  name, its manifest entries), which ``sequence.build_tree`` runs under the locks.

Exception contract: ``resolve`` and ``tree_plan`` raise ``ConfigError`` for what the user
can fix before anything runs; a ``TreeSteps`` handler raises ``BuildError``."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ...doctor.preflight import run_doctor
from ...doctor.report import DoctorReport, Mode
from ...kernels.selection import Selection
from ...machine.toolchain import CudaArch
from ...workspace.workdir import Workdir
from ..options import BuildOptions, ModeInputs
from ..plan import TreePlan
from ..sequence import TreeRun, TreeSteps


@dataclass(frozen=True)
class TreeContext:
    """Everything a mode's ``tree_plan`` is given for one tree: the tree as recorded, what
    ``make_plan`` decided for every tree, and what the mode resolved."""

    wd: Workdir
    tree: str
    variant: str | None              # None for baseline
    patch: str | None                # the applied patch's sha256
    state: dict[str, Any]            # the tree's state record
    src_hash: str
    env_backend: str
    env_path: Path
    python: str
    namespace: str
    env_set: dict[str, str]          # what every mode sets (arch list, jobs, CUDA_HOME)
    arch_list: str
    gencode: tuple[str, ...]
    selection: Selection
    jobs: int
    defines: tuple[str, ...]         # --tree-define for this tree
    nvcc: str | None
    nvcc_version: tuple[int, int, int] | None
    cuda_home: str | None
    inputs: ModeInputs


class BuildMode(abc.ABC):
    """One way of building a tree (``modes/__init__.py`` holds the registry)."""

    name: ClassVar[str]               # the registry's key
    plan_mode: ClassVar[Mode]         # what --mode, the plan and doctor call it
    compiles_kernels: ClassVar[bool] = False  # builds the kernels library: narrowable, trees
    #                                            side by side, an estimate before it starts
    says_what_archs_lack: ClassVar[bool] = True  # the notice of archs below 9.0
    smoke_preflight: ClassVar[bool] = False

    def default_env_backend(self) -> str:
        """The environment kind when --env-backend is not given."""
        return "venv"

    def needs_network(self, opts: BuildOptions) -> bool:
        """Whether the preflight requires the network (a full build's FetchContent)."""
        return False

    def preflight(self, opts: BuildOptions, archs: Sequence[CudaArch],
                  environ: Mapping[str, str], *, env_backend: str, envs: int) -> DoctorReport:
        """Doctor's checks for this mode, with the build's options and environment."""
        return run_doctor(archs, env=environ, workdir=opts.workdir,
                          need_network=self.needs_network(opts), mode=self.plan_mode,
                          cuda_home_opt=opts.cuda_home,
                          allow_cuda_mismatch=opts.allow_cuda_mismatch,
                          smoke=self.smoke_preflight, torch_from=opts.torch_from,
                          env_backend=env_backend, envs=envs, read_only=opts.dry_run)

    @abc.abstractmethod
    def resolve(self, opts: BuildOptions, wd: Workdir, environ: dict[str, str], *,
                env_backend: str, nvcc: Path | None) -> ModeInputs:
        """What this mode needs from the machine before planning (probes, not builds)."""

    def plan_toolchain(self, toolchain: dict[str, Any], inputs: ModeInputs) -> dict[str, Any]:
        """The plan's toolchain record (the machine's nvcc unless the mode compiles with
        another)."""
        return toolchain

    def plan_notes(self, inputs: ModeInputs) -> list[str]:
        """The mode's own notes, printed before the plan's others."""
        return []

    def env_path(self, wd: Workdir, tree: str) -> Path:
        return wd.env(tree)

    @abc.abstractmethod
    def tree_plan(self, ctx: TreeContext) -> TreePlan:
        """One tree's frozen plan: key, named steps, environment variables, outputs."""

    @abc.abstractmethod
    def tree_steps(self, run: TreeRun) -> TreeSteps:
        """This mode's part of building ``run``'s tree."""
