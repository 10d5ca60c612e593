"""Issue 41, the twenty-third hostile pass (tester d: the generated job scripts as they run on
a node, and the jobs' environment allow-list, ``slurm/job_env.py``). Each test fails without
its fix (checked by reverting ``src`` and running it):

- ``slurm submit`` checks each passed value that names a folder or file (``LD_LIBRARY_PATH``,
  which the job's bash loads from before its first line; ``TZ``, which every Python reads as it
  starts; the certificates) by where it resolves *now*. A value through the user's link to a
  link in the campaign (``~/l`` -> ``<campaign>/lnk`` -> ``/usr/lib``) resolved outside and
  passed; the campaign's writer then pointed ``lnk`` at a folder of its own, and the merge
  job's bash loaded a ``libtinfo.so.6`` planted there, as the user (1 run of 1). The twentieth
  pass found the same chain on ``PATH``, which the job pins (``pin_folder``); what bash loads
  as it starts no line of the script can pin. Now submit refuses a value that meets a link
  in the campaign on its way.
- A ``--scratch`` may name any variable (``$NAME``), read by the job's first shell under the
  kit's own name. That shell read them with its own loop variable ``v`` and array ``KEEP``,
  so ``--scratch '$v/k'`` (or ``'$KEEP/k'``) read the loop's variable, not the user's: the
  build job refused "v/k" as a relative scratch the user never gave, sending them to replan
  for a cause that was not theirs (wrong-way message, 2 runs of 2). A scratch
  ``$KVPREFETCH_JOB_PID`` was passed on by sbatch as well, the very variable that tells the
  first shell it has run itself again. Now that shell's names are the kit's own
  (``KVPREFETCH_V``, ``KVPREFETCH_KEEP``), and a ``--scratch`` naming a ``KVPREFETCH_*``
  variable is refused at plan.
- ``CXX`` is passed to the build jobs and is a shell fragment: the kit's ninja rule runs
  ``$cxx ...`` through ``/bin/sh`` with the kit's environment, which holds
  ``KVPREFETCH_CAMPAIGN`` (the campaign folder) and ``OLDPWD`` (the job left the campaign for
  ``/``). Submit and the job checked a ``CXX`` holding a ``/`` as a program's path, and let
  one without pass as it is, so ``CXX='g++ -B$KVPREFETCH_CAMPAIGN'`` passed both (1 run of 1
  each) and gcc ran the ``cc1plus`` planted in the campaign (the kit's own build.ninja run by
  ninja: 1 run of 1); ``cd -&&g++`` reaches it with no ``$``. The full build (vLLM's sdist,
  torch, nvcc) is not run here; the ninja file is the kit's, made by
  ``builds.library.ninja_text``. Now submit and the job refuse a ``CXX`` of more than plain
  words (no ``$``, quote, redirection or second command).
- The job checks ``TMPDIR``, ``HOME``, ``CUDA_HOME`` and ``CUDA_PATH`` (and each ``PATH`` and
  ``LD_LIBRARY_PATH`` entry) by resolving every prefix of the path with bash's ``cd -P`` and
  comparing every folder above each with the campaign. A ``TMPDIR`` of 2,035 real folders
  (4 kB, under PATH_MAX) made that cubic: the merge job was still checking after 10 minutes,
  killed by ``timeout`` (1 run of 1; hang). Now each folder is compared once, a path spelled
  as it resolves stops after its first resolution, a part that is no folder costs no subshell,
  and a path more than 256 folders deep is refused (an entry of a search path dropped).
- Submit checks each ``LD_LIBRARY_PATH`` entry under every spelling of the loader's
  ``$ORIGIN``/``$LIB``/``$PLATFORM`` (up to 4,096 an entry), each a path check of about a
  millisecond: five entries of five ``$LIB`` each (145 characters) took a dry run 38 s, and
  each more entry 8 s more (1 run; hang past 60 s from 8 entries). Now the spellings are
  counted first, and more than 20,000 are refused at once, with a fix.

Slurm is absent: the job scripts are run by bash as Slurm runs them (from ``/``, with the
environment given)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass18_e import _fake_lib
from tests.integration.test_hostile_pass20_d import _SRC, _fake_sbatch, _plan, _run
from tests.integration.test_hostile_pass22_d import _dry_run
from tests.integration.test_job_env import _submit_env
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


def test_a_library_path_through_a_link_in_the_campaign_is_refused_at_submit(
        tmp_path: Path, outside: Path) -> None:
    """The attack: ``LD_LIBRARY_PATH=<user's link>`` to ``<campaign>/lnk``, a link to the
    system's library folder when submit checks; the campaign's writer points ``lnk`` at a
    folder holding a planted ``libtinfo.so.6`` before the job runs. Submit now refuses to send
    (exit 2, naming the value); the job run with it anyway shows what was at stake."""
    camp, bad = tmp_path / "camp", outside / "loaded-by-the-job"
    lib = _fake_lib(tmp_path, "bash", "libtinfo.so.6", bad)
    if lib is None:
        pytest.skip("no C compiler, or this bash does not link libtinfo.so.6")
    _plan(tmp_path, camp)
    system = Path(subprocess.run(["ldd", "/bin/bash"], capture_output=True, text=True,
                                 check=True).stdout.split("libtinfo.so.6 => ")[1].split()[0])
    (camp / "evil").mkdir()
    (camp / "evil" / "libtinfo.so.6").write_bytes(lib.read_bytes())
    (camp / "lnk").symlink_to(system.parent)
    mine = tmp_path / "mine"
    mine.symlink_to(camp / "lnk")
    res = _dry_run(tmp_path, camp, LD_LIBRARY_PATH=f"/usr/lib:{mine}")
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"LD_LIBRARY_PATH='{mine}'" in res.stderr, res.stderr
    assert "To fix: unset LD_LIBRARY_PATH" in res.stderr, res.stderr
    # what the job would have done: the campaign's writer repoints its link
    (camp / "lnk").unlink()
    (camp / "lnk").symlink_to(camp / "evil")
    _run(tmp_path, camp, "40-merge.sbatch", LD_LIBRARY_PATH=str(mine))
    assert bad.exists(), "the attack no longer works here: the test proves nothing"
    bad.unlink()


@pytest.mark.parametrize(("name", "value"), [
    ("TZ", ":{mine}/UTC"), ("TZ", "{mine}/../zoneinfo/UTC"), ("SSL_CERT_FILE", "{mine}/UTC"),
    ("SSL_CERT_DIR", "/etc/ssl/certs:{mine}"), ("TMPDIR", "{mine}"),
])
def test_submit_refuses_a_file_or_folder_reached_through_a_link_in_the_campaign(
        tmp_path: Path, outside: Path, name: str, value: str) -> None:
    """The same chain for the files and folders a job's programs read: a ``TZ`` there (a FIFO
    put in its place hung every job's Python, the twenty-second pass), the certificates,
    ``TMPDIR``: refused at submit, exit 2, with a fix; the same values without the campaign's
    link pass."""
    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    (camp / "lnk").symlink_to("/usr/share/zoneinfo")
    mine = tmp_path / "mine"
    mine.symlink_to(camp / "lnk")
    res = _dry_run(tmp_path, camp, **{name: value.format(mine=mine)})
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{name}=" in res.stderr and "is in the campaign" in res.stderr, res.stderr
    assert f"To fix: point {name} outside the campaign" in res.stderr, res.stderr
    mine.unlink()
    mine.symlink_to("/usr/share/zoneinfo")
    res = _dry_run(tmp_path, camp, **{name: value.format(mine=mine)})
    assert res.returncode == 0, res.stdout + res.stderr


def _plan_scratch(tmp_path: Path, camp: Path, scratch: str,
                  python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path), PATH="/usr/bin:/bin")
    return subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp),
                           "--stand-in", "--batch", "1", "--python", python,
                           "--scratch", scratch], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.mark.parametrize("name", ["v", "KEEP"])
def test_a_scratch_naming_the_first_shells_own_variables_reads_the_users_value(
        tmp_path: Path, outside: Path, name: str) -> None:
    """``--scratch '$v/k'`` with the user's ``v`` a folder outside: the build job (its
    "interpreter" a stub that notes its arguments) works under that folder. Before, it read its
    own loop variable and refused "v/k" as relative, exit 2."""
    camp, scr, got = tmp_path / "camp", tmp_path / "scr", tmp_path / "got"
    scr.mkdir()
    py = tmp_path / "python"
    py.write_text(f'#!/bin/bash\nprintf "%s\\n" "$*" >> {got}\n')
    py.chmod(0o755)
    res = _plan_scratch(tmp_path, camp, f"${name}/k", python=str(py))
    assert res.returncode == 0, res.stdout + res.stderr
    res = _run(tmp_path, camp, "10-build-baseline.sbatch", **{name: str(scr)})
    assert res.returncode == 0, res.stdout + res.stderr
    # the job's output, which it copies to its stderr beside its log (slurm/joblog.py)
    assert f"scratch: {scr}/k/" in res.stderr, res.stdout + res.stderr
    assert f"--workdir {scr}/k/" in got.read_text(), got.read_text()


@pytest.mark.parametrize("name", ["KVPREFETCH_JOB_PID", "KVPREFETCH_CAMPAIGN", "KVPREFETCH_V"])
def test_a_scratch_naming_the_kits_own_variables_is_refused_at_plan(
        tmp_path: Path, outside: Path, name: str) -> None:
    """The kit's own variables are no folder of the user's: refused, exit 2, with a fix, and
    nothing planned."""
    camp = tmp_path / "camp"
    res = _plan_scratch(tmp_path, camp, f"/scratch/${{{name}}}")
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"--scratch names ${name}, one of kvprefetch's own variables" in res.stderr
    assert "To fix: name the scratch folder without it" in res.stderr, res.stderr
    assert not (camp / "campaign.json").exists()


@pytest.mark.parametrize("cxx", ["g++ -B$KVPREFETCH_CAMPAIGN", "g++ -B${OLDPWD}", "cd -&&g++",
                                 "g++ `echo -B.`", "g++;sh x"])
def test_a_host_compiler_that_the_builds_shell_would_expand_is_refused(
        tmp_path: Path, outside: Path, cxx: str) -> None:
    """Submit refuses such a ``CXX`` (exit 2, with a fix) and the build job, given it anyway
    (an sbatch by hand), refuses before it runs the kit and records its end; ``g++`` and
    ``ccache g++`` still pass both."""
    camp, got = tmp_path / "camp", tmp_path / "got"
    py = tmp_path / "python"
    py.write_text(f'#!/bin/bash\nprintf "%s\\n" "$*" >> {got}\n')
    py.chmod(0o755)
    _plan(tmp_path, camp, python=str(py))
    res = _dry_run(tmp_path, camp, CXX=cxx)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "is more than a compiler and its plain options" in res.stderr, res.stderr
    assert "To fix: set CXX to a compiler and plain options" in res.stderr, res.stderr
    res = _run(tmp_path, camp, "10-build-baseline.sbatch", CXX=cxx)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "CXX holds more than a compiler" in res.stderr, res.stderr
    assert not got.exists(), got.read_text()
    assert (camp / "logs" / "build-baseline-7.exit").read_text() == "2\n"
    for good in ("g++", "ccache g++"):
        assert _dry_run(tmp_path, camp, CXX=good).returncode == 0, good
        res = _run(tmp_path, camp, "10-build-baseline.sbatch", CXX=good)
        assert res.returncode == 0, res.stdout + res.stderr


def test_what_such_a_compiler_did_the_kits_ninja_rule_runs_a_cc1plus_in_the_campaign(
        tmp_path: Path, outside: Path) -> None:
    """What was at stake (no fix here; it shows the attack still needs the refusals above):
    the kit's own build.ninja, its ``cxx`` from ``CXX='g++ -B$KVPREFETCH_CAMPAIGN'``, run by
    ninja with the job's ``KVPREFETCH_CAMPAIGN``, has gcc run the ``cc1plus`` planted there."""
    from kvprefetch.builds.library import ninja_text

    gxx, ninja = shutil.which("g++"), shutil.which("ninja")
    if gxx is None or ninja is None:
        pytest.skip("no g++ or ninja here")
    camp, build, bad = tmp_path / "camp", tmp_path / "build", outside / "ran-by-the-build"
    camp.mkdir()
    build.mkdir()
    planted = camp / "cc1plus"
    planted.write_text(f"#!/bin/sh\necho pwned > {bad}\nexit 1\n")
    planted.chmod(0o755)
    (build / "a.cpp").write_text("int f() { return 0; }\n")
    (build / "build.ninja").write_text(ninja_text(
        nvcc=Path("/bin/false"), cxx="g++ -B$KVPREFETCH_CAMPAIGN", cu_sources=[],
        cpp_source=build / "a.cpp", nvcc_flags=[], cxx_flags=[], link_flags=["-shared"],
        output=build / "a.so"))
    subprocess.run([ninja, "-C", str(build)], env={"PATH": "/usr/bin:/bin",
                   "KVPREFETCH_CAMPAIGN": str(camp)}, capture_output=True, check=False,
                   timeout=60)
    assert bad.exists(), "the planted cc1plus did not run: this test shows nothing"
    bad.unlink()


