"""Issue 41, the twenty-first hostile pass (tester b: campaigns from the command line, reports
and outputs). Each test fails without its fix (checked by reverting ``src`` and running it):

- ``slurm submit`` refuses an ``LD_LIBRARY_PATH``, ``LD_PRELOAD``, ``LD_AUDIT``, ``BASH_ENV``
  or ``ENV`` entry in the campaign (the twentieth pass): the job's bash and its loader read
  them before the script's first line. It split ``LD_LIBRARY_PATH`` on ``:`` only, and glibc's
  loader splits it on ``;`` too: with ``LD_LIBRARY_PATH="/opt/none;<campaign>/lib"`` submit sent
  all six jobs (1 run of 1), and ``LD_DEBUG=libs bash`` showed the loader looking for
  ``libtinfo.so.6`` in ``<campaign>/lib``. And bash expands ``BASH_ENV``'s parameters before it
  reads the file: ``BASH_ENV='$CAMP/rc'`` with ``CAMP`` the campaign was sent too (bash ran
  the planted ``rc``). Now both are refused, naming the entry, and nothing is sent. The same
  for the loader's own tokens: ``LD_LIBRARY_PATH='/opt/x/$LIB/../../../<campaign>/lib'`` (the
  loader expands ``$LIB`` to ``lib/x86_64-linux-gnu`` and searched the campaign, seen with
  ``LD_DEBUG=libs``; the check read ``$LIB`` as one folder and landed two folders higher) was
  sent; now each ``$ORIGIN``/``$LIB``/``$PLATFORM`` entry is checked under each value it takes.
- ``submit --dry-run`` and ``resubmit --dry-run`` never made that check: with ``LD_PRELOAD`` in
  the campaign they listed every job they would send, exit 0, where the real command sends
  none (1 run each). Now the dry run refuses as the real one does.
- ``export-header -o out/`` (and ``vmm bench --out out/``), ``out`` a folder not made yet: the
  option was a ``Path``, which drops the trailing ``/``, so the check that refuses a folder
  never saw it and a *file* named ``out`` was written (1 run each, a careless user's
  ``-o build/``). Now the option is checked as typed: a usage error, nothing written.
- A build job's ``--scratch`` that names a variable whose value ends with a newline
  (``/tmp/$IFS``; ``$SCR`` set so): the job made the folder with the newline, then read its
  real path back through ``$(cd ... && pwd -P)``, which drops it, and tried to make its own
  folder in another, missing one: "something is already there ... To fix: move ... away",
  where nothing was (1 run of 1, exit 1). Now a scratch holding a control character after the
  job's expansion is refused by name (printed with ``%q``), exit 2, nothing made.
- ``slurm resubmit CAMP prepare --task 0`` (a job that is no array) said "To fix: pass --task
  0..0 for an array job, or no --task", sending the user back to the ``--task 0`` just refused
  (1 run each for prepare and merge). Now it says the job is no array job and to resubmit it
  without ``--task``.

Slurm is absent: a fake ``sbatch`` on PATH stands in for it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass19_b import _plan, _run
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_SRC = Path(__file__).resolve().parents[2] / "src"


def _fake_sbatch(tmp_path: Path, record_env: Path | None = None) -> tuple[Path, Path]:
    """A ``bin`` folder whose ``sbatch`` records each call in ``calls`` (and its environment in
    ``record_env``) and prints an id."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    env_line = f"env >> {record_env}\n" if record_env is not None else ""
    (bin_dir / "sbatch").write_text(f"#!/bin/bash\n{env_line}echo \"$*\" >> {calls}\n"
                                    "echo $$\n")
    (bin_dir / "sbatch").chmod(0o755)
    return bin_dir, calls


def _env(tmp_path: Path, bin_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KVPREFETCH", "SLURM", "LD_", "BASH_ENV")) and k != "ENV"}
    env.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path), PATH=f"{bin_dir}:/usr/bin:/bin")
    return env


