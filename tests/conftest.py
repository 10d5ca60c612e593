"""What every layer shares: the ``gpu`` marker skip and small fixtures.

The tests come in three layers (STYLE.md section 9), each a folder:
  * ``tests/unit``: pure tests, seconds in all; no process, no network (a guard in
    tests/unit/conftest.py fails a test that starts either);
  * ``tests/integration``: the real sdist, real git, real venvs, real nvcc, a real Slurm
    (its fixtures and helpers are in tests/integration/);
  * ``tests/gpu``: ``gpu``-marked, run on the H200.

``gpu``-marked tests are skipped, with the reason, where torch is missing or sees no CUDA
device. torch is imported only when at least one collected test carries the marker, so the
fast unit tests never pay for it."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path

import pytest

# pytester runs an inner pytest for tests/unit/test_guard.py's end-to-end check of the guard
pytest_plugins = ["pytester"]

@lru_cache(maxsize=1)
def _gpu_unavailable_reason() -> str | None:
    """None when a CUDA GPU is usable from this interpreter, else why not."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return f"torch is not installed in {sys.executable}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "Failed to initialize NumPy" on import
            import torch
    except Exception as exc:  # noqa: BLE001 -- a broken torch install means skip, not crash
        return f"torch failed to import: {exc}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if not torch.cuda.is_available():
                return (f"no CUDA GPU visible to torch {torch.__version__} "
                        "(torch.cuda.is_available() is False)")
    except Exception as exc:  # noqa: BLE001 -- same: report it as the skip reason
        return f"torch.cuda.is_available() failed: {exc}"
    return None


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (scripts/test.sh), each worker gets a system temp folder of its own:
    TMPDIR, for this process and every command a test starts, is ``<run>/tmp-gwN`` beside the
    worker's basetemp (removed with the run's basetemp when it passes). Several tests look at
    the temp folder as a whole: pass 10 q swaps the ``kvprefetch-apply-*`` scratch that is not
    its own for a link, pass 13 b and 15 a require no ``kvprefetch-nvcc-probe-*`` /
    ``kvprefetch-doctor-*`` folder left there; in one shared folder they would meet, and act on,
    another worker's command running at the same moment."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    basetemp = config.getoption("basetemp", None)
    if not worker or not basetemp:
        return
    own = Path(basetemp).parent / f"tmp-{worker}"
    own.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(own)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = _gpu_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs an NVIDIA GPU: {reason}")
    for item in gpu_items:
        item.add_marker(skip)


# --------------------------------------------------------------------------- tmp_path in RAM

# A quick test's tmp_path lives on a RAM file system (/dev/shm) where one is offered with room to
# spare. Why: on the development and CI machines (Firecracker VMs, ext4 on a virtual disk),
# making a file costs about 0.5 ms of kernel time, and the integration tests make tens of
# thousands: copying a fetched work directory's two trees (6,863 files, 80 MB) took 4.5 s on
# the disk (3.6 s of it system time) against 0.3 s on /dev/shm, and the suite's quick tests make
# one such copy or a real `fetch` each, about 400 in all. The tests marked ``slow`` (builds,
# environments, the wheel: gigabytes) keep pytest's own tmp_path on the disk, and so do the
# session fixtures (tmp_path_factory). The kit runs the same on either file system; what
# differs is only how long the kernel takes to make a file.
RAM_TMP = Path("/dev/shm")
RAM_TMP_MIN_FREE_GB = 8  # the quick tests hold < 1 GB at once (3 workers x a ~150 MB copy)


def _ram_tmp_offered() -> bool:
    """Whether /dev/shm is a tmpfs with RAM_TMP_MIN_FREE_GB free (KVPREFETCH_TEST_RAM_TMP=0: no)."""
    if os.environ.get("KVPREFETCH_TEST_RAM_TMP", "1") == "0":
        return False
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        free = shutil.disk_usage(RAM_TMP).free
    except OSError:
        return False
    tmpfs = any(len(f) > 2 and f[1] == str(RAM_TMP) and f[2] == "tmpfs"
                for f in (line.split() for line in mounts))
    return tmpfs and free >= RAM_TMP_MIN_FREE_GB * 2**30


@pytest.fixture(scope="session")
def _ram_tmp_root() -> Iterator[Path | None]:
    """This process's own folder on /dev/shm (0700), or None where none is offered. Removed at
    the end when every test's folder in it was (a failed test's folder is kept, and named,
    until a later run's ``_sweep_ram_tmp``)."""
    if not _ram_tmp_offered():
        yield None
        return
    _sweep_ram_tmp()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    root = Path(tempfile.mkdtemp(prefix=f"kvprefetch-tests-{worker}-{os.getpid()}-",
                                 dir=RAM_TMP))
    yield root
    try:
        root.rmdir()
    except OSError:
        print(f"\nkept on {RAM_TMP}: the folders of failed tests in {root}", file=sys.stderr)


