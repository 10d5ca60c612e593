"""Issue 41, the twentieth hostile pass (tester d: the generated job scripts as they run on a
node). Each test fails without its fix (checked by reverting ``src`` and running it):

- Every job refuses a ``TMPDIR``, ``TEMP`` or ``TMP`` in the campaign (the nineteenth pass),
  but compared by path only: a bind mount of the campaign elsewhere (a second mount point, a
  container's view) resolved to a path outside it. The build job, with the node's
  ``SLURM_TMPDIR`` for its scratch and ``TMPDIR=<bind mount>/tmp``, made the kit's private
  folders in the campaign, and a watcher swapping them for a link to a folder outside had
  tarfile unpack the whole vLLM sdist there (1 run of 1), the nineteenth pass's own attack.
  Now each folder on the way is compared with the campaign by device and inode too (bash's
  ``-ef``), for the search paths as well.
- The same check took a ``TMPDIR`` that named no folder yet by the folders above it: the
  user's link ``~/t`` to ``<campaign>/tmp``, which did not exist when the job checked, passed,
  the campaign's writer made ``tmp/`` right after, and the build job's private folders went
  there: the sdist unpacked outside through a swapped one (1 run of 1). Now the value is
  pinned to the folder it names by a path with no link on it, and one whose first missing
  part is already something (a link to nothing, a file) is refused.
- An ``LD_LIBRARY_PATH=/proc/self/cwd`` entry resolved, where the check ran (``/``), to the
  root, and was kept; the job's ``stat``, ``dd`` and ``mv`` then ran in the campaign and its
  ``logs/``, where ``/proc/self/cwd`` is that folder: a ``libacl.so.1`` planted in ``logs/``
  was loaded by ``mv`` (2 runs of 2, verify and prepare jobs). Now an entry reaching ``/proc``
  on its way is left out, and a temp folder there refused.

Slurm is absent: the job scripts are run by bash as Slurm runs them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass18_e import _fake_libacl
from tests.integration.test_hostile_pass19_b import _swap_private_folders
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_SRC = Path(__file__).resolve().parents[2] / "src"
_JOBS = ("00-prepare.sbatch", "10-build-baseline.sbatch", "20-verify.sbatch", "30-bench.sbatch",
         "40-merge.sbatch")


def _plan(tmp_path: Path, camp: Path, python: str = sys.executable,
          path: str = "/usr/bin:/bin") -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path), PATH=path)
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp),
                          "--stand-in", "--batch", "1", "--python", python], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


def _run(tmp_path: Path, camp: Path, script: str, **env: str) -> subprocess.CompletedProcess[str]:
    job_env = {"HOME": str(tmp_path), "SLURM_JOB_ID": "7", "PATH": "/usr/bin:/bin", **env}
    if script.startswith("30"):
        job_env.update(SLURM_ARRAY_JOB_ID="7", SLURM_ARRAY_TASK_ID="0")
    return subprocess.run(["bash", str(camp / "scripts" / script)], env=job_env,
                          capture_output=True, text=True, timeout=120, check=False, cwd="/")


def _bind(source: Path, alias: Path) -> None:
    alias.mkdir()
    res = subprocess.run(["mount", "--bind", str(source), str(alias)], capture_output=True,
                         text=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot bind-mount here (needs root): {res.stderr.strip()}")


def test_a_build_jobs_private_folders_never_go_into_a_bind_mount_of_the_campaign(
        tmp_path: Path, outside: Path, vllm_sdist: Path) -> None:
    """The attack itself: the build job with ``TMPDIR=<bind mount of the campaign>/tmp``,
    under a watcher swapping the kit's private folders there for links outside: nothing of
    the sdist lands outside; the job refuses the TMPDIR and records exit 2."""
    camp, node, alias = tmp_path / "camp", tmp_path / "node", tmp_path / "alias"
    node.mkdir()
    _plan(tmp_path, camp)
    shutil.copyfile(vllm_sdist, camp / "cache" / vllm_sdist.name)
    (camp / "tmp").mkdir()
    _bind(camp, alias)
    stop = threading.Event()
    watcher = threading.Thread(target=_swap_private_folders, args=(camp / "tmp", outside, stop))
    watcher.start()
    try:
        res = _run(tmp_path, camp, "10-build-baseline.sbatch", SLURM_TMPDIR=str(node),
                   TMPDIR=str(alias / "tmp"))
    finally:
        stop.set()
        watcher.join()
        subprocess.run(["umount", "-l", str(alias)], check=False)
    assert not (outside / "vllm-0.10.2").exists(), "the sdist was unpacked outside the campaign"
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"refusing to run: TMPDIR={alias / 'tmp'} is in the campaign" in res.stderr
    assert "To fix: submit the campaign with TMPDIR set to a folder outside it" in res.stderr
    assert (camp / "logs" / "build-baseline-7.exit").read_text() == "2\n"


def _stub(tmp_path: Path, camp: Path, action: str = "") -> tuple[Path, Path]:
    """The jobs' "interpreter": it does ``action`` (what an attacker does once the job's checks
    are over), then writes the TMPDIR it was given and where it resolves now."""
    seen, py = tmp_path / "seen", tmp_path / "python"
    py.write_text(f'#!/bin/bash\n{action}\nprintf "%s\\n%s\\n" "$TMPDIR" '
                  f'"$(cd -P -- "$TMPDIR" 2>/dev/null && pwd -P)" >> {seen}\n')
    py.chmod(0o755)
    return seen, py


def test_every_job_refuses_a_temp_folder_in_a_bind_mount_of_the_campaign(
        tmp_path: Path) -> None:
    """Each job refuses TMPDIR in a bind mount of the campaign (or the mount itself) before
    its interpreter runs. (TEMP and TMP were refused too until jobs kept only job_env's names;
    they never reach a job now: test_job_env.)"""
    camp, alias = tmp_path / "camp", tmp_path / "alias"
    seen, py = _stub(tmp_path, camp)
    _plan(tmp_path, camp, python=str(py))
    (camp / "tmp").mkdir()
    _bind(camp, alias)
    try:
        for var, value in (("TMPDIR", alias / "tmp"), ("TMPDIR", alias)):
            for script in _JOBS:
                res = _run(tmp_path, camp, script, SLURM_TMPDIR=str(tmp_path), **{var: str(value)})
                assert res.returncode == 2, (script, res.stdout + res.stderr)
                assert f"refusing to run: {var}={value} is in the campaign" in res.stderr
                assert not seen.exists(), f"{script} ran the kit with {var}={value}"
    finally:
        subprocess.run(["umount", "-l", str(alias)], check=False)


def test_a_temp_folder_through_a_link_to_a_folder_not_made_yet_is_refused(
        tmp_path: Path) -> None:
    """``TMPDIR`` the user's link to ``<campaign>/tmp``, which the campaign's writer makes
    once the job's check is over (here: the interpreter makes it first): no job runs the kit
    with a temp folder that is then in the campaign. A folder of the user's that is not made
    yet is still taken, and any taken value is the folder's path with no link on it."""
    camp, user = tmp_path / "camp", tmp_path / "user"
    seen, py = _stub(tmp_path, camp, f"mkdir -p {camp / 'tmp'}")
    _plan(tmp_path, camp, python=str(py))
    user.mkdir()
    (user / "t").symlink_to(camp / "tmp")
    (user / "real").mkdir()
    (user / "ok").symlink_to(user / "real")
    for script in _JOBS:
        shutil.rmtree(camp / "tmp", ignore_errors=True)
        res = _run(tmp_path, camp, script, SLURM_TMPDIR=str(tmp_path), TMPDIR=str(user / "t"))
        given = seen.read_text().splitlines() if seen.exists() else []
        assert not (len(given) > 1 and given[1].startswith(str(camp))), \
            f"{script} ran the kit with TMPDIR {given[0]} in the campaign"
        assert res.returncode == 2, (script, res.stdout + res.stderr)
        assert f"refusing to run: TMPDIR={user / 't'} names no folder now" in res.stderr
        assert "To fix: set TMPDIR to a folder that exists, outside the campaign" in res.stderr
    for value, want in ((user / "ok", user / "real"), (user / "ok/new", user / "real/new")):
        res = _run(tmp_path, camp, "00-prepare.sbatch", TMPDIR=str(value))
        assert res.returncode == 0, res.stdout + res.stderr
        assert seen.read_text().splitlines()[0] == str(want)
        seen.unlink()


