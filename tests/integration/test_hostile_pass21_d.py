"""Issue 41, the twenty-first hostile pass (tester d: the generated job scripts as they run on
a node). Each test fails without its fix (checked by reverting ``src`` and running it):

- ``LD_PRELOAD`` (and ``LD_AUDIT``) entries that are relative with a ``/`` (``./pre.so``,
  ``logs/pre.so``, ``../camp/pre.so``) or go through ``/proc`` (``/proc/self/cwd/pre.so``)
  passed ``submit``'s start-environment check, which reads them from ``/``, where bash starts;
  but every program the job runs after its ``cd`` into the campaign reads them again from the
  folder it runs in: a ``pre.so`` planted in the campaign was loaded by the job's ``env``,
  ``pwd``, ``hostname``, ``date``, ``mktemp``, ``dd`` and ``mv``, as the user (4 runs of 4,
  verify job). Now the job leaves such entries out (said on stderr) before any program runs,
  and keeps an absolute one by its own path when neither reaches the campaign.
- A relative ``PYTHONPYCACHEPREFIX`` (``dev/shm/camp/pyc``, a path from ``/``, where the kit
  runs) was not checked (only absolute values were): the merge job's interpreter wrote its
  bytecode into the campaign (118 files) to be read back by the next job. ``PYTHONHOME`` was
  not checked at all: ``PYTHONHOME=<campaign>/ph`` had the merge job import a ``pathlib.py``
  planted there; its ``prefix:exec_prefix`` form and a ``PYTHONPLATLIBDIR`` with a ``/`` do
  the same past a check of one folder. Now a relative value of each checked variable is
  refused, ``PYTHONHOME`` is checked like ``PYTHONUSERBASE``, and the two other forms are
  refused.
- The build job passed gcc's and nvcc's own variables on unchecked (the twentieth pass checked
  ``CXX`` only): gcc runs the ``cc1plus`` it finds first in ``COMPILER_PATH`` (shown here: a
  fake ``cc1plus`` ran from it) or under ``GCC_EXEC_PREFIX``, and reads ``CPATH`` headers into
  the kernels; nvcc runs ``NVCC_CCBIN``. Each could name the campaign (by its path or the
  user's link to it). Now the lists keep entries outside the campaign, and a prefix or host
  compiler in it is refused (not run through a real build here: stub interpreter).
- The prepare job's index lookup runs ``pip config get``, and pip appends a debug log to the
  file ``PIP_LOG`` (or ``log =`` in a pip.conf) names, through a link there:
  ``PIP_LOG=<campaign>/logs/pip.log`` and a link put at that name had pip's log appended to a
  file outside (1 run of 1). Now pip runs with ``--log /dev/null``.
- The build job's ``git apply`` got the job's whole environment: ``GIT_TRACE`` naming
  ``<campaign>/logs/git.trace`` and a link put there had git append its trace to a file
  outside (1 run of 1, a real build job). Now git gets no ``GIT_*`` variable of the caller's
  and no global or system config.

Slurm is absent: the job scripts are run by bash as Slurm runs them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass20_d import _plan, _run, _stub
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


def _preload_lib(tmp_path: Path, marker: Path) -> Path:
    """A library that appends the loading program's path to ``marker`` when loaded."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler here")
    src = tmp_path / "pre.c"
    src.write_text('#include <fcntl.h>\n#include <unistd.h>\n'
                   '__attribute__((constructor)) static void loaded(void) {\n'
                   f'  int f = open("{marker}", O_WRONLY | O_CREAT | O_APPEND, 0644);\n'
                   '  if (f >= 0) { write(f, "loaded\\n", 7); close(f); }\n}\n')
    lib = tmp_path / "pre.so"
    res = subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)],
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot build a shared library here: {res.stderr.strip()}")
    return lib


