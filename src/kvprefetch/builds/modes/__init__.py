"""The build modes, one module each, behind one interface (``base.BuildMode``), and the
registry that chooses among them: ``pipeline`` asks ``mode_named`` (from the options) or
``mode_of`` (from a plan) and never compares mode names itself.

- ``kernels_only``: the kernels library per tree in a venv inheriting the kit's torch;
- ``overlay``: the released vLLM wheel per tree plus the tree's kernels, routed in by a plugin;
- ``full``: pip-build all of vLLM per tree;
- ``smoke``: the full build's configure and its attention objects only (``--smoke``).

A new mode is a module here with a ``BuildMode`` subclass (its preflight, inputs, tree plan and
``TreeSteps``) and one line in ``REGISTRY``; doctor's checks for it go in ``doctor/``, which the
mode's ``preflight`` calls."""

from __future__ import annotations

from collections.abc import Mapping

from ...errors import ConfigError
from ..plan import BuildPlan
from .base import BuildMode
from .full import FullMode
from .kernels_only import KernelsOnlyMode
from .overlay import OverlayMode
from .smoke import SmokeMode

REGISTRY: Mapping[str, BuildMode] = {m.name: m for m in (
    FullMode(), KernelsOnlyMode(), OverlayMode(), SmokeMode())}
SMOKE = "smoke"
# What --mode accepts (the smoke is --mode full --smoke).
MODES = tuple(name for name in REGISTRY if name != SMOKE)


def smoke_mode_request(mode: str, smoke: bool) -> str:
    """The --mode doctor resolves for these options: ``full`` for --smoke, which no other mode
    has (a ConfigError), else ``mode`` as given."""
    if not smoke:
        return mode
    plan_mode = REGISTRY[SMOKE].plan_mode
    if mode not in ("auto", plan_mode):
        raise ConfigError(f"--smoke is a full-mode check; --mode {mode} has none",
                          "use `build --mode full --smoke` (or leave --mode out)")
    return plan_mode


def mode_named(name: str, *, smoke: bool = False) -> BuildMode:
    """The mode ``--mode name`` (auto already resolved) builds with; ``smoke``: --smoke."""
    if name not in MODES:
        raise ConfigError(f"unknown build mode {name!r}", f"use one of {MODES}")
    return REGISTRY[SMOKE] if smoke else REGISTRY[name]


def mode_of(plan: BuildPlan) -> BuildMode:
    """The mode that made ``plan`` (a smoke plan is a full plan whose toolchain names the
    smoke's inputs)."""
    return mode_named(plan.mode, smoke=bool(plan.toolchain.get("smoke")))
