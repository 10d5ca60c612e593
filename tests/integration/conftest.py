"""Fixtures of the integration layer: the real vLLM 0.10.2 sdist, fetched work directories, a
local git repository tagged v0.10.2, and one real kernels-only build of both trees (killed
mid-compile, resumed, then found up to date). The helpers they share with the tests are in
tests/integration/helpers.py; how these fixtures are built once under pytest-xdist is in
tests/integration/sharing.py."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import _STEERING_VARS
from tests.integration.helpers import (
    NARROW_BUILD_ARGS,
    SDIST_CACHE_ENV,
    _kill_session,
    copy_workdir,
    kvprefetch_cli,
    seed_downloads,
)
from tests.integration.sharing import assign_groups, shared_once


@pytest.hookimpl(trylast=True)  # after --deselect and -k; see sharing.py
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if getattr(config.option, "loadgroup", False):
        assign_groups(items)


@pytest.fixture(scope="session")
def vllm_sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The verified vllm-0.10.2.tar.gz, downloaded at most once per test run.

    Cache: $KVPREFETCH_TEST_CACHE if set (kept between runs), else a pytest temp dir. When the
    cache is empty the sdist is downloaded for real by kvprefetch.sources.download.ensure_sdist
    (PIP_INDEX_URL / pip config / PyPI, sha256-checked; about 3 s here). No local shortcut: the
    development machine takes the same path as a fresh CI machine."""
    from kvprefetch.sources.download import ensure_sdist

    cache_env = os.environ.get(SDIST_CACHE_ENV)

    def build(folder: Path) -> str:
        cache = Path(cache_env) if cache_env else folder
        cache.mkdir(parents=True, exist_ok=True)
        return str(ensure_sdist(cache))

    return Path(shared_once(tmp_path_factory, "sdist-cache", build))


@pytest.fixture(scope="session")
def fetched_template(tmp_path_factory: pytest.TempPathFactory, vllm_sdist: Path) -> Path:
    """A work directory made ONCE by the real `fetch --source sdist` path (sha256 check, unpack,
    pristine-header check, two independent trees) -- copied, never modified, by the tests. Made
    once for the whole run, xdist's workers included (sharing.shared_once)."""
    from kvprefetch.sources.fetch import fetch_trees

    def build(folder: Path) -> str:
        wd = folder / "work"
        seed_downloads(wd, vllm_sdist)
        fetch_trees(wd, source="sdist")
        return str(wd)

    return Path(shared_once(tmp_path_factory, "fetched", build))


@pytest.fixture(scope="session")
def vllm_tree(fetched_template: Path) -> Path:
    """vLLM 0.10.2's own sources as `fetch --source sdist` unpacked them (the session's
    `baseline` tree: read, never modified), for tests that compare with vLLM's code."""
    return fetched_template / "trees" / "baseline"


@pytest.fixture
def fetched_workdir(tmp_path: Path, fetched_template: Path) -> Path:
    """A private copy of the fetched work directory (trees baseline and patched)."""
    return copy_workdir(fetched_template, tmp_path / "work")


@pytest.fixture(scope="session")
def vllm_git_repo(tmp_path_factory: pytest.TempPathFactory,
                  fetched_template: Path) -> tuple[Path, str]:
    """A real local git repository made from the unpacked sdist and tagged v0.10.2 (with
    GitPython). Its tag commit is necessarily not upstream's 26b999c71. Returns (path, sha).
    Made once for the whole run (sharing.shared_once): the tests only read it."""
    path_s, sha = shared_once(tmp_path_factory, "vllm-git",
                              lambda folder: _make_git_repo(folder / "vllm", fetched_template))
    return Path(path_s), sha


def _make_git_repo(path: Path, fetched_template: Path) -> tuple[str, str]:
    import shutil

    import git

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
    return str(path), sha


KILL_AFTER_COMPILING_S = 480.0
OBJECT_SETTLE_S = 5.0


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


@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[list[Path]]:
    """Every mount made below ``tmp_path`` (a test appends what it mounts) is taken down
    afterwards, wherever it is now (clean renames a folder aside before it removes it, and a
    mount below moves with it)."""
    import subprocess

    made: list[Path] = []
    yield made
    with open("/proc/self/mounts", encoding="utf-8") as f:
        points = [line.split()[1] for line in f]
    for m in reversed([p for p in points if p.startswith(f"{tmp_path}/")]):
        subprocess.run(["umount", "-l", m], check=False)
