"""Issue 41, the fifth hostile pass (against 8e2532d): what still wrote outside the folder it
belongs to, ran a command it was handed as data, or gave a traceback. Each test fails on 8e2532d
(checked with the fixes stashed):

- a campaign's job scripts, run by bash: a link planted at ``CAMPAIGN/scratch`` made the build
  jobs make their scratch work directory, and leave a failed or ``--keep-scratch`` build, outside
  the campaign; a job id from the environment that is no id (``SLURM_JOB_ID=/../../x``) put the
  exit record outside, and ``SLURM_ARRAY_TASK_ID='BATCHES[$(cmd)0]'`` ran ``cmd`` (bash
  evaluates an array index as arithmetic). Now the campaign's scratch may not be a link and the
  ids are digits (and ``_``) or the job stops before it writes anything;
- ``slurm submit`` (and ``resubmit``) sent every job of a campaign whose ``logs/`` is a link
  elsewhere: Slurm opens the jobs' ``--output`` through it and writes their logs outside. Now
  a job folder that is a link is refused before any ``sbatch``;
- ``slurm plan`` killed after its folders and first scripts, before campaign.json: the same plan
  again refused the folder ("not empty"), so the user had to find and remove it by hand. Now
  the same plan completes a folder holding only its own output;
- ``diff-upstream`` read a tree's patched files whole with ``read_text``: a binary file there was
  a UnicodeDecodeError traceback, a huge (sparse) one a MemoryError, and a FIFO "unknown tree
  'patched'". Now each is one PatchError naming the file, read as ``read_limited`` reads;
- ``report --readme`` with a timings file whose run has a ``wall_s`` of null, text, a list or an
  object: a TypeError/ValueError traceback (NaN or below zero rendered "nan min"). Now every
  field of a run is checked when the file is read;
- an environment's marker (``envs/<tree>/.kvprefetch-env.json``) whose ``path_tail`` is a number
  or holds one: a TypeError traceback when the build reused the env; a string went onto PATH
  letter by letter (relative folders). Now a BuildError naming the marker, "move it away";
- ``report --readme`` rewrote a README of mode 600 as 644 (readable by every user of the
  machine); ``--index --out`` and ``export-header -o`` did the same to a file they replace. Now
  the replaced file keeps its permission bits (``confine.kept_mode``).

The autouse ``outside`` fixture checks that a folder outside the work directory is
byte-identical afterwards."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvprefetch.errors import ConfigError, PatchError, SlurmError
from tests.integration.test_reliability import cli, outside, refused

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


def _plan(camp: Path, *args: str) -> None:
    res = cli("slurm", "plan", str(camp), "--source", "sdist", "--python", "/bin/true", *args)
    assert res.returncode == 0, res.stderr


def _job(camp: Path, script: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(camp / "scripts" / script)], capture_output=True,
                          text=True, timeout=60, check=False,
                          env={"PATH": "/usr/bin:/bin", **env})


# ----------------------------------------------------------------- Slurm job scripts (class 2/4)


def test_a_build_job_never_works_in_the_campaigns_scratch(tmp_path: Path,
                                                          outside: Path) -> None:
    """`mkdir -p` followed a link planted at ``CAMPAIGN/scratch``: the job's scratch work
    directory (and, kept, the build in it) landed in the folder the link names. This pass made
    the job refuse a linked scratch before its ``mkdir``; the twelfth pass then swapped the
    folder for a link after that check, and the job built a whole work directory outside and
    removed it through the link. A job works in its scratch by path, so no scratch is in the
    campaign any more: ``--scratch campaign`` and a folder inside the campaign are refused when
    the campaign is planned, and when a ``campaign.json`` edited to name one is read back; none
    of these writes anything."""
    camp = tmp_path / "camp"
    for scratch in ("campaign", str(camp / "scratch"), f"{camp}/"):
        res = cli("slurm", "plan", str(camp), "--source", "sdist", "--python", "/bin/true",
                  "--scratch", scratch)
        refused(res, 2, "campaign", "To fix: pass node")
        assert not camp.exists()
    _plan(camp, "--scratch", str(tmp_path / "node"))
    record = json.loads((camp / "campaign.json").read_text())
    record["plan"]["scratch"] = "campaign"
    (camp / "campaign.json").write_text(json.dumps(record))
    before = sorted(p.name for p in camp.rglob("*"))
    refused(cli("slurm", "submit", str(camp)), 2, "--scratch campaign is no longer offered")
    assert sorted(p.name for p in camp.rglob("*")) == before


@pytest.mark.parametrize("env", [
    {"SLURM_JOB_ID": "/../../../outside/evil"},
    {"SLURM_JOB_ID": "5", "SLURM_ARRAY_JOB_ID": "5",
     "SLURM_ARRAY_TASK_ID": "BATCHES[$(touch ../outside/pwned)0]"},
    {"SLURM_JOB_ID": "5", "SLURM_ARRAY_TASK_ID": "BATCHES[$(touch ../outside/pwned)0]"},
    # (pass 28 d: bash's "SLURM_ARRAY_TASK_ID: unbound variable", exit 1, with no fix)
    {"SLURM_JOB_ID": "5", "SLURM_ARRAY_JOB_ID": "5"},
], ids=["job-id-a-path", "array-task-runs-a-command", "task-without-array-job",
        "array-job-without-task"])
def test_a_job_id_from_the_environment_is_digits_or_the_job_stops(
        tmp_path: Path, outside: Path, env: dict[str, str]) -> None:
    camp = tmp_path / "camp"
    _plan(camp, "--no-gpu")
    (camp / "logs" / "verify-").mkdir()  # so that the id's path resolves
    (camp / "logs" / "bench-").mkdir()
    for script in ("20-verify.sbatch", "30-bench.sbatch"):
        res = _job(camp, script, **env)
        assert res.returncode == 2, (script, res.stderr)
        assert "is not digits" in res.stderr and "To fix" in res.stderr, res.stderr
    assert sorted(p.name for p in (camp / "logs").iterdir()) == ["bench-", "verify-"]
    res = _job(camp, "30-bench.sbatch", SLURM_JOB_ID="6", SLURM_ARRAY_JOB_ID="5",
               SLURM_ARRAY_TASK_ID="1")
    assert res.returncode == 0, res.stderr
    assert (camp / "logs" / "bench-5_1.exit").read_text() == "0\n"


@pytest.mark.parametrize("folder", ["logs", "results", "report"])
def test_submit_refuses_a_campaign_whose_job_folder_is_a_link(
        tmp_path: Path, outside: Path, folder: str) -> None:
    from tests.integration.helpers import kvprefetch_cli_split

    camp = tmp_path / "camp"
    _plan(camp)
    (camp / folder).rmdir()
    (camp / folder).symlink_to(outside, target_is_directory=True)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path}/sbatch.log\necho 77\n")
    (fake / "sbatch").chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}")
    for args in (["submit", str(camp)], ["submit", str(camp), "--dry-run"],
                 ["resubmit", str(camp), "prepare"]):
        res = kvprefetch_cli_split("slurm", *args, env=env, timeout=60)
        refused(res, SlurmError.exit_code, f"{folder} is a symlink", "move")
    assert not (tmp_path / "sbatch.log").exists()
    (camp / folder).unlink()  # the fix works: plan makes the folder again, submit sends
    _plan(camp)
    res = kvprefetch_cli_split("slurm", "submit", str(camp), env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "sbatch.log").read_text().count("--parsable") == 6


# ------------------------------------------------------------------- killed mid-command (class 6)


def test_a_slurm_plan_killed_before_its_record_is_completed_by_the_same_plan(
        tmp_path: Path, outside: Path) -> None:
    """A plan killed after its folders and some scripts, before campaign.json: the rerun said
    "not empty, plan into a new folder". Now the same plan completes it; a folder with anything
    else (an edited script, a user's file) is still refused."""
    camp = tmp_path / "camp"
    _plan(camp)
    (camp / "campaign.json").unlink()
    for script in ("30-bench.sbatch", "40-merge.sbatch"):
        (camp / "scripts" / script).unlink()
    # the temporary of the script it was writing: gone with its (dead) pid; a live pid's stays
    dead = camp / "scripts" / f".30-bench.sbatch.tmp-a1b2c3-{(1 << 31) - 2}"
    dead.write_text("#!/bin/bash\n#SBA")
    live = camp / "scripts" / f".30-bench.sbatch.tmp-a1b2c3-{os.getpid()}"
    live.write_text("#!/bin/bash\n#SBA")
    refused(cli("slurm", "plan", str(camp), "--source", "sdist", "--python", "/bin/true"),
            ConfigError.exit_code, "not empty")
    live.unlink()
    _plan(camp)
    assert (camp / "campaign.json").is_file()
    assert (camp / "scripts" / "40-merge.sbatch").is_file()
    assert not dead.exists()
    # a real kill, as soon as the first script is there; the rerun completes whatever is left
    camp2 = tmp_path / "camp2"
    proc = subprocess.Popen([sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp2),
                             "--source", "sdist", "--python", "/bin/true"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = camp2 / "scripts" / "00-prepare.sbatch"
    deadline = time.monotonic() + 60
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.0005)
    proc.kill()
    proc.wait()
    _plan(camp2)
    assert (camp2 / "campaign.json").is_file()
    # anything that is not this plan's own stays refused
    (camp / "campaign.json").unlink()
    with (camp / "scripts" / "00-prepare.sbatch").open("a") as f:
        f.write("# mine\n")
    res = cli("slurm", "plan", str(camp), "--source", "sdist", "--python", "/bin/true")
    refused(res, ConfigError.exit_code, "not empty", "new or empty folder")
    assert (camp / "scripts" / "00-prepare.sbatch").read_text().endswith("# mine\n")


# ------------------------------------------------------------------ files read back (class 1/5)


@pytest.mark.parametrize("kind", ["binary", "huge", "fifo", "dev-zero"])
def test_diff_upstream_reads_a_tree_file_bounded_and_names_it(
        fetched_workdir: Path, kind: str) -> None:
    header = fetched_workdir / "trees" / "patched" / "csrc" / "attention" / \
        "attention_kernels.cuh"
    header.unlink()
    if kind == "binary":
        header.write_bytes(b"\xff\xfe\x00 not text")
    elif kind == "huge":
        with header.open("wb") as f:
            f.truncate(1 << 30)  # sparse: read whole, it was a GiB of memory (or a MemoryError)
    elif kind == "fifo":
        os.mkfifo(header)
    else:
        header.symlink_to("/dev/zero")
    for extra in ([], ["--check"]):
        res = cli("diff-upstream", "--workdir", str(fetched_workdir), *extra, timeout=60)
        refused(res, PatchError.exit_code, "cannot diff csrc/attention/attention_kernels.cuh"
                if kind != "binary" else "is not UTF-8 text", "move", "fetch --force")


@pytest.mark.parametrize(("field", "value"), [
    ("wall_s", None), ("wall_s", "x"), ("wall_s", []), ("wall_s", {}), ("wall_s", -1),
    ("wall_s", float("nan")), ("exit", "0"), ("what", "two\nlines"), ("commit", 5)])
def test_a_timing_run_with_a_field_of_the_wrong_kind_is_one_message(
        tmp_path: Path, field: str, value: object) -> None:
    run = {"what": "unit tests", "command": "pytest", "commit": "8e2532d", "how": "fresh",
           "exit": 0, "wall_s": 98, "source": "ci"}
    run[field] = value
    (tmp_path / "t.json").write_text(json.dumps({"machine": "m", "runs": [run]}))
    readme = tmp_path / "README.md"
    text = "# x\n<!-- timings t.json -->\nold\n<!-- /timings -->\n"
    readme.write_text(text)
    res = cli("report", "--readme", str(readme))
    refused(res, ConfigError.exit_code, "t.json", field)
    assert readme.read_text() == text


# ---------------------------------------------------------------------- option values (class 5)


def test_vmm_bench_refuses_rounds_that_time_nothing() -> None:
    """--rounds 0 (or below) passed even a dry run; the bench would time no round at all."""
    for rounds in ("0", "-3"):
        res = cli("vmm", "bench", "--dry-run", "--rounds", rounds)
        assert res.returncode == 2, res.stderr
        assert "--rounds" in res.stderr and "Traceback" not in res.stderr, res.stderr



@pytest.mark.parametrize("tail", [5, [5], "ab", {"a": 1}, [None], ["relative/bin"]])
def test_an_environment_marker_with_a_bad_path_tail_puts_nothing_on_path(
        tmp_path: Path, tail: object) -> None:
    """The build probes a reused env's python with ``environ()``, which put the marker's
    path_tail on PATH: a number was a TypeError traceback, a string went on letter by letter.
    Since the thirty-second pass the tail is never read from the marker (it is asked of the
    creator python), so whatever the marker holds there reaches neither PATH nor a traceback."""
    from kvprefetch.machine.envs import MARKER, VenvEnv

    path = tmp_path / "envs" / "baseline"
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "python").symlink_to(sys.executable)
    env = VenvEnv(path, python=sys.executable, with_pip=False)
    (path / MARKER).write_text(json.dumps({"kind": "venv", "state": "ready",
                                           "options": env.options(), "path_tail": tail}))
    assert env.environ({"PATH": "/usr/bin"})["PATH"] == f"{path / 'bin'}{os.pathsep}/usr/bin"
    assert (path / MARKER).is_file()



