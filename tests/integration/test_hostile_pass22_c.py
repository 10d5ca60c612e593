"""Issue 41, the twenty-second hostile pass (tester c: every command, option, input and
environment value, for tracebacks, hangs, wrong messages and wrong writes). Each test fails
without its fix (checked by reverting ``src`` and running it):

- An explicit ``--cuda-home`` that is no toolkit was passed over without a word:
  ``overlay.toolkit.candidate_roots`` keeps only toolkits, so ``build --mode overlay
  --cuda-home /opt/cuda-12.8-typo`` (or ``/dev/zero``, a file, a name with a newline) compiled
  with whichever other toolkit the machine had (with ``--allow-cuda-mismatch``, its CUDA 13
  one), and where none matched, the failure said to pass ``--cuda-home`` or
  ``--allow-cuda-mismatch``, both given. Now such a value is refused, naming it (doctor's
  toolkit row fails; the build's preflight stops).
- ``build --dry-run`` computed the preflight and dropped it: ``build --dry-run --mode overlay
  --cuda-home X`` printed its plan, exit 0, without a word for 28 of 30 hostile values of X,
  while the same command without ``--dry-run`` stopped at once on the preflight (exit 2). Now
  the dry run prints the plan and, on stderr, what the build would refuse with its fix (the
  dry run keeps exit 0, as ``bench e2e --dry-run``'s "would refuse" does).
- The build.ninja of kernels-only and overlay builds wrote nvcc's path into the shell command
  unquoted: a toolkit in a folder with a space (``CUDA_HOME='/opt/cuda 12.8'``, ``--cuda-home``,
  a conda environment under ``My Envs``), which doctor's compile probe runs fine, had every
  compile fail with ``/bin/sh: /opt/cuda: not found``. Now the path is quoted for the shell
  (``CXX`` stays a shell fragment, as make reads it: ``ccache g++``).
- ``doctor --workdir FILE`` (a regular file, ``/dev/zero``, a FIFO, ``FILE/sub``) said "62.6
  GiB free at FILE ... all checks passed", exit 0, and ``build`` there then refused the work
  directory. Now doctor's disk row fails, naming what stands in the way (exit 2).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kvprefetch.errors import ConfigError
from kvprefetch.overlay.toolkit import choose_toolkit

_REPO = Path(__file__).resolve().parents[2]

# What `nvcc --version` prints on a CUDA 12.6 toolkit (conftest's NVCC_12_6_TEXT, shortened)
_NVCC_12 = "Cuda compilation tools, release 12.6, V12.6.85"


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("KVPREFETCH_WORKDIR", "CUDA_HOME", "CUDA_PATH")}
    # no network in tests: the overlay preflight's index probe is refused at once
    env.update(PYTHONPATH=str(_REPO / "src"), TMPDIR=str(tmp_path), HOME=str(tmp_path),
               PIP_INDEX_URL="http://127.0.0.1:9/simple", UV_INDEX_URL="http://127.0.0.1:9/simple",
               KVPREFETCH_DEBIAN_MIRROR="http://127.0.0.1:9/debian")
    return env


def _kit(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=_env(tmp_path),
                          capture_output=True, text=True, timeout=300, check=False)


def _fake_toolkit(root: Path) -> Path:
    """A CUDA 12 toolkit's shape (bin/nvcc answering --version, include/cuda_runtime.h): the
    machine's other toolkit, which a mistyped --cuda-home fell back to."""
    (root / "bin").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "include" / "cuda_runtime.h").write_text("/* fake */\n")
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho '{_NVCC_12}'\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    return root


