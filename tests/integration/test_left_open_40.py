"""Items the fortieth hostile pass left open, closed by the lead (issue 41). Each test failed
before its fix:

- pip's cache (``PIP_CACHE_DIR``, ``$XDG_CACHE_HOME/pip``, ``~/.cache/pip``), written by path
  by the overlay's and the full build's ``pip install``, was not checked as uv's is: through a
  link of another user's it landed in the folder that user chose;
- a new work directory or campaign below a folder every user may write without the sticky bit
  (a root folder of 0777) was taken, though any user could rename it away and put their own,
  with its environments' ``python``, in its place.

Nothing is mocked: the overlay's install line is built as the overlay build builds it (running
pip would download here), and the work directory and campaign are made by the real CLI."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from kvprefetch.errors import ConfigError
from kvprefetch.overlay.install import install_argv
from tests.integration.test_reliability import cli, refused


def _nobody() -> int:
    if os.geteuid() != 0:
        pytest.skip("only root can plant a link as another user here")
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no user 'nobody' to own the link")


def test_pips_cache_through_another_users_link_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nobody = _nobody()
    shared, victim = tmp_path / "shared", tmp_path / "victim"
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)
    victim.mkdir()
    link = shared / "cache"
    link.symlink_to(victim)
    os.lchown(link, nobody, -1)
    monkeypatch.setenv("XDG_CACHE_HOME", str(link))
    monkeypatch.delenv("PIP_CACHE_DIR", raising=False)
    monkeypatch.delenv("PIP_NO_CACHE_DIR", raising=False)
    with pytest.raises(ConfigError) as exc:
        install_argv("venv", "/usr/bin/python3", None, "torch==2.8.0")
    assert "pip's cache" in exc.value.cause and "XDG_CACHE_HOME" in exc.value.fix
    own = tmp_path / "own-cache"
    own.mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(own))  # a folder of the user's own: as before
    assert install_argv("venv", "/usr/bin/python3", None, "torch==2.8.0")[1:4] == (
        "-m", "pip", "install")
    assert not any(victim.iterdir())


def test_a_new_work_directory_below_a_folder_everyone_may_write_is_refused(
        tmp_path: Path) -> None:
    open_ = tmp_path / "open"
    open_.mkdir()
    open_.chmod(0o777)
    for args in (["fetch", "--workdir", str(open_ / "work"), "--dry-run"],
                 ["slurm", "plan", str(open_ / "deeper" / "camp"), "--stand-in", "--no-gpu"]):
        refused(cli(*args, timeout=120), 2, "which every user may write and which has no sticky",
                "chmod +t")
    assert not any(open_.iterdir())
    open_.chmod(0o1777)  # the fix named: with the sticky bit, the plan is made
    res = cli("slurm", "plan", str(open_ / "camp"), "--stand-in", "--no-gpu", timeout=120)
    assert res.returncode == 0, res.stderr
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o2775)  # a folder its group may write: the team's, taken as before
    res = cli("slurm", "plan", str(team / "camp"), "--stand-in", "--no-gpu", timeout=120)
    assert res.returncode == 0, res.stderr