@pytest.mark.parametrize("entry", ["/proc/self/cwd", "/proc/self/cwd/.", "/dev/fd/../cwd"])
def test_a_library_path_entry_through_proc_never_loads_a_library_planted_in_the_campaign(
        tmp_path: Path, outside: Path, entry: str) -> None:
    """``LD_LIBRARY_PATH=/proc/self/cwd`` (the folder each program runs in): a ``libacl.so.1``
    planted in the campaign's logs/ is never loaded by the job's ``mv``; a TMPDIR there is
    refused."""
    camp, bad = tmp_path / "camp", outside / "loaded-by-the-job"
    lib = _fake_libacl(tmp_path, bad)
    if lib is None:
        pytest.skip("this machine's mv does not link libacl.so.1, or no C compiler")
    _plan(tmp_path, camp, python="/bin/true")
    for folder in (camp, camp / "logs", camp / "results"):
        shutil.copyfile(lib, folder / "libacl.so.1")
    for script in ("00-prepare.sbatch", "20-verify.sbatch"):
        res = _run(tmp_path, camp, script, LD_LIBRARY_PATH=entry)
        assert not bad.exists(), f"{script} loaded a library planted in the campaign"
        assert res.returncode == 0, res.stdout + res.stderr
    res = _run(tmp_path, camp, "00-prepare.sbatch", TMPDIR=entry)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"refusing to run: TMPDIR={entry} is in the campaign" in res.stderr


