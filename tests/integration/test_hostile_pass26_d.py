"""Issue 41, the twenty-sixth hostile pass (tester d: the generated job scripts on a node, their
environment, and first the job's own ``HOME`` with the pip index submit now sends as
``PIP_INDEX_URL``). Each test fails without its fix (checked by reverting ``src`` and running
it):

- Submit (and resubmit, dry runs too) now asks the user's pip for its index, ``python -m pip
  config get global.index-url``, run from ``/`` (``runner.NEUTRAL_CWD``). ``python -m`` puts its
  working folder first on ``sys.path``, so with the campaign at ``/pip`` (a folder of ``/``, as
  pass 24's ``/kvprefetch``: a mount namespace and chroot here) the ``__init__.py`` whoever
  writes the campaign put there ran, as the user, in ``slurm submit --dry-run`` (1 run of 1).
  ``fetch --workdir /pip`` asks the same. Now the kit's own interpreter is told to put no
  working folder on ``sys.path`` (``-P``; ``-I`` on Python 3.10), and gets ``PYTHONPATH``
  less its empty and relative entries: with ``-P`` alone, ``PYTHONPATH=<kit>:`` (an empty
  entry, the working folder) still ran the campaign's file. (Since pass 27 a, every child
  given ``runner.NEUTRAL_CWD`` starts in an empty folder of its own, which covers both.)
- The same pip run had no time limit: a pip configuration file that is a FIFO
  (``PIP_CONFIG_FILE``, or a ``pip.conf`` planted where a ``HOME`` folder of pip's holds the
  campaign) had ``slurm submit --dry-run`` wait for good (killed after 30 s, 1 run of 1), and
  ``/dev/zero`` read until memory ran out (4 GB in 38 s, then PyPI was sent silently). Now it
  is stopped after ``download.PIP_CONFIG_TIMEOUT_S`` and submit says which files to check.
- The same pip run took every ``PIP_*`` of the submitting shell: ``PIP_VERBOSE=1`` printed
  pip's list of files before the URL, ``PIP_QUIET=1`` printed nothing, and a value pip refuses
  (``PIP_NO_CACHE_DIR=maybe``) printed its usage, so submit sent PyPI to every job in place
  of the mirror the user's ``pip.conf`` names, silently (1 run of 1 each), and the prepare job
  behind a firewall would say to check the network (wrong way). Before the job's own
  ``HOME``, the job asked pip itself with only the passed names, none of these. Now pip is
  asked with ``PIP_CONFIG_FILE`` alone of its settings.

Slurm is absent here: submit runs with a stand-in sbatch on ``PATH``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass20_d import _SRC, _plan
from tests.integration.test_hostile_pass24_d import chroot_runner
from tests.integration.test_job_home import _env_sbatch, _submit
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


@pytest.mark.parametrize("tail", ["", ":"])
def test_submits_pip_never_imports_a_campaign_in_the_root_folder(
        tmp_path: Path, outside: Path, tail: str) -> None:
    """The campaign at ``/pip`` (a private mount namespace and a chroot whose ``/pip`` is a
    bind mount of a folder here; nothing outside this test's folder is touched), planned
    there; whoever writes it puts an ``__init__.py`` and ``__main__.py`` in it. ``slurm submit
    --dry-run`` with no ``PIP_INDEX_URL`` asks pip for the index: pip is the user's, never
    the campaign's file; also with an empty entry in ``PYTHONPATH`` (``tail``), which is the
    child's working folder."""
    camp, in_root = chroot_runner(tmp_path, "/pip")
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/bash\necho 101\n")
    (bin_dir / "sbatch").chmod(0o755)
    bad = tmp_path / "campaign-code-ran"
    env = ("env", "-i", f"PYTHONPATH={_SRC}{tail}", f"TMPDIR={tmp_path}", f"HOME={tmp_path}",
           f"PATH={bin_dir}:/usr/bin:/bin")
    res = in_root(*env, sys.executable, "-m", "kvprefetch", "slurm", "plan", "/pip",
                  "--stand-in", "--batch", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    (camp / "__init__.py").write_text(f"open({str(bad)!r}, 'w').write('ran')\n")
    (camp / "__main__.py").write_text(f"open({str(bad)!r}, 'w').write('ran')\n")
    res = in_root(*env, sys.executable, "-m", "kvprefetch", "slurm", "submit", "/pip",
                  "--dry-run")
    assert not bad.exists(), "submit's pip imported the campaign's code:\n" + res.stderr
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_pip_config_that_never_ends_stops_submit_with_a_fix(
        tmp_path: Path, outside: Path) -> None:
    """``PIP_CONFIG_FILE`` a FIFO nobody writes: the index is asked of pip within the time
    limit (set to 2 s here, in the child, so the test takes seconds; the kit's is 30 s), and
    the answer is a ConfigError naming pip's configuration files with a fix, not a wait for
    good. Submit itself passes the error on as it does for a pip setting that is no URL
    (test_job_home.py); the hang was in this call."""
    fifo = tmp_path / "pip.conf"
    os.mkfifo(fifo)
    code = textwrap.dedent(f"""
        import os
        from kvprefetch.errors import KvprefetchError
        from kvprefetch.sources import download
        download.PIP_CONFIG_TIMEOUT_S = 2.0
        env = {{k: v for k, v in os.environ.items() if k != "PIP_INDEX_URL"}}
        env.update(PIP_CONFIG_FILE={str(fifo)!r}, HOME={str(tmp_path)!r})
        try:
            print("answered", download.configured_index_url(env))
        except KvprefetchError as exc:
            print("refused", exc.cause, "| To fix:", exc.fix)
    """)
    env = {**os.environ, "PYTHONPATH": str(_SRC), "TMPDIR": str(tmp_path)}
    try:
        res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=30, check=False, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail("asking pip for its index waited on the FIFO for good")
    out = res.stdout + res.stderr
    assert "Traceback" not in out, out
    assert "refused `pip config get global.index-url` did not answer within 2 s" in out, out
    assert "| To fix: make pip's configuration files plain files (unset PIP_CONFIG_FILE" in out
    assert "or set PIP_INDEX_URL" in out, out


@pytest.mark.parametrize("setting", ["PIP_VERBOSE=1", "PIP_QUIET=1", "PIP_NO_CACHE_DIR=maybe"])
def test_submit_sends_the_users_mirror_whatever_pip_options_the_shell_sets(
        tmp_path: Path, outside: Path, setting: str) -> None:
    """The user's pip names a mirror in ``~/.config/pip/pip.conf``; the submitting shell
    also sets a pip option of its own: every sbatch is still run with ``PIP_INDEX_URL`` set to
    the mirror."""
    camp, home = tmp_path / "camp", tmp_path / "h"
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".config" / "pip" / "pip.conf").write_text(
        "[global]\nindex-url = https://mirror.example/simple\n")
    _plan(tmp_path, camp)
    bin_dir, got = _env_sbatch(tmp_path)
    name, value = setting.split("=")
    res = _submit(tmp_path, bin_dir, home, "submit", str(camp), **{name: value})
    assert res.returncode == 0, res.stdout + res.stderr
    sent = got.read_text().splitlines()
    assert len(sent) >= 5 and set(sent) == {"https://mirror.example/simple"}, sent
