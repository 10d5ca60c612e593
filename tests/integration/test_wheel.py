"""The built wheel works on its own: ``pip wheel`` of this checkout, installed (not editable)
into a fresh venv, runs fetch -> apply -> a narrowed kernels-only build -> verify-kernel from a
directory that has nothing to do with the checkout. csrc/ and patches/ must come from the
wheel (``kvprefetch/data``), not from the source tree.

The fresh venv gets the test environment's packages (click, rich, GitPython, ninja, cuobjdump)
through a .pth line rather than from an index, so the test needs no network; the trees'
environments inherit this interpreter's torch with ``build --torch-from``, as scripts/main.sh's
do. Needs nvcc and the sdist (the ``vllm_sdist`` fixture); about as long as one narrowed build
of two trees."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from kvprefetch.machine.toolchain import find_nvcc
from tests.integration.helpers import NARROW_BUILD_ARGS

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(find_nvcc() is None, reason="no nvcc on this machine")]

REPO = Path(__file__).resolve().parents[2]
# What a wheel is built from: the checkout without its work products and caches (top-level
# names only: /build is a setuptools leftover).
TOP_LEVEL_SKIPS = {".git", ".venv", "build", "dist", "kvprefetch-work", ".carry", ".whl",
                   ".pytest_cache", ".mypy_cache", ".ruff_cache", "docs", "tests"}


def _not_sources(directory: str, names: list[str]) -> set[str]:
    top = Path(directory) == REPO
    return {n for n in names if (top and n in TOP_LEVEL_SKIPS) or n == "__pycache__"
            or n.endswith(".egg-info")}


def _run(argv: list[str | Path], *, cwd: Path, env: dict[str, str],
         timeout: float = 900) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=timeout, check=False)
    assert res.returncode == 0, f"{argv} exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
    return res


def test_the_wheel_runs_fetch_apply_build_verify_from_anywhere(
        tmp_path: Path, vllm_sdist: Path, base_environ: dict[str, str]) -> None:
    env = {k: v for k, v in base_environ.items() if k != "KVPREFETCH_WORKDIR"}
    src = tmp_path / "checkout"
    shutil.copytree(REPO, src, ignore=_not_sources)
    dist = tmp_path / "dist"
    # --no-build-isolation: this environment's setuptools builds it (no index needed)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", dist,
          src], cwd=tmp_path, env=env)
    wheel = next(dist.glob("kvprefetch-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for rel in ("csrc", "patches"):
        shipped = {n for n in names if n.startswith(f"kvprefetch/data/{rel}/")}
        tracked = {f"kvprefetch/data/{p.relative_to(REPO).as_posix()}"
                   for p in (REPO / rel).rglob("*") if p.is_file()}
        assert shipped == tracked, rel

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp_path, env=env)
    py = venv / "bin" / "python"
    _run([py, "-m", "pip", "install", "--no-deps", "--no-index", wheel], cwd=tmp_path, env=env)
    purelib = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                        cwd=tmp_path, env=env).stdout.strip())
    (purelib / "_test_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = ("import kvprefetch; from kvprefetch.upstream import kit_root; "
            "print(kvprefetch.__file__); print(kit_root())")
    where = _run([py, "-c", code], cwd=elsewhere, env=env)
    pkg_file, root = where.stdout.split()
    assert Path(pkg_file).is_relative_to(venv) and Path(root) == Path(pkg_file).parent / "data"

    k = venv / "bin" / "kvprefetch"
    w = ["--workdir", str(tmp_path / "work")]
    _run([k, "fetch", *w, "--source", vllm_sdist], cwd=elsewhere, env=env)
    _run([k, "apply", *w], cwd=elsewhere, env=env)
    _run([k, "build", *w, *NARROW_BUILD_ARGS, "--torch-from", sys.executable], cwd=elsewhere,
         env=env, timeout=1800)
    res = _run([k, "verify-kernel", *w, "--no-gpu", "--json"], cwd=elsewhere, env=env)
    report = json.loads(res.stdout)
    assert report["passed"] is True, res.stderr[-3000:]
    assert not (elsewhere / "kvprefetch-work").exists() and not list(elsewhere.iterdir())
