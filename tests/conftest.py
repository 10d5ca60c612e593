"""Shared test fixtures and the ``gpu`` marker skip.

``gpu``-marked tests are skipped, with the reason, where torch is missing or sees no CUDA
device. torch is imported only when at least one collected test carries the marker, so the
fast unit tests never pay for it."""

from __future__ import annotations

import os
import stat
import sys
import warnings
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import pytest


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


# --------------------------------------------------------------------------- fixtures for the
# sources / patch / build / verify tests: the real vLLM 0.10.2 sdist, fetched work directories,
# a local git repository tagged v0.10.2, and one real kernels-only build of both trees.

from typing import Any  # appended section: kept apart from the fixtures above

SDIST_CACHE_ENV = "KVPREFETCH_TEST_CACHE"


def kvprefetch_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
                   timeout: float | None = 600) -> Any:
    """Run ``python -m kvprefetch ARGS`` through the kit's own runner; never raises on a
    non-zero exit (tests look at ``returncode`` and ``output``: stdout and stderr merged)."""
    from kvprefetch.runner import run

    return run([sys.executable, "-m", "kvprefetch", *args], cwd=cwd, env=env, echo=False,
               check=False, timeout=timeout)


def kvprefetch_cli_split(*args: str, env: dict[str, str] | None = None,
                         timeout: float = 600, cwd: Path | None = None) -> Any:
    """Like kvprefetch_cli but with stdout and stderr apart (for --json parsing and checking
    that notices go to stderr). Uses subprocess directly because the runner merges the two."""
    import subprocess

    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=False)


def tree_bytes(root: Path) -> dict[str, str]:
    """sha256 of EVERY file and symlink target under ``root`` (nothing skipped), for
    "byte-identical afterwards" checks; unlike kvprefetch.hashing.inventory it includes state,
    locks, build outputs and dot-files."""
    import hashlib

    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames + [d for d in dirnames if Path(dirpath, d).is_symlink()]):
            p = Path(dirpath, name)
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        for d in dirnames:
            if not any(Path(dirpath, d).iterdir()):
                out[Path(dirpath, d).relative_to(root).as_posix() + "/"] = "empty dir"
    return out


@pytest.fixture(scope="session")
def vllm_sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The verified vllm-0.10.2.tar.gz, downloaded at most once per test run.

    Cache: $KVPREFETCH_TEST_CACHE if set (kept between runs), else a pytest temp dir. When the
    cache is empty the sdist is downloaded for real by kvprefetch.sources.download.ensure_sdist
    (PIP_INDEX_URL / pip config / PyPI, sha256-checked; about 3 s here). No local shortcut: the
    development machine takes the same path as a fresh CI machine."""
    from kvprefetch.sources.download import ensure_sdist

    cache_env = os.environ.get(SDIST_CACHE_ENV)
    cache = Path(cache_env) if cache_env else tmp_path_factory.mktemp("sdist-cache")
    cache.mkdir(parents=True, exist_ok=True)
    return ensure_sdist(cache)


def seed_downloads(workdir: Path, sdist: Path) -> None:
    """Put a copy of the cached sdist where ``fetch --source sdist`` looks first, so the test
    exercises the real verify + unpack path without a second download. The directory is
    tagged as a kvprefetch work directory, as an earlier `fetch` that downloaded the sdist
    would have left it: fetch refuses to take over a non-empty directory it did not create."""
    import shutil

    from kvprefetch.workspace.workdir import Workdir

    Workdir(workdir).ensure()
    (workdir / "downloads").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(sdist, workdir / "downloads" / sdist.name)


@pytest.fixture(scope="session")
def fetched_template(tmp_path_factory: pytest.TempPathFactory, vllm_sdist: Path) -> Path:
    """A work directory made ONCE by the real `fetch --source sdist` path (sha256 check, unpack,
    pristine-header check, two independent trees) -- copied, never modified, by the tests."""
    from kvprefetch.sources.fetch import fetch_trees

    wd = tmp_path_factory.mktemp("fetched") / "work"
    seed_downloads(wd, vllm_sdist)
    fetch_trees(wd, source="sdist")
    return wd


@pytest.fixture(scope="session")
def vllm_tree(fetched_template: Path) -> Path:
    """vLLM 0.10.2's own sources as `fetch --source sdist` unpacked them (the session's
    `baseline` tree: read, never modified), for tests that compare with vLLM's code."""
    return fetched_template / "trees" / "baseline"