def _submit_with(tmp_path: Path, extra: dict[str, str], record_env: Path | None = None
                 ) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``slurm submit`` of a new campaign with ``extra`` ({camp} filled in) in the shell, a fake
    sbatch recording its calls (and its environment in ``record_env``): the result, and the
    file of calls."""
    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    bin_dir, calls = _fake_sbatch(tmp_path, record_env)
    env = {**_env(tmp_path, bin_dir), **{k: v.format(camp=camp) for k, v in extra.items()}}
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "submit", str(camp)],
                         env=env, capture_output=True, text=True, timeout=120, check=False)
    return res, calls


@pytest.mark.parametrize(("extra"), [
    {"LD_LIBRARY_PATH": "/opt/none;{camp}/lib"},
    {"LD_LIBRARY_PATH": "{camp}/../x/$LIB/../../../camp/lib"},
], ids=["semicolon", "loader-token"])
def test_submit_refuses_a_start_entry_in_the_campaign_however_it_is_spelled(
        tmp_path: Path, extra: dict[str, str]) -> None:
    """An entry the loader or bash reads at the job's start, in the campaign by a ``;`` or a
    parameter of the same shell: submit refuses, naming the variable, and runs no sbatch."""
    res, calls = _submit_with(tmp_path, extra)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "Traceback" not in out, out
    assert "in the campaign" in out and "To fix" in out, out
    assert not calls.exists(), "sbatch was run"


@pytest.mark.parametrize(("extra"), [
    {"CAMP": "{camp}", "BASH_ENV": "$CAMP/rc"},
    {"CAMP": "{camp}", "ENV": "${{CAMP}}/rc"},
], ids=["bash-env-parameter", "env-braced-parameter"])
def test_bashs_start_files_never_reach_a_job(tmp_path: Path, extra: dict[str, str]) -> None:
    """Since jobs get only job_env's names (the lead's allow-list after this pass; these cases
    were refused at submit before it): ``BASH_ENV``/``ENV`` naming the campaign through a
    parameter are not passed at all. sbatch is told ``--export=`` a list naming neither (nor
    the parameter they name), on every call."""
    res, calls = _submit_with(tmp_path, extra)
    assert res.returncode == 0, res.stdout + res.stderr
    sent = calls.read_text().splitlines()
    assert sent, "no sbatch was run"
    for line in sent:
        exported = [a for a in line.split() if a.startswith("--export=")]
        assert len(exported) == 1, line
        names = exported[0].removeprefix("--export=").split(",")
        assert "USER" in names and not {"BASH_ENV", "ENV", "CAMP"} & set(names), line


@pytest.mark.parametrize("command", [["submit"], ["resubmit", "{camp}", "prepare"]])
def test_a_dry_run_refuses_the_start_entry_the_real_submit_refuses(
        tmp_path: Path, command: list[str]) -> None:
    """``submit --dry-run`` (and ``resubmit --dry-run``) with an ``LD_PRELOAD`` in the campaign
    listed every job it would send, exit 0, where the real command sends none. Now the dry run
    refuses it the same way. (``LD_PRELOAD`` is no longer passed to jobs at all; the case is
    ``LD_LIBRARY_PATH``, which is.)"""
    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    bin_dir, _ = _fake_sbatch(tmp_path)
    env = {**_env(tmp_path, bin_dir), "LD_LIBRARY_PATH": f"/usr/lib:{camp}/logs"}
    base = [sys.executable, "-m", "kvprefetch", "slurm"]
    if command[0] == "resubmit":  # a submitted campaign, so prepare can be sent again
        res = subprocess.run([*base, "submit", str(camp)], env=_env(tmp_path, bin_dir),
                             capture_output=True, text=True, timeout=120, check=False)
        assert res.returncode == 0, res.stdout + res.stderr
    argv = [*base, *[a.format(camp=camp) for a in command]]
    if command[0] == "submit":
        argv.append(str(camp))
    res = subprocess.run([*argv, "--dry-run"], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "Traceback" not in out, out
    assert "LD_LIBRARY_PATH" in out and "To fix" in out, out


@pytest.mark.parametrize("argv", [["export-header", "-o"], ["vmm", "bench", "--dry-run", "--out"]])
@pytest.mark.parametrize("spelling", ["out/", "out/."])
def test_an_output_named_as_a_folder_not_made_yet_is_no_file(
        tmp_path: Path, argv: list[str], spelling: str) -> None:
    """``-o out/`` where ``out`` does not exist: a usage error saying it is a folder, and no
    file ``out`` is made."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path))
    res = subprocess.run([sys.executable, "-m", "kvprefetch", *argv, spelling], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    out = res.stdout + res.stderr
    assert res.returncode == 2 and "Traceback" not in out, out
    assert "is a folder" in out, out
    assert not (tmp_path / "out").exists(), "a file was written at the folder's name"


def test_a_scratch_variable_ending_in_a_newline_is_named_not_blamed_on_a_folder(
        tmp_path: Path) -> None:
    """``--scratch '$SCR/s'`` with ``SCR`` ending in a newline in the job's environment: the
    build job refuses it as holding a control character (exit 2) and makes no folder."""
    camp = tmp_path / "camp"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path), PATH="/usr/bin:/bin")
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp),
                          "--stand-in", "--batch", "1", "--scratch", "$SCR"], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    base = tmp_path / "scratch"
    base.mkdir()
    res = _run(tmp_path, camp, "10-build-baseline.sbatch", SCR=f"{base}/s\n",
               TMPDIR=str(tmp_path))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "control character" in res.stderr and "To fix" in res.stderr, res.stderr
    assert "already there" not in res.stderr, res.stderr
    assert os.listdir(base) == [], "a scratch folder was made"


def test_a_task_of_a_job_that_is_no_array_is_refused_with_a_fix_that_works(
        tmp_path: Path) -> None:
    """``resubmit CAMP prepare --task 0``: refused, and the fix names no ``--task``."""
    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    bin_dir, _ = _fake_sbatch(tmp_path)
    env = _env(tmp_path, bin_dir)
    base = [sys.executable, "-m", "kvprefetch", "slurm"]
    res = subprocess.run([*base, "submit", str(camp)], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    res = subprocess.run([*base, "resubmit", str(camp), "prepare", "--task", "0", "--dry-run"],
                         env=env, capture_output=True, text=True, timeout=120, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "Traceback" not in out, out
    assert "not an array job" in out and "To fix" in out, out
    assert "--task 0..0" not in out, out