def test_a_search_path_through_the_users_link_to_a_link_in_the_campaign_is_pinned(
        tmp_path: Path, outside: Path) -> None:
    """The planner's PATH starts with ``~/l``, the user's link to ``<campaign>/lnk``, a link to
    a folder outside when the job checks; the campaign's writer then points ``lnk`` at its own
    bin/ (here the interpreter does, once the checks are over): the ``dirname``, ``mktemp``,
    ``dd`` and ``mv`` planted there never run. The job's PATH is the folders' own paths."""
    camp, user, bad = tmp_path / "camp", tmp_path / "user", outside / "ran-by-the-job"
    user.mkdir()
    (user / "l").symlink_to(camp / "lnk")
    (tmp_path / "obin").mkdir()
    seen, py = tmp_path / "seen", tmp_path / "python"
    py.write_text(f'#!/bin/bash\nprintf "%s\\n" "$PATH" > {seen}\n'
                  f'ln -s {camp / "bin"} {camp / "lnk.new"} && mv -T {camp / "lnk.new"} '
                  f'{camp / "lnk"}\n')
    py.chmod(0o755)
    _plan(tmp_path, camp, python=str(py), path=f"{user / 'l'}:/usr/bin:/bin")
    (camp / "bin").mkdir()
    for name in ("dirname", "mktemp", "dd", "mv", "stat"):
        prog = camp / "bin" / name
        prog.write_text(f'#!/bin/sh\necho {name} >> {bad}\nexec /usr/bin/{name} "$@"\n')
        prog.chmod(0o755)
    for script in ("00-prepare.sbatch", "20-verify.sbatch"):
        (camp / "lnk").unlink(missing_ok=True)
        (camp / "lnk").symlink_to(tmp_path / "obin")
        res = _run(tmp_path, camp, script)
        assert not bad.exists(), f"{script} ran a program planted in the campaign"
        assert res.returncode == 0, res.stdout + res.stderr
        assert seen.read_text().split(":")[0] == str((tmp_path / "obin").resolve())


