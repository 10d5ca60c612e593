"""Issue 41, the twenty-fourth hostile pass (tester b: campaigns from the command line, reports
and outputs). Each test fails without its fix (checked by reverting ``src`` and running it):

- ``slurm submit`` (and ``status``, ``resubmit``) on a campaign.json whose ``sending`` records
  an sbatch of an array task the job does not have (``{"job": "merge", "task": 7}``: merge is
  no array job; or bench task 5 of a one-task array): its fix was "send it and the rest in
  order: `kvprefetch slurm resubmit CAMP merge --task 7`", which refused that task ("job merge
  is not an array job ... To fix: resubmit it without --task"), and `resubmit CAMP merge` was
  refused by the same unanswered sbatch, its fix the `--task 7` again: a loop of wrong-way
  messages (1 run each, with a stand-in sbatch). Now the record is corrupt, named with the
  squeue to look for such a job and the way to restore it (exit 2), nothing sent.
- ``slurm plan CAMP --trees 'baseline,mine\n=launch'``: the tree name rule
  (``upstream.TREE_NAME``) ended in ``$``, which also matches before a last newline, so
  ``mine\n`` passed ``check_tree_name`` and the plan was refused as "the campaign's job
  'build-mine\n' (script 'scripts/10-build-mine\n.sbatch') is not one kvprefetch plans / To fix:
  plan the campaign again", which fails the same way (a wrong-way message; 1 run). The same
  rule let a build manifest's tree ``baseline\n`` through (a file name with a newline in
  ``bench ncu``'s logs), and ``fetch --extra-tree``, ``apply --tree`` names ending in one. Now
  the rule ends in ``\\Z``: the name is refused as no tree name (exit 2), nothing written.
- ``bench e2e`` names each run's files ``runs/<env>-seqs<M>-r<R>.json``/``.log`` after the
  environments' names in the verify-kernel report: a name of 250 bytes (a plain name by pass
  23's rule) had the first environment's benchmark run, then the next one's log refused with
  "File name too long / To fix: use a shorter path ... (the --workdir, -o/--out or campaign
  folder that named it)", which the user's folder was not (a wrong-way message; 1 run with a
  stand-in python). Now a name of more than ``e2e.MAX_NAME_BYTES`` (200) is malformed, named
  with the fix to rewrite the report (exit 7; a dry run says it would refuse), nothing run.
- ``slurm plan CAMP`` again over a campaign.json that cannot be read (not JSON, no plan, a
  plan of no root, a tree of an unknown variant): the fix was "plan the campaign again", which
  is what was run (a re-plan reads the plan it replaces first), and without the file the
  folder is "not empty"; ``status``/``submit`` gave the same fix, and a plan of no root was
  told to "move the folder back to None" (wrong-way messages; 1 run each). Now the fix is to
  restore campaign.json or plan into a new folder (exit 2), nothing written.
- ``slurm publish`` of a scratch whose build folder (the build's key) has a 250-byte name:
  its temporary ``.<key>.publish-<job>`` was past one name's 255 bytes, and the message was
  "File name too long / To fix: use a shorter path ... (the --workdir, -o/--out or campaign
  folder that named it)", the user sent to the campaign (a wrong-way message; 1 run). Now the
  scratch's build folder is named with the fix to rebuild there (exit 10), nothing published.
- ``report --index R`` (and ``--check``) with a run whose ``provenance.json`` headline names a
  result that cannot be read (``/dev/zero``, a missing file, a name past 255 bytes): the fix
  was load_document's "pass a JSON file written by kvprefetch bench or verify, unedited", and
  the user passed a folder (a wrong-way message; 1 run each). Now the provenance.json and the
  name it gives are named, with the fix to name a result of that run there (exit 7).
- ``report --index R --out FILE/x.md`` (and ``report RESULT --out FILE/sub``: every output
  whose folder ``confine.ensure_dir`` makes without a root) where a part of the path is a file:
  "report failed: FILE: File exists / To fix: check the path and its file system", the cause
  a file that exists (a wrong-way message; 1 run each). Now the file in the way is named, not a
  folder, with the fix (exit 7).
- ``slurm plan CAMP --python CAMP/cache/py`` (or a link in the campaign to the real python, or
  a link of the user's to an interpreter in the campaign), re-planning a campaign: planned and
  submitted, every job running that interpreter from the campaign, which whoever can write it
  may replace (code taken from the campaign; ``--source`` in the campaign was refused, the
  interpreter was not; 1 run each, with a stand-in sbatch). Now ``--python`` (and the kit's
  checkout) in the campaign is refused at plan and in a campaign.json read back
  (``values.check_program_outside``, exit 2), nothing written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass19_b import _plan
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_SRC = Path(__file__).resolve().parents[2] / "src"


def _kit(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
         timeout: float = 120) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    full.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path), HOME=str(tmp_path), **(env or {}))
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=full, cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _stand_in_slurm(tmp_path: Path) -> Path:
    """A ``bin`` folder whose ``sbatch`` logs each call (and answers a job id), and whose
    ``scontrol`` says every job is unknown."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "sbatch").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/sbatch.calls\necho 41\n")
    (bin_ / "scontrol").write_text("#!/bin/sh\necho 'Invalid job id specified'\nexit 1\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    return bin_


@pytest.mark.parametrize(("job", "task"), [("merge", 7), ("bench", 5)])
def test_an_unanswered_sbatch_of_a_task_the_job_lacks_is_a_corrupt_record_not_a_loop(
        tmp_path: Path, job: str, task: int) -> None:
    camp = tmp_path / "camp"
    _plan(tmp_path, camp)  # one bench task
    record = camp / "campaign.json"
    data = json.loads(record.read_text())
    data["sending"] = {"job": job, "task": task, "at": "2026-12-06T20:00:00Z"}
    record.write_text(json.dumps(data))
    env = {"PATH": f"{_stand_in_slurm(tmp_path)}:/usr/bin:/bin"}
    for args in (("submit", str(camp)), ("status", str(camp)),
                 ("resubmit", str(camp), job), ("resubmit", str(camp), job, "--task", str(task))):
        res = _kit(tmp_path, "slurm", *args, env=env)
        out = res.stdout + res.stderr
        assert "Traceback" not in out, out[-2000:]
        assert res.returncode == 2, (args, out)
        assert f"{record} is corrupt" in out and "'sending'" in out, (args, out)
        assert f"--task {task}`" not in out, (args, out)  # the way that refused it
        assert "To fix" in out and f"squeue --me --name kvp-camp-{job}" in out, (args, out)
    assert not (tmp_path / "sbatch.calls").exists()


def test_a_tree_name_ending_in_a_newline_is_no_tree_name(tmp_path: Path) -> None:
    from kvprefetch.errors import ConfigError
    from kvprefetch.workspace.workdir import check_tree_name

    res = _kit(tmp_path, "slurm", "plan", str(tmp_path / "camp"), "--stand-in", "--batch", "1",
               "--trees", "baseline,mine\n=launch")
    out = res.stdout + res.stderr
    assert "Traceback" not in out, out[-2000:]
    assert res.returncode == 2, out
    assert "--trees 'mine\\n' is not a tree name" in out and "To fix" in out, out
    assert "plan the campaign again" not in out, out
    assert not (tmp_path / "camp").exists()
    with pytest.raises(ConfigError):
        check_tree_name("baseline\n")


def test_an_environments_name_too_long_for_its_runs_files_is_malformed_not_blamed_on_the_path(
        tmp_path: Path) -> None:
    wd = tmp_path / "work"
    (wd / "verify").mkdir(parents=True)
    py = tmp_path / "python"  # an environment's python with vLLM: a version, then a result
    py.write_text("#!/bin/bash\n"
                  'for a in "$@"; do [ "$a" = -c ] && { echo 0.10.2; exit 0; }; done\n'
                  'while [ $# -gt 0 ]; do [ "$1" = --output-json ] && f=$2; shift; done\n'
                  "echo '{\"tokens_per_second\": 100.0, \"num_requests\": 10, "
                  "\"elapsed_time\": 1.0}' > \"$f\"\n")
    py.chmod(0o755)
    long_name = "a" * 250
    (wd / "verify" / "report.json").write_text(json.dumps({
        "passed": True, "envs": {"baseline": {"python": str(py)}, long_name: {"python": str(py)}}}))
    res = _kit(tmp_path, "bench", "e2e", "--workdir", str(wd), "--max-num-seqs", "1",
               "--repeats", "1")
    out = res.stdout + res.stderr
    assert "Traceback" not in out, out[-2000:]
    assert res.returncode == 7, out
    assert "is malformed: an environment's name 'aaaa" in out and "at most 200 bytes" in out, out
    assert "use a shorter path" not in out, out
    runs = wd / "bench" / "e2e" / "runs"
    assert not runs.exists() or not any(runs.iterdir()), sorted(runs.iterdir())


@pytest.mark.parametrize("record", ["{garbage", "[]", '{"plan": {}}', "variant"])
def test_a_replan_over_a_campaign_json_it_cannot_read_says_how_out(tmp_path: Path,
                                                                    record: str) -> None:
    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    path = camp / "campaign.json"
    if record == "variant":
        data = json.loads(path.read_text())
        data["plan"]["trees"][1]["variant"] = "bogus"
        record = json.dumps(data)
    path.write_text(record)
    for args in (("plan", str(camp), "--stand-in", "--batch", "1", "--python", sys.executable),
                 ("status", str(camp))):
        res = _kit(tmp_path, "slurm", *args, env={"PATH": "/usr/bin:/bin"})
        out = res.stdout + res.stderr
        assert "Traceback" not in out, out[-2000:]
        assert res.returncode == 2, (args, out)
        if args[0] == "plan" or "variant" not in record:  # status's "plan again" leads here
            assert f"To fix: restore {path} as `kvprefetch slurm plan` wrote it, or plan the " \
                "campaign again into a new folder" in out, (args, out)
            assert "To fix: plan the campaign again\n" not in out, (args, out)
        assert "back to None" not in out, (args, out)
    assert path.read_text() == record


def test_a_scratch_build_whose_name_leaves_no_room_for_its_temporary_is_named(
        tmp_path: Path) -> None:
    from tests.unit.test_slurm import _fake_scratch_build

    camp, scratch = tmp_path / "camp", tmp_path / "scratch"
    _plan(tmp_path, camp)
    bdir = _fake_scratch_build(scratch, "baseline", key="k" * 250)
    res = _kit(tmp_path, "slurm", "publish", str(camp), "--tree", "baseline", "--scratch",
               str(scratch), env={"SLURM_JOB_ID": "12"})
    out = res.stdout + res.stderr
    assert "Traceback" not in out, out[-2000:]
    assert res.returncode == 10, out
    assert f"the build folder {bdir} in the scratch has a name of 250 bytes" in out, out
    assert "use a shorter path" not in out and "To fix: rebuild" in out, out
    envs = camp / "work" / "envs"
    assert not envs.exists() or not any(envs.iterdir())


def _one_run(tmp_path: Path) -> Path:
    """``runs/run1``: a committed run (its provenance.json and the result its headline names)."""
    import shutil

    run = tmp_path / "runs" / "run1"
    run.mkdir(parents=True)
    docs = Path(__file__).resolve().parents[2] / "docs" / "results"
    for name in ("provenance.json", "default-matrix.json"):
        shutil.copy(docs / "2026-12-01-h200-headline" / name, run / name)
    return run


@pytest.mark.parametrize("result", ["/dev/zero", "missing.json", "x" * 300])
def test_an_index_whose_headline_names_no_readable_result_names_the_provenance(
        tmp_path: Path, result: str) -> None:
    prov = _one_run(tmp_path) / "provenance.json"
    data = json.loads(prov.read_text())
    data["headline"] = [{"result": result, "variant": "patched"}]
    prov.write_text(json.dumps(data))
    for extra in ((), ("--check",)):
        res = _kit(tmp_path, "report", "--index", str(tmp_path / "runs"), "--out",
                   str(tmp_path / "index.md"), *extra)
        out = res.stdout + res.stderr
        assert "Traceback" not in out, out[-2000:]
        assert res.returncode == 7, out
        assert f"{prov}'s headline names the result" in out, out
        assert "pass a JSON file" not in out and f"To fix: name in {prov}" in out, out
    assert not (tmp_path / "index.md").exists()


@pytest.mark.parametrize("out", ["afile/x.md", "afile/sub/x.md"])
def test_an_output_under_a_file_names_the_file_in_the_way(tmp_path: Path, out: str) -> None:
    (tmp_path / "afile").write_text("mine\n")
    _one_run(tmp_path)
    res = _kit(tmp_path, "report", "--index", str(tmp_path / "runs"), "--out",
               str(tmp_path / out))
    out_text = res.stdout + res.stderr
    assert "Traceback" not in out_text, out_text[-2000:]
    assert res.returncode == 7, out_text
    assert f"{tmp_path / 'afile'} is a file, not a folder" in out_text, out_text
    assert "File exists" not in out_text and "Not a directory" not in out_text, out_text
    assert (tmp_path / "afile").read_text() == "mine\n"


@pytest.mark.parametrize("where", ["copy", "link-in", "link-to"])
def test_the_jobs_python_is_never_one_in_the_campaign(tmp_path: Path, where: str) -> None:
    import shutil

    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    before = (camp / "campaign.json").read_text()
    if where == "copy":
        py = camp / "cache" / "py"
        shutil.copy(sys.executable, py)
    elif where == "link-in":
        py = camp / "results" / "python"
        py.symlink_to(sys.executable)
    else:
        shutil.copy(sys.executable, camp / "cache" / "py")
        py = tmp_path / "mypython"
        py.symlink_to(camp / "cache" / "py")
    res = _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in", "--batch", "1", "--python",
               str(py), env={"PATH": "/usr/bin:/bin"})
    out = res.stdout + res.stderr
    assert "Traceback" not in out, out[-2000:]
    assert res.returncode == 2, out
    assert f"--python {py} is in the campaign {camp}" in out and "To fix" in out, out
    assert (camp / "campaign.json").read_text() == before
    assert str(py) not in (camp / "scripts" / "00-prepare.sbatch").read_text()