def test_a_preload_read_from_the_folder_a_program_runs_in_never_loads_from_the_campaign(
        tmp_path: Path) -> None:
    """``LD_PRELOAD``/``LD_AUDIT`` entries relative or through ``/proc`` naming a library
    planted in the campaign and its logs/: no program of the verify job loads it, and the job
    runs on. (The job left such entries out until jobs kept only job_env's names; now neither
    variable reaches any program after the job's first shell, an absolute one outside the
    campaign included: submit never passes them.)"""
    camp, marker, got = tmp_path / "camp", tmp_path / "loaded", tmp_path / "got"
    seen, py = _stub(tmp_path, camp, f'echo "${{LD_PRELOAD-}}|${{LD_AUDIT-}}" >> {got}')
    _plan(tmp_path, camp, python=str(py))
    lib = _preload_lib(tmp_path, marker)
    shutil.copyfile(lib, camp / "pre.so")
    shutil.copyfile(lib, camp / "logs" / "pre.so")
    for var, value in (("LD_PRELOAD", "./pre.so"), ("LD_PRELOAD", "libm.so.6 logs/pre.so"),
                       ("LD_PRELOAD", "/proc/self/cwd/pre.so"), ("LD_AUDIT", "../camp/pre.so")):
        res = _run(tmp_path, camp, "20-verify.sbatch", **{var: value})
        assert not marker.exists(), f"{var}={value}: a program loaded the campaign's pre.so"
        assert res.returncode == 0, res.stdout + res.stderr
        assert seen.exists()
        seen.unlink()
    res = _run(tmp_path, camp, "20-verify.sbatch", LD_PRELOAD=str(lib))
    assert res.returncode == 0, res.stdout + res.stderr
    assert set(got.read_text().splitlines()) == {"|"}, got.read_text()


def test_pythons_own_folders_are_never_read_from_the_campaign(tmp_path: Path) -> None:
    """A relative PYTHONPYCACHEPREFIX (from ``/``, where the kit runs, into the campaign), a
    PYTHONHOME in the campaign (also as ``prefix:exec_prefix``) and a PYTHONPLATLIBDIR path:
    the merge job refused each before its interpreter ran until jobs kept only job_env's names;
    now none of them reaches the interpreter."""
    camp, got = tmp_path / "camp", tmp_path / "got"
    names = ("PYTHONPYCACHEPREFIX", "PYTHONUSERBASE", "PYTHONHOME", "PYTHONPLATLIBDIR")
    record = "|".join("${" + n + "-}" for n in names)
    seen, py = _stub(tmp_path, camp, f'echo "{record}" >> {got}')
    _plan(tmp_path, camp, python=str(py))
    (camp / "ph").mkdir()
    rel = os.path.relpath(camp, "/")
    cases = (("PYTHONPYCACHEPREFIX", f"{rel}/pyc"), ("PYTHONUSERBASE", f"./{rel}/ub"),
             ("PYTHONHOME", str(camp / "ph")), ("PYTHONHOME", f"/usr:{camp / 'ph'}"),
             ("PYTHONPLATLIBDIR", f"../../../../../../../../..{camp}/pl"))
    for var, value in cases:
        res = _run(tmp_path, camp, "40-merge.sbatch", **{var: value})
        assert res.returncode == 0 and seen.exists(), (var, value, res.stdout + res.stderr)
        seen.unlink()
    assert set(got.read_text().splitlines()) == {"|||"}, got.read_text()


