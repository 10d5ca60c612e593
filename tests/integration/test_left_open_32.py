"""Two items of the thirty-second hostile pass's left-open list, closed by the lead (issue 41):
records that named a folder or file outside the work directory, which the kit then used.

- An environment's marker (``envs/<tree>/.kvprefetch-env.json``) held ``path_tail``, the
  creator's scripts folder, and ``Env.environ()`` put what it said last on every build
  command's PATH: a forged marker put any folder outside the work directory there (a
  ``ninja`` in it ran where the user's PATH had none). The tail is now asked of the creator
  python this run names, never read from the marker.
- verify-kernel's no-device driver stub took the env's ``vllm/_C*.so`` beside a build
  manifest's ``so_path``: a relative one was globbed from the working folder, and one outside
  the work directory had ``nm`` read (and the stub be built for) a library there. The
  ``so_path`` must now be an environment's file, as the manifest's interpreter must.

And three wrong-way messages of the thirty-first pass's list: ``verify-kernel --workdir`` on a
folder that is no work directory said to build; ``slurm plan --source ''`` planned the working
folder as the source; ``report --readme``/``--index`` ignored FILES given beside them.

Nothing is mocked but ``driver_loadable`` (this machine has no NVIDIA driver either way; the
stub is built only where none loads, and the test forces that branch where one does)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import sysconfig
from pathlib import Path

import pytest

from kvprefetch.errors import VerifyError
from kvprefetch.machine.envs import MARKER, VenvEnv
from kvprefetch.workspace.workdir import Workdir
from tests.integration.test_reliability import cli, refused


def _forge_tail(env_path: Path, tail: object) -> None:
    marker = env_path / MARKER
    data = json.loads(marker.read_text())
    data["path_tail"] = tail
    marker.write_text(json.dumps(data))


def test_an_environment_markers_path_tail_never_reaches_the_builds_path(tmp_path: Path) -> None:
    outside_bin = tmp_path / "outside" / "bin"
    outside_bin.mkdir(parents=True)
    path = tmp_path / "work" / "envs" / "baseline"
    path.parent.mkdir(parents=True)
    VenvEnv(path, python=sys.executable, system_site_packages=True, with_pip=False).create()
    _forge_tail(path, [str(outside_bin)])

    env = VenvEnv(path, python=sys.executable, system_site_packages=True, with_pip=False)
    env.create()  # reused: the marker says ready, with this run's options
    entries = env.environ({"PATH": "/usr/bin:/bin"})["PATH"].split(os.pathsep)
    assert str(outside_bin) not in entries, entries
    # what the tail is for is still there: the creator's scripts (ninja, cmake from pip)
    assert entries[-1] == sysconfig.get_path("scripts"), entries
    assert entries[0] == str(path / "bin"), entries


def test_a_venv_of_its_own_has_no_tail_whatever_its_marker_says(tmp_path: Path) -> None:
    path = tmp_path / "envs" / "patched"
    path.parent.mkdir(parents=True)
    VenvEnv(path, python=sys.executable, with_pip=False).create()
    _forge_tail(path, [str(tmp_path / "outside")])
    env = VenvEnv(path, python=sys.executable, with_pip=False)
    env.create()
    assert env.environ({"PATH": "/usr/bin"})["PATH"].split(os.pathsep) == [
        str(path / "bin"), "/usr/bin"]


def _site_with_vllm_c(site: Path) -> Path:
    import _ssl  # any shared library serves as the env's vllm/_C for nm

    (site / "vllm").mkdir(parents=True)
    shutil.copyfile(_ssl.__file__, site / "vllm" / "_C.abi3.so")
    return site


@pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("nm")), reason="needs gcc and nm")
@pytest.mark.parametrize("where", ["outside", "relative"])
def test_the_driver_stub_reads_no_library_a_manifest_names_outside_the_environments(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    from kvprefetch.overlay import driverstub
    from kvprefetch.verify import kernel

    work = tmp_path / "work"
    (work / "envs").mkdir(parents=True)
    if where == "outside":
        site = _site_with_vllm_c(tmp_path / "outside" / "site")
        so_path = str(site / "kvprefetch_kernels" / "_C.so")
    else:  # relative to the working folder, which the forger may choose (the work directory)
        _site_with_vllm_c(work / "site")
        monkeypatch.chdir(work)
        so_path = "site/kvprefetch_kernels/_C.so"
    monkeypatch.setattr(driverstub, "driver_loadable", lambda: False)
    with pytest.raises(VerifyError) as caught:
        kernel._driver_stub(Workdir(work), {"so_path": so_path, "tree": "patched"})
    err = caught.value
    assert "names the library" in err.cause and "kvprefetch build --mode overlay" in err.fix, err
    assert not (work / "verify").exists(), "a stub was built for a library outside"


@pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("nm")), reason="needs gcc and nm")
def test_the_driver_stub_is_still_built_for_an_environments_library(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvprefetch.overlay import driverstub
    from kvprefetch.verify import kernel

    work = tmp_path / "work"
    site = _site_with_vllm_c(work / "envs" / "patched-overlay" / "lib" / "site-packages")
    monkeypatch.setattr(driverstub, "driver_loadable", lambda: False)
    stub = kernel._driver_stub(Workdir(work), {
        "so_path": str(site / "kvprefetch_kernels" / "_C.so"), "tree": "patched"})
    assert stub is not None and stub["for"] == str(site / "vllm" / "_C.abi3.so"), stub
    assert Path(stub["dir"]).is_relative_to(work / "verify" / "driver-stub")


def test_verify_kernel_on_a_folder_that_is_no_work_directory_says_so(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("a user's folder\n")
    res = cli("verify-kernel", "--workdir", str(tmp_path / "mine"), "--no-gpu", timeout=60)
    refused(res, 6, "is not a kvprefetch work directory", "pass --workdir the folder")
    assert "run `kvprefetch build`" not in res.stderr, res.stderr
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]


def test_slurm_plan_refuses_an_empty_source(tmp_path: Path) -> None:
    res = cli("slurm", "plan", str(tmp_path / "c"), "--source", "", "--stand-in", timeout=60)
    refused(res, 2, "--source '' does not exist")
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("mode", ["--readme", "--index"])
def test_report_refuses_files_it_would_ignore(tmp_path: Path, mode: str) -> None:
    target = tmp_path / "README.md"
    target.write_text("# nothing to regenerate\n")
    (tmp_path / "runs").mkdir()
    extra = tmp_path / "result.json"
    extra.write_text("{}")
    named = str(target) if mode == "--readme" else str(tmp_path / "runs")
    res = cli("report", mode, named, str(extra), timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "give them no FILES" in res.stderr, res.stderr
    assert target.read_text() == "# nothing to regenerate\n"