def test_a_folder_thousands_of_levels_deep_is_refused_in_seconds(
        tmp_path: Path, outside: Path) -> None:
    """``TMPDIR`` 2,035 real folders deep: the job refuses it, exit 2, recorded, within the
    test's 60 s (before: over 10 minutes); 200 deep through a link, it runs (its
    "interpreter" a stub; 250 went past 256 where pytest's own folder is 7 deep)."""
    camp, py = tmp_path / "camp", tmp_path / "python"
    py.write_text("#!/bin/bash\n")
    py.chmod(0o755)
    _plan(tmp_path, camp, python=str(py))
    deep = tmp_path / "deep"
    subprocess.run(["mkdir", "-p", str(deep) + "/a" * 2035], check=True)  # makedirs recurses
    try:
        _deep_jobs(tmp_path, camp, deep)
    finally:  # pytest's own removal of tmp_path recurses too
        subprocess.run(["rm", "-rf", str(deep)], check=True)


def _deep_jobs(tmp_path: Path, camp: Path, deep: Path) -> None:
    job = {"HOME": str(tmp_path), "SLURM_JOB_ID": "7", "PATH": "/usr/bin:/bin"}
    script = str(camp / "scripts" / "40-merge.sbatch")
    res = subprocess.run(["bash", script], env=job | {"TMPDIR": str(deep) + "/a" * 2035},
                         capture_output=True, text=True, timeout=60, check=False, cwd="/")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "TMPDIR names a folder more than 256 folders deep" in res.stderr, res.stderr
    assert (camp / "logs" / "merge-7.exit").read_text() == "2\n"
    (tmp_path / "link").symlink_to(deep)
    res = subprocess.run(["bash", script], env=job | {
        "TMPDIR": str(tmp_path / "link") + "/a" * 200,
        "LD_LIBRARY_PATH": "/usr/lib:" + str(deep) + "/a" * 2035}, capture_output=True,
        text=True, timeout=60, check=False, cwd="/")
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_library_path_of_many_loader_tokens_is_refused_at_once(
        tmp_path: Path, outside: Path) -> None:
    """Entries of five ``$LIB`` each: the dry run refuses within the test's 20 s (before: 38 s
    for five, minutes for more); one ``$ORIGIN`` entry still passes."""
    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    value = ":".join(f"/$LIB/$LIB/$LIB/$LIB/$LIB/x{i}" for i in range(8))
    bin_dir = tmp_path / "slurm-bin"
    _fake_sbatch(tmp_path)
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "submit", str(camp),
                          "--dry-run"], env=_submit_env(tmp_path, bin_dir,
                                                        LD_LIBRARY_PATH=value),
                         capture_output=True, text=True, timeout=20, check=False)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "LD_LIBRARY_PATH in this shell holds more than 20000 folders" in res.stderr
    assert "To fix: shorten LD_LIBRARY_PATH" in res.stderr, res.stderr
    res = _dry_run(tmp_path, camp, LD_LIBRARY_PATH="/usr/lib:$ORIGIN/../lib")
    assert res.returncode == 0, res.stdout + res.stderr
