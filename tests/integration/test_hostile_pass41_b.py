"""Issue 41, the forty-first hostile pass (tester b): the fortieth pass's new checks as a user
meets them, through the real CLI.

- ``report --formats png`` imports matplotlib in ``/`` (a ``matplotlibrc`` FIFO in the current
  folder hung it: the twenty-sixth pass), and matplotlib makes a relative ``MPLCONFIGDIR``,
  ``XDG_CACHE_HOME`` or ``HOME`` there: ``MPLCONFIGDIR=mpl`` made ``/mpl`` and wrote its font
  cache in it, while ``bench.render._refuse_foreign_mpl_folders`` looked at ``./mpl``. A relative
  folder is named absolute from the user's folder now (pass 41 a's fix, as the lead merged them).
- ``foreign.refuse_foreign_temp`` called a folder writable by its owner's private group
  (``umask 002``: ``mkdir -p ~/work/tmp`` makes 0775 folders) "written by others", and refused
  such a ``TMPDIR`` (the fortieth pass looked at the folders above it too).
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
from pathlib import Path

import pytest

from tests.integration.helpers import kvprefetch_cli_split
from tests.integration.test_reliability import _env, outside, refused

__all__ = ["outside"]  # the fixture: nothing outside may change
RESULT = (Path(__file__).resolve().parents[2] / "docs" / "results"
          / "2026-12-01-h200-default-matrix" / "gemma-2b-fp16.json")


def test_a_relative_matplotlib_folder_is_read_from_the_users_folder_not_made_in_the_root(
        tmp_path: Path, outside: Path) -> None:
    """Merged with pass 41 a's fix (the lead): a relative folder is named absolute from the
    user's folder, where the user meant it, rather than refused."""
    pytest.importorskip("matplotlib")
    name = f"kvprefetch-p41b-mpl-{os.getpid()}"
    made = Path("/", name)
    here = tmp_path / "here"
    here.mkdir()
    out = tmp_path / "out"
    args = ("report", str(RESULT), "--out", str(out), "--formats", "png")
    base = {k: v for k, v in _env().items()
            if k not in ("MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME")}
    try:
        for var in ("MPLCONFIGDIR", "XDG_CACHE_HOME", "HOME"):
            res = kvprefetch_cli_split(*args, env=base | {var: name}, cwd=here, timeout=600)
            assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
            assert not made.exists(), f"{var}={name} made {made}"
            assert (here / name).is_dir(), f"{var}={name}: nothing made in the user's folder"
            assert (out / "gemma-2b-fp16.png").is_file()
    finally:
        if made.is_dir() and not made.is_symlink():
            shutil.rmtree(made)


def _private_group() -> bool:
    me = pwd.getpwuid(os.geteuid())
    group = grp.getgrgid(me.pw_gid)
    return group.gr_name == me.pw_name and set(group.gr_mem) <= {me.pw_name}


@pytest.mark.skipif(not _private_group(), reason="needs a user whose group is their own")
def test_a_tmpdir_under_folders_of_the_users_private_group_is_taken(
        tmp_path: Path, outside: Path) -> None:
    old = os.umask(0o002)
    try:
        tmp = tmp_path / "work" / "tmp"
        tmp.mkdir(parents=True)
        (tmp_path / "work").chmod(0o775)
        tmp.chmod(0o775)
    finally:
        os.umask(old)
    assert os.stat(tmp).st_gid == os.getegid()
    env = _env() | {"TMPDIR": str(tmp)}
    res = kvprefetch_cli_split("doctor", "--mode", "kernels-only", "--workdir",
                               str(tmp_path / "wd"), env=env, timeout=600)
    assert "can be written by others" not in res.stderr + res.stdout, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    # writable by every user: still refused
    tmp_path.joinpath("work").chmod(0o777)
    res = kvprefetch_cli_split("doctor", "--mode", "kernels-only", "--workdir",
                               str(tmp_path / "wd"), env=env, timeout=600)
    refused(res, 2, "no sticky bit")  # the rule for folders above, or TMPDIR's own