def copy_workdir(template: Path, dest: Path) -> Path:
    """A private copy of a fetched work directory. The trees, state and everything a test may
    edit are real copies; pristine/ and downloads/, which no test writes into (they are only
    read, or removed whole by `clean`), are hard links to save copying ~3000 files per test."""
    import shutil

    shared = ("pristine", "downloads")
    shutil.copytree(template, dest, symlinks=True,
                    ignore=lambda d, names: [n for n in names if Path(d) == template and n in shared])
    for name in shared:
        if (template / name).is_dir():
            shutil.copytree(template / name, dest / name, symlinks=True, copy_function=os.link)
    return dest


@pytest.fixture
def fetched_workdir(tmp_path: Path, fetched_template: Path) -> Path:
    """A private copy of the fetched work directory (trees baseline and patched)."""
    return copy_workdir(fetched_template, tmp_path / "work")


@pytest.fixture(scope="session")
def vllm_git_repo(tmp_path_factory: pytest.TempPathFactory, fetched_template: Path) -> tuple[Path, str]:
    """A real local git repository made from the unpacked sdist and tagged v0.10.2 (with
    GitPython). Its tag commit is necessarily not upstream's 26b999c71. Returns (path, sha)."""
    import shutil

    import git

    path = tmp_path_factory.mktemp("vllm-git") / "vllm"
    shutil.copytree(fetched_template / "pristine" / "sdist", path, symlinks=True)
    repo = git.Repo.init(path)
    who = {"GIT_AUTHOR_NAME": "kvprefetch tests", "GIT_AUTHOR_EMAIL": "tests@kvprefetch.invalid",
           "GIT_COMMITTER_NAME": "kvprefetch tests",
           "GIT_COMMITTER_EMAIL": "tests@kvprefetch.invalid",
           "GIT_AUTHOR_DATE": "2025-09-13T00:00:00Z", "GIT_COMMITTER_DATE": "2025-09-13T00:00:00Z"}
    with repo.git.custom_environment(**who):
        repo.git.add("-A", "-f")
        repo.git.commit("-q", "-m", "vLLM 0.10.2 from the PyPI sdist", "--no-gpg-sign")
        repo.git.tag("v0.10.2")
    sha = repo.head.commit.hexsha
    repo.close()
    return path, sha


# The one real kernels-only build of the test run: narrowed instantiation set (4 kernels per
# launcher source), baseline + patched, compiled for sm_90 with the machine's nvcc.
NARROW_BUILD_ARGS = ("--kernels-only", "--arch", "9.0a", "--head-sizes", "128",
                     "--block-sizes", "16", "--kv-dtypes", "fp16,fp32")
KILL_AFTER_COMPILING_S = 480.0
OBJECT_SETTLE_S = 5.0