# ------------------------------------------------------------------------------ writers (class 2)


def test_a_file_the_user_names_keeps_its_permissions_when_replaced(
        fetched_workdir: Path, tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "t.json").write_text((root / "docs" / "timings" /
                                      "2026-12-03-fresh-machine.json").read_text())
    readme = tmp_path / "README.md"
    readme.write_text("# mine\n<!-- timings t.json -->\nold\n<!-- /timings -->\n")
    header = tmp_path / "attention_kernels.cuh"
    header.write_text("old\n")
    index = tmp_path / "results.md"
    index.write_text("old\n")
    shutil.copytree(root / "docs" / "results" / "2026-12-01-h200-decode",
                    tmp_path / "runs" / "2026-12-01-h200-decode")
    for p in (readme, header, index):
        p.chmod(0o600)
    for args in (["report", "--readme", str(readme)],
                 ["report", "--index", str(tmp_path / "runs"), "--out", str(index)],
                 ["export-header", "--workdir", str(fetched_workdir), "-o", str(header)]):
        res = cli(*args)
        assert res.returncode == 0, res.stderr
    for p in (readme, header, index):
        assert p.read_text() != "old\n" and "old\n<!-- /timings" not in p.read_text(), p
        assert (p.stat().st_mode & 0o777) == 0o600, p