@pytest.mark.parametrize("given", ["cuda-12.8-typo", "a-file", "/dev/zero", "new\nline"])
def test_a_cuda_home_that_is_no_toolkit_is_refused_not_passed_over(tmp_path: Path,
                                                                   given: str) -> None:
    other = _fake_toolkit(tmp_path / "cuda-12.6")
    (tmp_path / "a-file").write_text("not a toolkit\n")
    explicit = given if given.startswith("/") else str(tmp_path / given)
    environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CUDA_HOME": str(other)}
    for allow in (False, True):
        with pytest.raises(ConfigError) as exc:  # without the fix: the fake toolkit
            choose_toolkit("12.8", environ, explicit=explicit, allow_mismatch=allow)
        assert "--cuda-home" in exc.value.cause and repr(explicit) in exc.value.cause
        assert exc.value.fix and "--cuda-home" in exc.value.fix


def test_a_dry_run_says_what_the_build_would_refuse(tmp_path: Path,
                                                    fetched_workdir: Path) -> None:
    wd = str(fetched_workdir)
    assert _kit(tmp_path, "apply", "--workdir", wd).returncode == 0
    typo = str(tmp_path / "cuda-12.8-typo")
    argv = ["build", "--workdir", wd, "--mode", "overlay", "--cuda-home", typo]
    real = _kit(tmp_path, *argv)
    assert real.returncode == 2 and "Traceback" not in real.stderr, real.stderr
    assert "preflight" in real.stderr and typo in real.stderr
    dry = _kit(tmp_path, *argv, "--dry-run")
    assert dry.returncode == 0 and "Traceback" not in dry.stderr, dry.stderr
    assert "[patched]" in dry.stdout  # the plan is still shown
    assert "would refuse: preflight" in dry.stderr and typo in dry.stderr, dry.stderr
    assert "To fix" in dry.stderr
    assert not (fetched_workdir / "envs").exists() and not (fetched_workdir / "build").exists()


def test_an_nvcc_in_a_folder_with_a_space_is_run_as_one_path(tmp_path: Path) -> None:
    from kvprefetch.builds.library import ninja_text

    ninja = shutil.which("ninja")
    if ninja is None:
        pytest.skip("ninja is not installed")
    ran = tmp_path / "ran.log"
    tool = ("#!/bin/sh\n"
            f"echo \"$0\" >> '{ran}'\n"
            'for a; do [ "$prev" = -o ] && : > "$a"; prev=$a; done\n')
    nvcc = tmp_path / "cuda 12.8" / "bin" / "nvcc"
    cxx = tmp_path / "cxx"
    for exe in (nvcc, cxx):
        exe.parent.mkdir(parents=True, exist_ok=True)
        exe.write_text(tool)
        exe.chmod(0o755)
    (tmp_path / "k.cu").write_text("\n")
    (tmp_path / "a.cpp").write_text("\n")
    (tmp_path / "build.ninja").write_text(ninja_text(
        nvcc=nvcc, cxx=str(cxx), cu_sources=[tmp_path / "k.cu"], cpp_source=tmp_path / "a.cpp",
        nvcc_flags=[], cxx_flags=[], link_flags=[], output=tmp_path / "out.so"))
    res = subprocess.run([ninja, "-C", str(tmp_path)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert str(nvcc) in ran.read_text().splitlines() and (tmp_path / "out.so").exists()


@pytest.mark.parametrize("kind", ["file", "fifo", "below-a-file", "device"])
def test_doctor_fails_a_work_directory_that_cannot_be_a_folder(tmp_path: Path,
                                                               kind: str) -> None:
    from kvprefetch.doctor.host import check_disk
    from kvprefetch.doctor.probes import DoctorProbes

    thing = tmp_path / "thing"
    if kind == "fifo":
        os.mkfifo(thing)
    elif kind != "device":
        thing.write_text("a file of the user's\n")
    workdir = {"below-a-file": thing / "work", "device": Path("/dev/null")}.get(kind, thing)
    row = check_disk(workdir, "kernels-only", DoctorProbes())
    assert row.status == "fail", row
    blocker = Path("/dev/null") if kind == "device" else thing
    assert str(blocker) in row.detail and "not a folder" in row.detail
    assert row.fix and "--workdir" in row.fix
    if kind != "device":
        assert thing.exists() and (kind == "fifo" or thing.read_text() == "a file of the user's\n")