def _session_pids(sid: int) -> list[int]:
    """Live processes in session ``sid`` (the build we started with start_new_session)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat_text = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat_text.rsplit(")", 1)[1].split()
        if int(fields[3]) == sid and fields[0] != "Z":  # fields[3] = session id
            pids.append(int(d.name))
    return pids


def _kill_session(sid: int) -> int:
    """SIGKILL every process of the session we started (by pid, never by name). Returns how
    many processes were still alive outside the build's own process group when it was killed."""
    import signal
    import time

    try:
        os.killpg(sid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    time.sleep(0.2)
    # ninja starts each compiler in its own process group, so killing ours leaves them running
    # (they would finish and rename their .o); a machine losing power or a terminal closing
    # takes them too, so take them here: every process of the session, by pid.
    leftovers = _session_pids(sid)
    for pid in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 30
    while _session_pids(sid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return len(leftovers)


class KernelsBuild:
    """What the session's real build did, step by step, for test_kernels_build / test_verify."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.argv: list[str] = []
        self.interrupted: dict[str, Any] = {}
        self.after_kill: dict[str, Any] = {}
        self.resumed: dict[str, Any] = {}
        self.third: dict[str, Any] = {}


def _objects(workdir: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime_ns for p in sorted(workdir.glob("build/*/*/*.o"))}


@pytest.fixture(scope="session")
def kernels_build(tmp_path_factory: pytest.TempPathFactory, fetched_template: Path) -> KernelsBuild:
    """fetch (sdist) -> apply -> `kvprefetch build --kernels-only ...` for real, through the CLI
    in a subprocess: the first run is killed (SIGKILL to its whole session) once an object exists
    in every tree (the first launcher's .cuda.o, given a few seconds for ninja to record it;
    killing then loses only the object in progress and leaves finished ones for the rerun to
    keep) or, at the latest, after 480 s of compiling (a safety net for a loaded machine). The same
    command is then rerun to completion, and a third time (which must find everything up to
    date)."""
    import json
    import shutil
    import subprocess
    import time

    from kvprefetch.sources.fetch import tree_modifications
    from kvprefetch.workspace.workdir import Workdir

    wd = tmp_path_factory.mktemp("kernels-build") / "work"
    shutil.copytree(fetched_template, wd, symlinks=True)
    res = kvprefetch_cli("apply", "--workdir", str(wd))
    assert res.returncode == 0, res.output
    kb = KernelsBuild(wd)
    env = {k: v for k, v in os.environ.items() if k not in _STEERING_VARS}
    kb.argv = [sys.executable, "-m", "kvprefetch", "build", "--workdir", str(wd),
               *NARROW_BUILD_ARGS]

    # 1. start, then kill mid-compile
    log1 = wd.parent / "run1.log"
    t0 = time.monotonic()
    with open(log1, "w") as lf:
        proc = subprocess.Popen(kb.argv, stdout=lf, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        compiling_since = None
        objects_since = None
        reason = "timeout"
        while proc.poll() is None and time.monotonic() - t0 < 900:
            now = time.monotonic()
            if compiling_since is None and list(wd.glob("build/*/*/logs/*compile.log")):
                compiling_since = now
            trees_with_object = {p.parts[-3] for p in wd.glob("build/*/*/*.o")}
            if objects_since is None and trees_with_object >= {"baseline", "patched"}:
                objects_since = now
            # a few seconds after every tree has a finished object, so that ninja has recorded
            # it (an object renamed into place but not yet in .ninja_log is rightly rebuilt)
            if objects_since is not None and now - objects_since > OBJECT_SETTLE_S:
                reason = "every tree has a finished object"
                break
            if compiling_since is not None and now - compiling_since > KILL_AFTER_COMPILING_S:
                reason = f"{KILL_AFTER_COMPILING_S:.0f} s of compiling"
                break
            time.sleep(0.5)
        finished_by_itself = proc.poll() is not None
        orphans = _kill_session(proc.pid)
        rc = proc.wait()
    kb.interrupted = {"returncode": rc, "finished_by_itself": finished_by_itself,
                      "reason": reason, "seconds": round(time.monotonic() - t0, 1),
                      "compiling_seconds": (round(time.monotonic() - compiling_since, 1)
                                            if compiling_since else None),
                      "orphaned_processes": orphans, "objects": _objects(wd),
                      "log": log1.read_text()}

    # 2. state right after the kill: trees untouched, envs usable
    wdo = Workdir(wd)
    kb.after_kill["tree_modifications"] = {t: tree_modifications(wdo, t)
                                           for t in ("baseline", "patched")}
    pys = {}
    for t in ("baseline", "patched"):
        py = wd / "envs" / t / "bin" / "python"
        r = subprocess.run([str(py), "-c", "import sys; print(sys.prefix)"], capture_output=True,
                           text=True, env=env, cwd="/", check=False) if py.exists() else None
        pys[t] = {"exists": py.exists(), "returncode": r.returncode if r else None,
                  "prefix": r.stdout.strip() if r else None}
    kb.after_kill["env_python"] = pys
    kb.after_kill["manifests"] = sorted(str(p) for p in wd.glob("build/*/*/manifest.json"))

    # 3. the same command again: resumes and completes
    t1 = time.monotonic()
    r2 = subprocess.run(kb.argv, capture_output=True, text=True, env=env, timeout=1500, check=False)
    kb.resumed = {"returncode": r2.returncode, "stdout": r2.stdout, "stderr": r2.stderr,
                  "seconds": round(time.monotonic() - t1, 1), "objects": _objects(wd)}

    # 4. and once more: everything up to date, nothing recompiled
    t2 = time.monotonic()
    r3 = subprocess.run(kb.argv, capture_output=True, text=True, env=env, timeout=600, check=False)
    kb.third = {"returncode": r3.returncode, "stdout": r3.stdout, "stderr": r3.stderr,
                "seconds": round(time.monotonic() - t2, 1), "objects": _objects(wd)}
    # a summary next to the work directory, for whoever reads the timings
    summary = {k: {kk: vv for kk, vv in v.items() if kk not in ("log", "stdout", "stderr")}
               for k, v in (("interrupted", kb.interrupted), ("resumed", kb.resumed),
                            ("third", kb.third))}
    (wd.parent / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return kb