def test_the_compilers_own_search_paths_never_reach_the_campaign(tmp_path: Path) -> None:
    """gcc runs the ``cc1plus`` it finds first in ``COMPILER_PATH`` (or under
    ``GCC_EXEC_PREFIX``) and nvcc the host compiler ``NVCC_CCBIN`` names; the build job passed
    its environment on to them unchecked. The build job then kept the compilers' search paths
    to entries outside the campaign and refused a prefix or host compiler in it; since jobs
    keep only job_env's names, none of these reaches the build at all."""
    camp, node, seen = tmp_path / "camp", tmp_path / "node", tmp_path / "seen"
    node.mkdir()
    py = tmp_path / "python"
    py.write_text(f'#!/bin/bash\nprintf "%s|%s|%s|%s\\n" "${{COMPILER_PATH-}}" "${{CPATH-}}" '
                  f'"${{GCC_EXEC_PREFIX-}}" "${{NVCC_CCBIN-}}" >> {seen}\n')
    py.chmod(0o755)
    _plan(tmp_path, camp, python=str(py))
    (camp / "cc").mkdir()
    (tmp_path / "gxx").symlink_to(camp / "cc" / "g++")
    build = "10-build-baseline.sbatch"
    for hostile in ({"COMPILER_PATH": f"/usr/bin:{camp / 'cc'}",
                     "CPATH": f"{tmp_path / 'gxx'}/..:/usr"},
                    {"GCC_EXEC_PREFIX": f"{camp / 'cc'}/"}, {"NVCC_CCBIN": str(camp / "cc")},
                    {"NVCC_CCBIN": str(tmp_path / "gxx")}):
        res = _run(tmp_path, camp, build, SLURM_TMPDIR=str(node), **hostile)
        assert res.returncode == 0, (hostile, res.stdout + res.stderr)
    assert set(seen.read_text().splitlines()) == {"|||"}, seen.read_text()


def test_pips_log_never_goes_through_a_link_in_the_campaign(tmp_path: Path) -> None:
    """``PIP_LOG=<campaign>/logs/pip.log`` (or ``log =`` in a pip.conf) and a link put at that
    name to a file outside: the index lookup the prepare job (and ``fetch``) makes runs
    ``pip config get``, whose debug log was appended through the link to the file outside (1
    run of 1, the prepare job). Now pip is run with ``--log /dev/null``; its answer is read as
    before."""
    from kvprefetch.sources.download import configured_index_url

    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True,
                      check=False).returncode != 0:
        pytest.skip("no pip in this interpreter")
    camp = tmp_path / "camp"
    (camp / "logs").mkdir(parents=True)
    precious = tmp_path / "precious"
    precious.write_text("precious\n")
    (camp / "logs" / "pip.log").symlink_to(precious)
    conf = camp / "pip.conf"
    conf.write_text(f"[global]\nlog = {precious}\nindex-url = https://mirror.example/simple/\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PIP_LOG": str(camp / "logs" /
                                                                          "pip.log")}
    configured_index_url(env)
    url = configured_index_url({**env, "PIP_CONFIG_FILE": str(conf)})
    assert precious.read_text() == "precious\n", "pip's log was written through the link"
    assert url == "https://mirror.example/simple"


def test_gits_trace_never_goes_through_a_link_in_the_campaign(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``GIT_TRACE`` (and ``GIT_TRACE2``) naming ``<campaign>/logs/git.trace``, a link put there
    to a file outside: the build job's apply (``git apply``) appended git's trace to the file
    outside (1 run of 1, a real build job). Now the kit's ``git apply`` gets none of the
    caller's ``GIT_*`` variables and no global or system config; the patch still applies."""
    from kvprefetch.sources.patching import _git_apply

    if shutil.which("git") is None:
        pytest.skip("no git here")
    precious = tmp_path / "precious"
    precious.write_text("precious\n")
    logs = tmp_path / "camp" / "logs"
    logs.mkdir(parents=True)
    (logs / "git.trace").symlink_to(precious)
    (logs / "git.trace2").symlink_to(precious)
    tree = tmp_path / "work" / "tree"
    tree.mkdir(parents=True)
    (tree / "f.txt").write_text("a\n")
    patch = tmp_path / "p.diff"
    patch.write_text("--- a/f.txt\n+++ b/f.txt\n@@ -1 +1 @@\n-a\n+b\n")
    monkeypatch.setenv("GIT_TRACE", str(logs / "git.trace"))
    monkeypatch.setenv("GIT_TRACE2", str(logs / "git.trace2"))
    assert _git_apply(tree, [patch], "--check") and _git_apply(tree, [patch])
    assert precious.read_text() == "precious\n", "git's trace was written through the link"
    assert (tree / "f.txt").read_text() == "b\n"