def _sweep_ram_tmp() -> None:
    """Remove the folders an earlier run left on /dev/shm (a failed test's, kept to be read, or
    a run killed before its end): ``kvprefetch-tests-<worker>-<pid>-*`` of this user whose
    process is gone. pytest keeps its own basetemps on the disk the same way, a few runs."""
    for folder in RAM_TMP.glob("kvprefetch-tests-*-*-*"):
        pid = folder.name.split("-")[3]
        try:
            if not pid.isdigit() or folder.lstat().st_uid != os.getuid() \
                    or not folder.is_dir() or folder.is_symlink():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            _remove(folder)
        except OSError:  # another user's process, or the folder went meanwhile
            continue


@pytest.fixture
def tmp_path(request: pytest.FixtureRequest, tmp_path: Path,
             _ram_tmp_root: Path | None) -> Iterator[Path]:
    """pytest's tmp_path, on /dev/shm for a test not marked ``slow`` (see RAM_TMP above). Kept
    when the test failed, as pyproject's retention policy keeps pytest's own."""
    if _ram_tmp_root is None or request.node.get_closest_marker("slow") is not None:
        yield tmp_path
        return
    name = re.sub(r"[\W]", "_", request.node.name)[:30]
    path = Path(tempfile.mkdtemp(prefix=name, dir=_ram_tmp_root))
    yield path
    report = getattr(request.node, "rep_call", None)
    if report is None or report.passed:
        _remove(path)


def _remove(path: Path) -> None:
    """rmtree, after giving back the search and write bits a test took from a folder (in RAM, a
    folder left behind stays until the machine restarts). Links are never followed. A folder
    thousands of levels deep (test_hostile_pass23_d's, kept when it failed) is more than Python
    3.11's os.walk and rmtree recurse through, and its RecursionError stopped every later run's
    sweep: GNU chmod and rm take it (never in a passing unit test, which starts no process)."""
    try:
        with contextlib.suppress(OSError):
            path.chmod(stat.S_IRWXU)
        for top, dirs, _files in os.walk(path):
            for name in dirs:
                sub = os.path.join(top, name)
                if not os.path.islink(sub):
                    with contextlib.suppress(OSError):
                        os.chmod(sub, stat.S_IRWXU)
        shutil.rmtree(path, ignore_errors=True)
    except RecursionError:
        for argv in (["chmod", "-R", "u+rwX", "--", str(path)],
                     ["rm", "-rf", "--one-file-system", "--", str(path)]):
            subprocess.run(argv, check=False, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep the call's report on the item, for tmp_path's teardown above."""
    report = yield
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report


# --------------------------------------------------------------------------- fixtures

# Variables that steer CUDA discovery or break interpreter isolation; tests that build child
# environments start from a copy of os.environ without them.
_STEERING_VARS = ("CUDA_HOME", "CUDA_PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP",
                  "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV",
                  "VLLM_USE_PRECOMPILED", "VLLM_PRECOMPILED_WHEEL_LOCATION")


@pytest.fixture
def base_environ() -> dict[str, str]:
    """A copy of this process's environment without CUDA/Python/vLLM steering variables."""
    return {k: v for k, v in os.environ.items() if k not in _STEERING_VARS}


@pytest.fixture
def make_fake_tool(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write an executable ``<tmp>/fakebin/<name>`` that prints ``text`` and exits 0.

    Only for toolkits that do not exist on the test machine (e.g. CUDA 12.6 when the machine
    has 13.0); every test that uses it says why the real tool is impossible there."""

    def make(name: str, text: str) -> Path:
        bindir = tmp_path / "fakebin"
        bindir.mkdir(exist_ok=True)
        tool = bindir / name
        body = "".join(f"echo '{line}'\n" for line in text.splitlines())
        tool.write_text(f"#!/bin/sh\n{body}exit 0\n")
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return tool

    return make


# What `nvcc --version` prints on a CUDA 12.6 Update 3 toolkit.
NVCC_12_6_TEXT = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2024 NVIDIA Corporation
Built on Tue_Oct_29_23:50:19_PDT_2024
Cuda compilation tools, release 12.6, V12.6.85
Build cuda_12.6.r12.6/compiler.35059454_0"""


@pytest.fixture
def nvcc_12_6_text() -> str:
    return NVCC_12_6_TEXT
