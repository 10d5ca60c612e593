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
