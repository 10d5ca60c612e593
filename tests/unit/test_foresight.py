"""What `build` says before it compiles (issue 42): the one line naming what the patched trees
lack on archs below 9.0, the estimate, and the question it asks before a long build, only where
someone can answer it. `doctor` says the same.

Faked, and why: `build`'s plan and its execution (a real plan probes torch and nvcc, a real
build compiles for minutes; this layer starts no process), the machine's core count (so the
estimate does not depend on the machine running the test), and whether stdin is a terminal
(click's CliRunner never gives one, and a real terminal cannot be had in a test)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from kvprefetch.builds import foresight
from kvprefetch.builds.options import ModeInputs
from kvprefetch.builds.plan import render_plan
from kvprefetch.cli import build as build_cli
from kvprefetch.cli import main
from kvprefetch.machine import foresight as machine_foresight
from kvprefetch.machine.toolchain import parse_arch_list


def test_archs_below_9_say_in_one_line_what_the_patched_trees_lack() -> None:
    line = machine_foresight.lacking(parse_arch_list("8.0"))
    assert line is not None and "\n" not in line
    assert "sm_80" in line and "without the L2 prefetch (UBLKPF)" in line and "9.0a" in line
    assert machine_foresight.lacking(parse_arch_list("8.0;9.0a")) is None
    assert machine_foresight.lacking(parse_arch_list("9.0a")) is None


def _plan(kernels: int, trees: tuple[str, ...] = ("baseline", "patched"),
          up_to_date: tuple[str, ...] = (), mode: str = "kernels-only") -> Any:
    """The fields of a BuildPlan that the estimate and the summary read."""
    return SimpleNamespace(
        mode=mode, trees=tuple(SimpleNamespace(tree=t, build_dir=f"/w/build/{t}/k", key="k")
                               for t in trees),
        up_to_date=up_to_date, selection={"kernels_per_source": kernels},
        gencode=("-gencode=arch=compute_90,code=sm_90",), parallel_trees=2, jobs=1,
        toolchain={})


def test_estimate_scales_with_what_is_compiled() -> None:
    per = machine_foresight.CORE_SECONDS_PER_INSTANTIATION
    full = foresight.estimate_seconds(_plan(486), cores=2)
    # 2 trees x 2 sources x 486 instantiations, two nvcc at a time
    assert full == pytest.approx(2 * 2 * 486 * per / 2)
    assert full is not None and full > machine_foresight.CONFIRM_OVER_S
    assert foresight.estimate_seconds(_plan(486), cores=1) == pytest.approx(2 * full)
    assert foresight.estimate_seconds(_plan(486, up_to_date=("baseline",)), cores=2) == \
        pytest.approx(2 * 486 * per / 2)
    assert foresight.estimate_seconds(_plan(486, up_to_date=("baseline", "patched")), 2) == 0
    assert foresight.estimate_seconds(_plan(486, mode="full"), cores=2) is None  # hours


@pytest.mark.parametrize(("seconds", "interactive", "yes", "asks"), [
    (3600.0, True, False, True), (3600.0, False, False, False), (3600.0, True, True, False),
    (60.0, True, False, False), (None, True, False, True)])
def test_only_a_long_build_at_a_terminal_without_yes_asks(
        seconds: float | None, interactive: bool, yes: bool, asks: bool) -> None:
    assert foresight.needs_confirmation(seconds, interactive=interactive, yes=yes) is asks


@pytest.fixture
def fake_build(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """`kvprefetch build` with a faked plan (``state["plan"]``), execution, core count and
    terminal (``state["tty"]``); ``state["executed"]`` counts the executions."""
    from kvprefetch.builds import pipeline
    from kvprefetch.machine import toolchain

    state: dict[str, Any] = {"executed": 0, "tty": False, "plan": _plan(486)}
    monkeypatch.setattr(pipeline, "prepare_build",
                        lambda opts: pipeline.PreparedBuild(state["plan"], ModeInputs(), ()))
    monkeypatch.setattr("kvprefetch.builds.plan.render_plan", lambda plan: "the plan")

    def execute(plan: Any, inputs: ModeInputs, **_: Any) -> list[Any]:
        state["executed"] += 1
        return []

    monkeypatch.setattr(pipeline, "execute", execute)
    monkeypatch.setattr(toolchain, "host_resources", lambda: (2, 24.0))
    monkeypatch.setattr(build_cli, "stdin_is_terminal", lambda: state["tty"])
    return state


def test_a_long_build_asks_at_a_terminal_and_stops_on_no(fake_build: dict) -> None:
    fake_build["tty"] = True
    res = CliRunner().invoke(main, ["build", "--arch", "9.0a"], input="n\n")
    assert res.exit_code == 0, res.output
    from kvprefetch.machine.progress import clock

    expected = clock(foresight.estimate_seconds(fake_build["plan"], cores=2) or 0)
    assert f"estimate: about {expected} to compile 2 tree(s)" in res.output
    assert "Start the build?" in res.output and "build not started" in res.output
    assert fake_build["executed"] == 0
    res = CliRunner().invoke(main, ["build"], input="y\n")
    assert "Start the build?" in res.output and fake_build["executed"] == 1


def test_yes_or_no_terminal_builds_without_asking(fake_build: dict) -> None:
    fake_build["tty"] = True
    res = CliRunner().invoke(main, ["build", "--yes"])
    assert "Start the build?" not in res.output and fake_build["executed"] == 1
    fake_build["tty"] = False  # scripts/main.sh, CI: unattended, the estimate printed
    res = CliRunner().invoke(main, ["build"])
    assert "estimate: about" in res.output and "Start the build?" not in res.output
    assert fake_build["executed"] == 2


def test_a_short_build_does_not_ask(fake_build: dict) -> None:
    fake_build["tty"] = True
    fake_build["plan"] = _plan(6)  # --head-sizes 128 --block-sizes 16 --kv-dtypes fp16
    res = CliRunner().invoke(main, ["build"])
    assert "Start the build?" not in res.output and fake_build["executed"] == 1


def test_an_up_to_date_tree_is_one_line_of_the_plan(tmp_path: Path) -> None:
    from kvprefetch.builds.plan import BuildPlan, Step, TreePlan

    def tree(name: str) -> TreePlan:
        return TreePlan(tree=name, variant=None, patch_sha256=None, source_tree=str(tmp_path),
                        source_sha256="0" * 64, key=f"key-{name}", build_dir=str(tmp_path / name),
                        log_dir=str(tmp_path / name / "logs"), env_backend="venv",
                        env_path=str(tmp_path / "env"), python="python", namespace=name,
                        defines=(), env_set={}, env_unset=(),
                        steps=(Step("compile", ("ninja", "-C", "x"), "compile"),), outputs=())

    plan = BuildPlan("kernels-only", str(tmp_path), "9.0a", (), 1, 1, {}, {},
                     (tree("baseline"), tree("patched")), up_to_date=("baseline",))
    text = render_plan(plan)
    skipped = [ln for ln in text.splitlines() if "baseline" in ln and "trees:" not in ln]
    manifest = tmp_path / "baseline" / "manifest.json"
    assert skipped == [(f"[baseline] up to date: {manifest} records key key-baseline; "
                        "skipped unless --force")]
    assert "[patched] variant=stock" in text and "ninja -C x" in text
