"""What a campaign job's environment holds (``kvprefetch.slurm.job_env``, issue 41): an
allow-list in place of the deny-lists passes 18 to 21 kept growing. ``slurm submit`` tells
sbatch ``--export=<names>`` (never the whole shell), checks each name's value first, and each
job script runs itself again under ``env -i`` with those names alone, so nothing else the
submitting shell (or the node) holds reaches the kit or the programs it runs.

Each test fails on the deny-list design (checked by reverting ``src``): the jobs passed every
variable on, and sbatch got no ``--export``.

Slurm is absent: the job scripts are run by bash as Slurm runs them (from ``/``, with the
environment given), and a fake ``sbatch`` records what it is asked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvprefetch.slurm.job_env import FROM_SLURMD, PASSED
from tests.integration.test_hostile_pass20_d import _fake_sbatch, _plan, _run
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_SRC = Path(__file__).resolve().parents[2] / "src"
_JOBS = ("00-prepare.sbatch", "10-build-baseline.sbatch", "20-verify.sbatch", "30-bench.sbatch",
         "40-merge.sbatch")
# What a job's own lines set (the kit, PATH, the campaign) and bash itself adds
_SET_BY_THE_JOB = {"PYTHONPATH", "PATH", "KVPREFETCH_CAMPAIGN", "PWD", "OLDPWD", "SHLVL", "_"}
# Variables earlier passes found acting in a job (and a few no pass tried), none of them passed
_HOSTILE = {"PYTHONINSPECT": "1", "PYTHONHOME": "/nonexistent", "PYTHONPYCACHEPREFIX": "pyc",
            "PYTHONUSERBASE": "ub", "PYTHONSTARTUP": "/x", "TEMP": "t", "TMP": "t",
            "COMPILER_PATH": "cc", "CPATH": "inc", "GCC_EXEC_PREFIX": "gx/",
            "NVCC_CCBIN": "cc/g++", "NVCC_APPEND_FLAGS": "-Xcompiler x", "CUDA_CACHE_PATH": "cc",
            "TRITON_CACHE_DIR": "tc", "GIT_TRACE": "git.trace", "GIT_DIR": "g", "PIP_LOG": "p",
            "PIP_CONFIG_FILE": "pip.conf", "GCONV_PATH": "gc", "LOCPATH": "lp",
            "KVPREFETCH_WORKDIR": "w", "VLLM_USE_PRECOMPILED": "1", "SHELLOPTS": "braceexpand",
            "A.B": "not a name bash can unset", "BASH_FUNC_mkdir%%": "() { echo planted; }"}


def _env_stub(tmp_path: Path) -> tuple[Path, Path]:
    """The jobs' "interpreter": it appends the names in its environment (one line each, then
    a ``--`` line) to ``got``."""
    got, py = tmp_path / "got", tmp_path / "python"
    py.write_text(f"#!/bin/bash\nenv -0 | tr '\\0' '\\n' | sed -n 's/=.*//p' >> {got}\n"
                  f"echo -- >> {got}\n")
    py.chmod(0o755)
    return got, py


def test_a_job_keeps_only_the_names_job_env_passes(tmp_path: Path) -> None:
    """Every job, given every name job_env passes and the variables earlier passes found acting
    in a job (an exported function and a name bash cannot unset included): the kit's
    interpreter sees the passed names, Slurm's own and the job's own, and nothing else."""
    camp, node = tmp_path / "camp", tmp_path / "node"
    node.mkdir()
    got, py = _env_stub(tmp_path)
    _plan(tmp_path, camp, python=str(py))
    given = {n: f"/opt/{n.lower()}" for n in PASSED} | {n: "0" for n in FROM_SLURMD}
    given |= {"LANG": "C.UTF-8", "LANGUAGE": "en", "TZ": "UTC", "SLURM_TMPDIR": str(node),
              "HOME": str(tmp_path), "TMPDIR": str(tmp_path), "LD_LIBRARY_PATH": "/usr/lib"}
    given.pop("CXX")  # a host compiler must resolve to a program (the job checks it)
    allowed = set(given) | _SET_BY_THE_JOB | {"SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID",
                                               "SLURM_ARRAY_TASK_ID"}
    for script in _JOBS:
        res = _run(tmp_path, camp, script, **given, **_HOSTILE)
        assert res.returncode == 0, (script, res.stdout + res.stderr)
        assert "planted" not in res.stdout + res.stderr, (script, res.stdout + res.stderr)
    runs = got.read_text().split("--\n")[:-1]
    assert len(runs) >= len(_JOBS), got.read_text()  # each job runs the kit once or more
    for names in runs:
        seen = set(names.split())
        assert not seen - allowed, f"the kit got {sorted(seen - allowed)}"
        assert {"HOME", "TZ", "PIP_INDEX_URL", "https_proxy", "CUDA_HOME"} <= seen, \
            f"a passed name was lost: {sorted(seen)}"


def _submit_env(tmp_path: Path, bin_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KVPREFETCH", "SLURM", "LD_", "SBATCH"))}
    env.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path), HOME=str(tmp_path),
               PATH=f"{bin_dir}:/usr/bin:/bin")
    return env | extra


def _exported(line: str) -> list[str]:
    options = [a for a in line.split() if a.startswith("--export=")]
    assert len(options) == 1, line
    return options[0].removeprefix("--export=").split(",")


def test_submit_tells_sbatch_to_pass_only_job_envs_names(tmp_path: Path) -> None:
    """Every sbatch ``submit`` and ``resubmit`` run is told ``--export=`` the passed names and
    the scratch's variables, never ``ALL`` (sbatch's default, and an ``SBATCH_EXPORT=ALL`` of
    the user's is overridden by the option); each script carries the same list for an sbatch
    run by hand."""
    camp = tmp_path / "camp"
    bin_dir, calls = _fake_sbatch(tmp_path)
    env = _submit_env(tmp_path, bin_dir, SBATCH_EXPORT="ALL", MYSCR=str(tmp_path))
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp),
                          "--stand-in", "--batch", "1", "--scratch", "$MYSCR/k"], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    for argv in (["submit", str(camp)], ["resubmit", str(camp), "merge"]):
        res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", *argv], env=env,
                             capture_output=True, text=True, timeout=120, check=False)
        assert res.returncode == 0, res.stdout + res.stderr
    sent = calls.read_text().splitlines()
    assert len(sent) >= len(_JOBS) + 1, sent
    expected = [*PASSED, "MYSCR"]
    for line in sent:
        assert _exported(line) == expected, line
    for script in (camp / "scripts").glob("*.sbatch"):
        assert f"#SBATCH --export={','.join(expected)}\n" in script.read_text(), script


@pytest.mark.parametrize(("name", "value"), [
    ("TMPDIR", "{link}/tmp"), ("CUDA_HOME", "{camp}/cuda"),
    ("CXX", "{link}/bin/g++"), ("SSL_CERT_FILE", "{camp}/ca.pem"), ("PIP_CERT", "{link}/ca"),
    ("LANG", "{camp}/locale"),
])
def test_submit_refuses_a_passed_value_that_leads_into_the_campaign(
        tmp_path: Path, name: str, value: str) -> None:
    """A passed folder or file the job's programs read (by its name or through the user's link
    to the campaign), or a locale given as a path: submit refuses, naming it, with a fix, and
    runs no sbatch; the same name outside the campaign is sent."""
    camp, link = tmp_path / "camp", tmp_path / "mine"
    _plan(tmp_path, camp)
    link.symlink_to(camp)
    bin_dir, calls = _fake_sbatch(tmp_path)
    bad = value.format(camp=camp, link=link)
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "submit", str(camp)],
                         env=_submit_env(tmp_path, bin_dir, **{name: bad}),
                         capture_output=True, text=True, timeout=120, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "Traceback" not in out, out
    assert name in out and "To fix" in out, out
    assert not calls.exists(), "sbatch was run"
    # (a toolkit folder must not hold the campaign either: the twenty-fourth pass)
    good = "C.UTF-8" if name == "LANG" else "g++" if name == "CXX" \
        else str(tmp_path / "toolkit") if name.startswith("CUDA_") else str(tmp_path)
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "submit", str(camp)],
                         env=_submit_env(tmp_path, bin_dir, **{name: good}),
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0 and calls.exists(), res.stdout + res.stderr


@pytest.mark.parametrize("scratch", ["$LD_PRELOAD/k", "/s/${BASH_ENV}", "$ENV", "$SHELLOPTS/k",
                                     "/s/$GCONV_PATH"])
def test_a_scratch_may_not_name_what_bash_reads_as_it_starts(tmp_path: Path, scratch: str) -> None:
    """A ``--scratch`` variable is passed to the job's first shell, which reads it as it starts
    when it is the loader's or bash's own: plan refuses such a name, with a fix."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path), PATH="/usr/bin:/bin")
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan",
                          str(tmp_path / "camp"), "--stand-in", "--batch", "1", "--scratch",
                          scratch], env=env, capture_output=True, text=True, timeout=60,
                         check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "Traceback" not in out, out
    assert "reads as it starts" in out and "To fix" in out, out
    assert not (tmp_path / "camp").exists()


def test_a_scratch_variable_reaches_the_scratch_and_no_program(tmp_path: Path) -> None:
    """``--scratch '$MYSCR/k'``: the build job builds under the value its first shell got, and
    the kit's programs never see ``MYSCR`` itself; unset, the job refuses with a fix."""
    camp, base = tmp_path / "camp", tmp_path / "scr"
    base.mkdir()
    got, py = _env_stub(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path), PATH="/usr/bin:/bin")
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp),
                          "--stand-in", "--batch", "1", "--scratch", "$MYSCR/k", "--python",
                          str(py), "--keep-scratch"], env=env, capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    res = _run(tmp_path, camp, "10-build-baseline.sbatch", MYSCR=str(base))
    assert res.returncode == 0, res.stdout + res.stderr
    # the job's output, which it copies to its stderr beside its log (slurm/joblog.py)
    assert f"scratch: {base}/k/" in res.stderr, res.stdout + res.stderr
    assert "MYSCR" not in got.read_text().split(), got.read_text()
    res = _run(tmp_path, camp, "10-build-baseline.sbatch")
    assert res.returncode == 2 and "names $MYSCR, which is not set" in res.stderr, res.stderr
    assert "To fix" in res.stderr
