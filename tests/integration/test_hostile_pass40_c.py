"""Issue 41, the fortieth hostile pass (tester c): the record kinds and environment variables
the thirty-ninth did not reach, through the real CLI.

- ``report --formats png`` imports matplotlib, which makes its config and cache folders and
  writes its font cache (``matplotlib/fontlist-*.json``) by path where ``MPLCONFIGDIR``, else
  ``XDG_CONFIG_HOME``/``XDG_CACHE_HOME`` or ``HOME``, lead. ``XDG_CACHE_HOME`` through
  ``nobody``'s link in a shared sticky folder had the kit's process write in the folder the
  link chose (a link ``nobody`` can re-point at any folder of the user's between two runs):
  held to the rule of ``TMPDIR`` (``foreign.refuse_foreign_temp``, the thirty-ninth pass), in
  ``bench.render._refuse_foreign_mpl_folders``, before matplotlib is imported.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import kvprefetch_cli_split
from tests.integration.test_reliability import _env, outside, refused

NOBODY = 65534
__all__ = ["outside"]  # the fixture: nothing outside may change
RESULT = (Path(__file__).resolve().parents[2] / "docs" / "results"
          / "2026-12-01-h200-default-matrix" / "gemma-2b-fp16.json")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a link another user owns")
def test_matplotlibs_folders_through_another_users_link_are_refused(
        tmp_path: Path, outside: Path) -> None:
    pytest.importorskip("matplotlib")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    (shared / "cache").symlink_to(outside)
    os.lchown(shared / "cache", NOBODY, NOBODY)
    theirs = shared / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    home = tmp_path / "home"
    home.mkdir()
    base = {k: v for k, v in _env().items() if k not in ("MPLCONFIGDIR", "XDG_CONFIG_HOME")}
    out = tmp_path / "out"
    args = ("report", str(RESULT), "--out", str(out), "--formats", "png")
    for var, value, needle in (
            ("XDG_CACHE_HOME", str(shared / "cache"), "is a symlink that belongs to nobody"),
            ("HOME", str(shared / "cache"), "is a symlink that belongs to nobody"),
            ("MPLCONFIGDIR", str(theirs), "belongs to nobody")):
        env = base | {"HOME": str(home), var: value}
        res = kvprefetch_cli_split(*args, env=env, timeout=600)
        refused(res, 2, f"{var}=", needle, f"set {var} to a folder of your own")
        assert not (outside / "matplotlib").exists()
        assert not list(theirs.iterdir())
        assert not (out / "gemma-2b-fp16.png").exists()
    # the fix works: a cache folder of the user's own
    res = kvprefetch_cli_split(*args, env=base | {"HOME": str(home),
                                                  "XDG_CACHE_HOME": str(tmp_path / "mine")},
                               timeout=600)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert (out / "gemma-2b-fp16.png").is_file()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a link another user owns")
def test_uvs_cache_through_another_users_link_is_refused(
        tmp_path: Path, outside: Path, fetched_workdir: Path) -> None:
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if not os.path.exists(uv):
        pytest.skip("no uv")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "cache").symlink_to(outside)
    os.lchown(shared / "cache", NOBODY, NOBODY)
    home = tmp_path / "home"
    home.mkdir()
    base = {k: v for k, v in _env().items() if k not in ("UV_CACHE_DIR", "UV_NO_CACHE")}
    base |= {"HOME": str(home), "PATH": f"{Path(uv).parent}{os.pathsep}{base.get('PATH', '')}"}
    env = base | {"XDG_CACHE_HOME": str(shared / "cache")}
    # a kernels-only build with uv's environments: `uv venv` wrote its cache (CACHEDIR.TAG,
    # interpreter-v*/) in the folder nobody's link chose
    res = kvprefetch_cli_split("build", "--workdir", str(fetched_workdir), "--mode",
                               "kernels-only", "--env-backend", "uv", "--trees", "baseline",
                               "--head-sizes", "128", "--block-sizes", "16", "--kv-dtypes",
                               "fp16", env=env, timeout=600)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
    assert "XDG_CACHE_HOME=" in res.stderr and "belongs to nobody" in res.stderr, res.stderr
    assert "set XDG_CACHE_HOME to a folder of your own" in res.stderr, res.stderr
    assert not (outside / "uv").exists()
    # doctor names it too, and the fix works: a cache folder of the user's own
    args = ("doctor", "--workdir", str(fetched_workdir), "--mode", "overlay")
    refused(kvprefetch_cli_split(*args, env=env, timeout=600), 2, "XDG_CACHE_HOME=",
            "belongs to nobody")
    res = kvprefetch_cli_split(*args, env=base | {"XDG_CACHE_HOME": str(tmp_path / "mine")},
                               timeout=600)
    assert "belongs to" not in res.stderr and "Traceback" not in res.stderr, res.stderr
