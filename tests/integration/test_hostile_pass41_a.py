"""Issue 41, the forty-first hostile pass (tester a): every folder a child or a library writes
by path that the environment chooses, through the real CLI.

- ``report --formats png`` imports matplotlib in ``/`` (so that no ``matplotlibrc`` of the
  current folder is read), and matplotlib reads a relative ``MPLCONFIGDIR``/``XDG_CACHE_HOME``/
  ``HOME`` from there, while the pass-40 check read it from the user's folder: a relative one
  leading to ``nobody``'s link in ``/tmp`` had the font cache written in the folder the link
  chose. Now named absolute from the user's folder before both (``bench.render``).
- uv leaves a relative ``XDG_CACHE_HOME`` out and takes ``HOME``'s ``.cache/uv``; the check
  stopped at the relative one, so ``HOME`` through ``nobody``'s link went unchecked and ``uv
  venv`` wrote its cache through it (``machine.uvconfig.refuse_foreign_cache``).
- ``bench e2e`` runs vLLM, which appends ``usage_stats.json`` in ``$XDG_CONFIG_HOME/vllm``
  (and writes its and Triton's caches by path): no check at all
  (``bench.e2e_folders.refuse_foreign_vllm_folders``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import kvprefetch_cli_split
from tests.integration.test_reliability import _env, outside

NOBODY = 65534
__all__ = ["outside"]  # the fixture: nothing outside may change
RESULT = (Path(__file__).resolve().parents[2] / "docs" / "results"
          / "2026-12-01-h200-default-matrix" / "gemma-2b-fp16.json")
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0,
                               reason="needs root to make a link another user owns")


def _nobodys_link(shared: Path, name: str, target: Path) -> Path:
    shared.mkdir(exist_ok=True)
    shared.chmod(0o1777)  # like /tmp
    link = shared / name
    link.symlink_to(target)
    os.lchown(link, NOBODY, NOBODY)
    return link


@ROOT_ONLY
@pytest.mark.parametrize("var", ["MPLCONFIGDIR", "XDG_CACHE_HOME"])
def test_a_relative_matplotlib_folder_is_read_where_the_user_meant_it(
        tmp_path: Path, outside: Path, var: str) -> None:
    pytest.importorskip("matplotlib")
    link = _nobodys_link(tmp_path / "shared", "mpl", outside)
    if var == "XDG_CACHE_HOME":  # matplotlib adds `matplotlib`: the link is that folder
        link.rename(tmp_path / "shared" / "matplotlib")
        link = tmp_path / "shared"
    home = tmp_path / "home"
    home.mkdir()
    here = tmp_path / "here"
    here.mkdir()
    # a relative value read from `/` leads to nobody's link; from `here`, to nothing
    relative = os.path.relpath(link, "/")
    base = {k: v for k, v in _env().items()
            if k not in ("MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME")}
    out = tmp_path / "out"
    res = kvprefetch_cli_split("report", str(RESULT), "--out", str(out), "--formats", "png",
                               env=base | {"HOME": str(home), var: relative}, cwd=here,
                               timeout=600)
    assert "Traceback" not in res.stderr, res.stderr
    # without the fix: rc 0 and matplotlib's fontlist-*.json in the folder nobody's link chose
    assert not list(outside.glob("fontlist-*")), sorted(p.name for p in outside.iterdir())
    assert res.returncode == 0, res.stderr
    assert (out / "gemma-2b-fp16.png").is_file()
    made = here / relative
    assert list(made.rglob("fontlist-*")), res.stderr  # where the user meant it


@ROOT_ONLY
def test_uvs_cache_through_home_is_checked_when_xdg_cache_home_is_relative(
        tmp_path: Path, outside: Path, fetched_workdir: Path) -> None:
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if not os.path.exists(uv):
        pytest.skip("no uv")
    link = _nobodys_link(tmp_path / "shared", "home", outside)
    base = {k: v for k, v in _env().items() if k not in ("UV_CACHE_DIR", "UV_NO_CACHE")}
    base |= {"PATH": f"{Path(uv).parent}{os.pathsep}{base.get('PATH', '')}"}
    env = base | {"HOME": str(link), "XDG_CACHE_HOME": "rel"}
    res = kvprefetch_cli_split("build", "--workdir", str(fetched_workdir), "--mode",
                               "kernels-only", "--env-backend", "uv", "--trees", "baseline",
                               "--head-sizes", "128", "--block-sizes", "16", "--kv-dtypes",
                               "fp16", env=env, timeout=600)
    assert "Traceback" not in res.stderr, res.stderr
    # without the fix: `uv venv` made .cache/uv (CACHEDIR.TAG, interpreter-v*/) outside
    assert not (outside / ".cache").exists(), sorted(p.name for p in outside.iterdir())
    assert res.returncode != 0, res.stderr  # the build's family wraps it
    assert "HOME=" in res.stderr and "belongs to nobody" in res.stderr, res.stderr
    assert "set HOME to a folder of your own" in res.stderr, res.stderr


def _usage_writing_vllm(folder: Path) -> Path:
    """A stand-in for an environment's python with vLLM: prints a version, appends a usage
    record in ``$XDG_CONFIG_HOME/vllm`` as vLLM 0.10.2 does at every engine start, and writes a
    throughput result where --output-json says."""
    py = folder / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text("#!/bin/bash\n"
                  '[ "$1" = -I ] && shift\n'
                  'if [ "$1" = -c ]; then echo 0.10.2; exit 0; fi\n'
                  'c="${VLLM_CONFIG_ROOT:-${XDG_CONFIG_HOME:-$HOME/.config}/vllm}"\n'
                  'mkdir -p "$c" && echo "{}" >> "$c/usage_stats.json"\n'
                  'while [ $# -gt 0 ]; do [ "$1" = --output-json ] && f=$2; shift; done\n'
                  "echo '{\"tokens_per_second\": 100.0, \"num_requests\": 10, "
                  "\"elapsed_time\": 1.0}' > \"$f\"\n")
    py.chmod(0o755)
    return py


@ROOT_ONLY
@pytest.mark.parametrize("var", ["XDG_CONFIG_HOME", "VLLM_CONFIG_ROOT", "HOME"])
def test_bench_e2e_refuses_vllms_folders_that_another_user_chose(
        tmp_path: Path, outside: Path, var: str) -> None:
    wd = tmp_path / "work"
    (wd / "verify").mkdir(parents=True)
    py = str(_usage_writing_vllm(wd / "envs" / "baseline"))
    (wd / "verify" / "report.json").write_text(json.dumps({
        "passed": True, "envs": {"baseline": {"python": py}, "patched": {"python": py}}}))
    link = _nobodys_link(tmp_path / "shared", "cfg", outside)
    home = tmp_path / "home"
    home.mkdir()
    base = {k: v for k, v in _env().items() if k not in (
        "XDG_CONFIG_HOME", "VLLM_CONFIG_ROOT", "XDG_CACHE_HOME", "VLLM_CACHE_ROOT",
        "TRITON_CACHE_DIR", "TRITON_HOME")}
    env = base | {"HOME": str(home), var: str(link)}
    args = ("bench", "e2e", "--workdir", str(wd), "--max-num-seqs", "1", "--repeats", "1",
            "--formats", "json")
    res = kvprefetch_cli_split(*args, env=env, timeout=600)
    assert "Traceback" not in res.stderr, res.stderr
    # without the fix: rc 0 and vllm/usage_stats.json appended in the folder the link chose
    assert not list(outside.rglob("usage_stats.json")), sorted(outside.rglob("*"))
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{var}=" in res.stderr and "belongs to nobody" in res.stderr, res.stderr
    assert f"set {var} to a folder of your own" in res.stderr, res.stderr
    # the fix works: a folder of the user's own
    res = kvprefetch_cli_split(*args, env=base | {"HOME": str(home)}, timeout=600)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stdout + res.stderr
    assert (home / ".config" / "vllm" / "usage_stats.json").is_file()
