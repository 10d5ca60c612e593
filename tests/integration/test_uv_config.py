"""The kit's uv reads the configuration the user chose, never a ``uv.toml`` above its working
folder (issue 41: the twenty-eighth hostile pass left it open, and the lead closed it). uv
looks for ``uv.toml`` in its working folder and every folder above; the kit starts uv in an
empty folder of its own in TMPDIR, so a ``/tmp/uv.toml`` of any local user's named the index
and cache of the overlay environments. Here TMPDIR is ``<tmp>/above/t`` and a broken
``<tmp>/above/uv.toml`` is planted: uv fails on it wherever it reads it. Real uv (the one in
the kit's ``test`` extra), a real ``uv venv``, ``uv pip install`` and ``uv cache dir``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvprefetch.overlay.install import find_uv

SCRIPT = r"""
import json, os, sys
import kvprefetch.workspace.ownership  # the runner's private folders, as every command has
from kvprefetch.doctor.estimates import shares_one_install
from kvprefetch.machine.envs import make_env
from kvprefetch.machine.uvconfig import uv_config_args
from kvprefetch.overlay.install import find_uv, install_argv
from kvprefetch.runner import NEUTRAL_CWD, run

out = sys.argv[1]
uv = find_uv()
env = make_env("uv", os.path.join(out, "env"), python=sys.executable, uv=uv)
env.create()
empty = os.path.join(out, "empty.txt")
open(empty, "w").close()
argv = install_argv("uv", str(env.python), uv, "-r", empty, extra=("--offline", "--dry-run"))
installed = run(list(argv), env=dict(os.environ), echo=False, check=False, cwd=NEUTRAL_CWD)
cache = run([uv, *uv_config_args(os.environ), "cache", "dir"], env=dict(os.environ),
            echo=False, check=False, cwd=NEUTRAL_CWD)
print(json.dumps({"install": [installed.returncode, installed.output[-2000:]],
                  "cache": [cache.returncode, cache.output.strip()],
                  "shares": shares_one_install("uv", __import__("pathlib").Path(out), os.environ)}))
"""


def _run(tmp_path: Path, home: Path, *, cache_env: bool = True) -> dict:
    top = tmp_path / "above"
    (top / "t").mkdir(parents=True)
    (top / "uv.toml").write_text("this is [ not toml\n")  # anyone's, above the kit's TMPDIR
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("UV_", "XDG_CONFIG")) and k != "VIRTUAL_ENV"}
    env.update(TMPDIR=str(top / "t"), HOME=str(home),
               PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]))
    if cache_env:
        env["UV_CACHE_DIR"] = str(tmp_path / "uv-cache")
    (tmp_path / "out").mkdir()
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "out")], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    data: dict = json.loads(res.stdout.splitlines()[-1])
    return data


@pytest.fixture(autouse=True)
def _needs_uv() -> None:
    if find_uv() is None:
        pytest.skip("uv is not installed (the kit's `test` extra installs it)")


def test_a_uv_toml_above_the_kits_temp_folder_is_never_read(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    data = _run(tmp_path, home)  # the env was made (uv venv read no uv.toml), else rc != 0
    assert data["install"][0] == 0, data["install"][1]
    assert data["cache"] == [0, str(tmp_path / "uv-cache")]
    assert "unknown" not in data["shares"][1], data["shares"]


def test_the_users_own_uv_toml_is_still_read(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".config" / "uv").mkdir(parents=True)
    users = tmp_path / "users-cache"
    (home / ".config" / "uv" / "uv.toml").write_text(f'cache-dir = "{users}"\n')
    data = _run(tmp_path, home, cache_env=False)
    assert data["install"][0] == 0, data["install"][1]
    assert data["cache"] == [0, str(users)]


@pytest.mark.parametrize("value", ["1", "true", "YES", "on", "y", "T"])
def test_uv_no_config_as_uv_reads_it_names_no_file(tmp_path: Path, value: str) -> None:
    """``UV_NO_CONFIG`` in each spelling uv takes for yes: the kit passes uv no configuration
    option, so uv reads none, where for ``y`` and ``t`` the kit named the user's own ``uv.toml``
    though the user had asked for none (issue 41, the thirtieth hostile pass, found and left
    open by its tester a; closed by the lead)."""
    from kvprefetch.machine.uvconfig import uv_config_args

    (tmp_path / "uv").mkdir()
    (tmp_path / "uv" / "uv.toml").write_text('index-url = "https://example.invalid/simple"\n')
    env = {"XDG_CONFIG_HOME": str(tmp_path), "XDG_CONFIG_DIRS": str(tmp_path / "none")}
    assert uv_config_args(env) == ["--config-file", str(tmp_path / "uv" / "uv.toml")]
    assert uv_config_args({**env, "UV_NO_CONFIG": value}) == []
