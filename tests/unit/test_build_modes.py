"""The build modes' registry (builds/modes/): every mode --mode offers is registered, a plan
finds the mode that made it, and every step a mode's plan holds has a handler of that mode (or
is one the sequence runs itself), so steps are found by name and never by position.

Faked, and why: the trees' state (a plan reads a fetched tree's record; this layer fetches
nothing) and the smoke's inputs (resolving them probes a torch 2.8.0 environment and cmake).
Nothing is built: the handlers are looked up, not run."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvprefetch.builds.full_smoke import SmokeInputs
from kvprefetch.builds.modes import MODES, REGISTRY, mode_named, mode_of, smoke_mode_request
from kvprefetch.builds.modes.base import TreeContext
from kvprefetch.builds.options import ModeInputs
from kvprefetch.builds.plan import BuildPlan, env_set_common
from kvprefetch.builds.sequence import CREATE_ENV, MANIFEST, TreeOutcome, TreeRun
from kvprefetch.cli.build import build as build_command
from kvprefetch.errors import ConfigError
from kvprefetch.kernels.selection import Selection
from kvprefetch.overlay.install import OverlayOptions
from kvprefetch.workspace.workdir import Workdir

SMOKE = SmokeInputs("/t/bin/python", "2.8.0+cu128", "12.8", "/t/site", "/cuda", "12.4.131",
                    "why", "/usr/bin/cmake", "3.31.10", ("v1", "v2"))
INPUTS = {"kernels-only": ModeInputs(), "full": ModeInputs(ccache="/usr/bin/ccache"),
          "overlay": ModeInputs(overlay=OverlayOptions()), "smoke": ModeInputs(smoke=SMOKE)}


def test_the_registry_holds_what_mode_offers() -> None:
    choices = next(p for p in build_command.params if p.name == "mode").type.choices  # type: ignore[attr-defined]
    assert set(MODES) == set(choices) - {"auto"}
    assert set(REGISTRY) == {*MODES, "smoke"}
    assert mode_named("full", smoke=True) is REGISTRY["smoke"]
    with pytest.raises(ConfigError, match="unknown build mode"):
        mode_named("fast")
    with pytest.raises(ConfigError, match="--smoke is a full-mode check"):
        smoke_mode_request("overlay", True)
    assert smoke_mode_request("auto", True) == "full" == smoke_mode_request("full", False)


def test_a_plan_names_the_mode_that_made_it() -> None:
    for name, mode in REGISTRY.items():
        plan = SimpleNamespace(mode=mode.plan_mode,
                               toolchain={"smoke": SMOKE.to_dict()} if name == "smoke" else {})
        assert mode_of(plan) is mode  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_step_of_a_modes_plan_has_a_handler(name: str, tmp_path: Path) -> None:
    mode, inputs = REGISTRY[name], INPUTS[name]
    wd = Workdir(tmp_path)
    ctx = TreeContext(
        wd=wd, tree="patched", variant="prefetch", patch="0" * 64, state={}, src_hash="1" * 64,
        env_backend="venv", env_path=mode.env_path(wd, "patched"),
        python=str(mode.env_path(wd, "patched") / "bin" / "python"),
        namespace="kvprefetch_patched", env_set=env_set_common("9.0a", 2, 1, "/cuda"),
        arch_list="9.0a", gencode=("-gencode=arch=compute_90a,code=sm_90a",),
        selection=Selection(), jobs=2, defines=(), nvcc="/cuda/bin/nvcc",
        nvcc_version=(12, 8, 93), cuda_home="/cuda", inputs=inputs)
    tp = mode.tree_plan(ctx)
    toolchain: dict[str, Any] = mode.plan_toolchain({"cuda_home": "/cuda"}, inputs)
    plan = BuildPlan(mode.plan_mode, str(tmp_path), "9.0a", ctx.gencode, 2, 1,
                     ctx.selection.to_dict(), toolchain, (tp,))
    steps = mode.tree_steps(TreeRun(tp, plan, inputs, TreeOutcome(tp.tree), 0.0))
    names = [s.name for s in tp.steps]
    assert names[-1] == MANIFEST and len(set(names)) == len(names)
    handled = set(steps.handlers()) | {CREATE_ENV, MANIFEST}
    assert set(names) <= handled, f"{name}: no handler for {sorted(set(names) - handled)}"
    assert tp.step(names[0]) is tp.steps[0]