def test_pythons_bytecode_cache_is_never_written_through_the_campaign(
        tmp_path: Path, outside: Path) -> None:
    """``PYTHONPYCACHEPREFIX=<campaign>/pyc``, and ``pyc`` a link to a folder outside: the
    merge job's interpreter (the kit's own) writes no bytecode there, nor in the campaign
    (which the next job would import). Every job refused it, and ``PYTHONUSERBASE`` there,
    until jobs kept only job_env's names; now neither reaches the interpreter of any job."""
    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    (camp / "pyc").symlink_to(outside, target_is_directory=True)
    _run(tmp_path, camp, "40-merge.sbatch", PYTHONPYCACHEPREFIX=str(camp / "pyc"))
    assert not list(outside.rglob("*.pyc")), "the job's Python wrote its bytecode outside"
    assert not list(camp.rglob("*.pyc")), "the job's Python wrote its bytecode in the campaign"
    got = tmp_path / "got"
    record = f'echo "${{PYTHONPYCACHEPREFIX-}}${{PYTHONUSERBASE-}}" >> {got}'
    seen, py = _stub(tmp_path, camp, record)
    stub_camp = tmp_path / "stub-camp"
    _plan(tmp_path, stub_camp, python=str(py))
    for var in ("PYTHONPYCACHEPREFIX", "PYTHONUSERBASE"):
        for script in _JOBS:
            res = _run(tmp_path, stub_camp, script, SLURM_TMPDIR=str(tmp_path),
                       **{var: str(stub_camp / "logs")})
            assert seen.exists(), (script, res.stdout + res.stderr)
            seen.unlink()
    assert set(got.read_text().splitlines()) == {""}, f"a job's interpreter got {got.read_text()}"


def test_a_job_of_a_moved_campaign_or_with_an_overlong_job_id_says_what_to_do(
        tmp_path: Path) -> None:
    """A campaign moved since the plan: each job says so, with a fix (bash's "cd: No such file
    or directory" alone before). A SLURM_JOB_ID longer than any Slurm job id is refused as one,
    not called "something is already there" when the scratch's name is too long."""
    camp, moved, node = tmp_path / "camp", tmp_path / "moved", tmp_path / "node"
    node.mkdir()
    _plan(tmp_path, camp, python="/bin/true")
    camp.rename(moved)
    for script in _JOBS:
        job_env = {"HOME": str(tmp_path), "SLURM_JOB_ID": "7", "PATH": "/usr/bin:/bin"}
        res = subprocess.run(["bash", str(moved / "scripts" / script)], env=job_env,
                             capture_output=True, text=True, timeout=60, check=False, cwd="/")
        assert res.returncode == 2, (script, res.stdout + res.stderr)
        assert (f"the campaign folder {camp} this script was planned for is not there"
                in res.stderr), res.stderr
        assert "To fix: move it back, or plan the campaign again" in res.stderr
    moved.rename(camp)
    for script in _JOBS:
        res = _run(tmp_path, camp, script, SLURM_TMPDIR=str(node), SLURM_JOB_ID="9" * 250)
        assert res.returncode == 2, (script, res.stdout + res.stderr)
        assert "is longer than any Slurm job id" in res.stderr, res.stderr
        assert "something is already there" not in res.stderr
    assert list(node.iterdir()) == []
    res = _run(tmp_path, camp, "30-bench.sbatch", SLURM_JOB_ID="4294967295",
               SLURM_ARRAY_JOB_ID="4294967295")
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize(("var", "value"), [
    ("CUDA_HOME", "{camp}/cuda"), ("CUDA_PATH", "{alias}/camp/cuda"), ("CXX", "{camp}/cuda/g++"),
    ("CXX", "{user}/g++"),
])
def test_the_cuda_toolkit_and_host_compiler_are_never_taken_from_the_campaign(
        tmp_path: Path, var: str, value: str) -> None:
    """``CUDA_HOME=<campaign>/cuda`` had the build job run the ``nvcc`` planted there (1 run
    of 1, by hand); CUDA_PATH, and CXX (by name, or the user's link to a compiler planted in
    the campaign) are the same kind: each job refuses them before its interpreter runs. A
    toolkit outside is kept, by its own path."""
    camp, user = tmp_path / "camp", tmp_path / "user"
    (tmp_path / "alias").symlink_to(tmp_path)
    seen, py = _stub(tmp_path, camp)
    _plan(tmp_path, camp, python=str(py))
    (camp / "cuda").mkdir()
    (camp / "cuda" / "g++").write_text("#!/bin/sh\n")
    user.mkdir()
    (user / "g++").symlink_to(camp / "cuda" / "g++")
    bad = value.format(camp=camp, alias=tmp_path / "alias", user=user)
    for script in _JOBS:
        res = _run(tmp_path, camp, script, SLURM_TMPDIR=str(tmp_path), **{var: bad})
        assert res.returncode == 2, (script, res.stdout + res.stderr)
        assert f"refusing to run: {var}" in res.stderr and "To fix" in res.stderr
        assert not seen.exists(), f"{script} ran the kit with {var}={bad}"
    (user / "cuda").symlink_to(tmp_path / "toolkit")
    (tmp_path / "toolkit").mkdir()
    res = _run(tmp_path, camp, "00-prepare.sbatch", CUDA_HOME=str(user / "cuda"),
               TMPDIR=str(tmp_path / "toolkit"))
    assert res.returncode == 0, res.stdout + res.stderr


def test_an_inherited_pythoninspect_never_turns_a_jobs_error_into_a_traceback(
        tmp_path: Path) -> None:
    """``PYTHONINSPECT=1`` in the submitter's shell: a job whose kit stops with an error (the
    stand-in bench before any build, exit 7) printed a SystemExit traceback and ended with
    exit 1, recorded as such. Now the kit's own message and status."""
    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    res = _run(tmp_path, camp, "30-bench.sbatch", PYTHONINSPECT="1",
               PYTHONPATH=str(_SRC))
    assert "Traceback" not in res.stderr + res.stdout, res.stderr
    assert res.returncode == 7, res.stdout + res.stderr
    assert "To fix: let the build jobs finish" in res.stderr
    assert (camp / "logs" / "bench-7_0.exit").read_text() == "7\n"


def _fake_sbatch(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in for Slurm's sbatch (Slurm is absent here): it notes each call and answers a
    job id, as ``sbatch --parsable`` does."""
    bin_dir, calls = tmp_path / "slurm-bin", tmp_path / "sbatch-calls"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(f'#!/bin/bash\necho "$@" >> {calls}\necho 101\n')
    sbatch.chmod(0o755)
    return bin_dir, calls


@pytest.mark.parametrize(("name", "value"), [
    ("LD_LIBRARY_PATH", "/usr/lib:{link}/logs"),
    ("LD_LIBRARY_PATH", "{camp}/logs"),
])
def test_submit_refuses_what_the_jobs_bash_would_load_from_the_campaign_at_its_start(
        tmp_path: Path, name: str, value: str) -> None:
    """The jobs leave the campaign out of PATH and LD_LIBRARY_PATH from their first lines, but
    bash and its loader read LD_PRELOAD, LD_LIBRARY_PATH and BASH_ENV before any line runs,
    from the environment sbatch passes on: tester d saw bash load a ``libtinfo.so.6`` planted
    at an LD_LIBRARY_PATH entry in the campaign. ``slurm submit`` sent the jobs anyway; now it
    refuses, naming the value (found there directly, through the user's link, or after a space
    in LD_PRELOAD), and sends nothing; with the value outside the campaign it sends them.
    (LD_PRELOAD and BASH_ENV are not passed to jobs since job_env's allow-list: test_job_env,
    test_hostile_pass21_b.)"""
    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    link = tmp_path / "mine"
    link.symlink_to(camp)
    bin_dir, calls = _fake_sbatch(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path), PATH=f"{bin_dir}:/usr/bin:/bin")
    hostile = value.format(camp=camp, link=link)
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "submit", str(camp)],
                         env={**env, name: hostile}, capture_output=True, text=True,
                         timeout=120, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "Traceback" not in out, out
    assert name in out and "To fix" in out, out
    assert not calls.exists(), "sbatch was run"
    assert '"sending"' not in (camp / "campaign.json").read_text()
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "submit", str(camp)],
                         env={**env, name: "/usr/lib"}, capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0 and calls.exists(), res.stdout + res.stderr
