"""Issue 41, the thirtieth hostile pass (tester b: the job scripts as they run on a node, and
``report --readme``). Each test fails without its fix (checked by reverting ``src`` and running
it):

- A user's README text lost: a report block whose ``<!-- /report -->`` was forgotten (or
  mistyped) before the next block was regenerated from its opening line to the *next*
  block's end marker: the user's prose between, and the next block's first line, were replaced
  by the table, exit 0, "regenerated a.json"; ``--check`` had sent the user to that very
  command. Now ``report --readme`` (and ``--check``) refuse a block not closed by its own end
  marker before the next block opens (or the file ends), naming both lines, and write nothing
  (``readme_blocks.check_block_nesting``).
- Wrong-way message: a README with CRLF line ends holds no block kvprefetch recognises: it said
  "up to date", and ``--check`` "every report block matches its JSON", of none. Now it names
  the CRLF block and the conversion.
- A README growing without end: a timings file whose ``machine`` held ``<!-- /timings -->``
  (or a newline; only the runs' fields were checked, and ``<!--`` in them passed
  ``isprintable``) ended the block early, and every later ``report --readme`` copied the rest
  after the block again, one line a run, ``--check`` never passing (the seventh pass's class for
  report blocks). Now the machine and every text field must be one line without a comment
  marker (``timings._one_line``).
- Wrong-way message: the stand-in bench job passed an array task id off the array to ``slurm
  stand-in`` unchecked (click's "correct the command line"); see its test.
- Wrong-way message: a build job of a ``--scratch node`` campaign whose ``SLURM_TMPDIR`` is
  relative (`` /x``, ``../``) or a file was told to "plan the campaign again with --scratch
  node" (what it was) "or set the node TMPDIR" (which SLURM_TMPDIR overrides). Both messages now
  name the variables the scratch comes from (``shell.SCRATCH_OUTSIDE_SH``).
- Found by this pass and closed by the lead: a ``SLURM_JOB_ID`` of 11 to 21 digits (no Slurm
  job id, which is 32 bits) passed the job's own check, and a build job failed only at its
  publish ("run this step inside the Slurm job"); the job now refuses each id, and each part of
  an array task's ``A_T``, past 10 digits. And a README block naming a file that does not
  exist was told to "pass a JSON file written by kvprefetch bench": it is told to point the
  block at one that exists.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.integration.test_hostile_pass24_c import _REPO, _kit

_RESULT = _REPO / "docs" / "results" / "2026-12-01-h200-default-matrix" / "default-matrix.json"


def test_an_unclosed_block_never_eats_the_users_text(tmp_path: Path) -> None:
    shutil.copy(_RESULT, tmp_path / "a.json")
    shutil.copy(_RESULT, tmp_path / "b.json")
    readme = tmp_path / "R.md"
    text = ("# Title\n<!-- report a.json summary -->\nold\n\nMY OWN PROSE, kept\n\n"
            "<!-- report b.json summary -->\nold\n<!-- /report -->\ntail\n")
    readme.write_text(text)
    for extra in ((), ("--check",)):
        res = _kit(tmp_path, "report", "--readme", str(readme), *extra)
        err = res.stdout + res.stderr
        # without the fix: exit 0, "regenerated a.json", the prose and b's opening line gone
        assert res.returncode == 7 and "Traceback" not in err, err
        assert "the block opened at line 2" in err and "line 7 holds" in err, err
        assert "To fix: close the block with `<!-- /report -->`" in err, err
        assert readme.read_text() == text
    # never closed at all: nothing would be regenerated, and it said "up to date"
    readme.write_text("<!-- commands -->\nold\n")
    res = _kit(tmp_path, "report", "--readme", str(readme), "--check")
    assert res.returncode == 7 and "before the file ends" in res.stderr, res.stderr
    # the fix, as given, regenerates it
    readme.write_text(text.replace("\n\nMY OWN", "\n<!-- /report -->\n\nMY OWN"))
    res = _kit(tmp_path, "report", "--readme", str(readme))
    assert res.returncode == 0, res.stderr
    assert "MY OWN PROSE, kept" in readme.read_text()
    assert readme.read_text().count("| mode |") == 2


def test_a_readme_with_crlf_line_ends_is_named_not_up_to_date(tmp_path: Path) -> None:
    shutil.copy(_RESULT, tmp_path / "a.json")
    readme = tmp_path / "R.md"
    text = "# t\r\n<!-- report a.json summary -->\r\nold\r\n<!-- /report -->\r\n"
    readme.write_bytes(text.encode())
    res = _kit(tmp_path, "report", "--readme", str(readme), "--check")
    # without the fix: exit 0, "every report block matches its JSON"
    assert res.returncode == 7, res.stdout + res.stderr
    assert "line 2" in res.stderr and "CRLF" in res.stderr and "To fix" in res.stderr
    assert readme.read_bytes() == text.encode()


def test_a_timings_machine_holding_an_end_marker_is_refused(tmp_path: Path) -> None:
    run = {"what": "w", "command": "c", "commit": "abc", "how": "h", "exit": 0, "wall_s": 5,
           "source": "s"}
    readme = tmp_path / "R.md"
    text = "<!-- timings t.json -->\n<!-- /timings -->\nUSER\n"
    for machine, field in (("M <!-- /timings --> x", None), ("M\nsecond line", None),
                           ("M", "x <!-- /timings --> y")):
        doc = {"machine": machine, "runs": [run | ({"how": field} if field else {})]}
        (tmp_path / "t.json").write_text(json.dumps(doc))
        readme.write_text(text)
        for _ in range(2):
            res = _kit(tmp_path, "report", "--readme", str(readme))
            # without the fix: exit 0, and R.md one line longer each run
            assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
            assert "To fix" in res.stderr and "<!--" in res.stderr, res.stderr
            assert readme.read_text() == text


def test_a_stand_in_task_id_off_the_array_is_the_jobs_message(tmp_path: Path) -> None:
    """Wrong-way message: the stand-in bench job passed ``$SLURM_ARRAY_TASK_ID`` to ``slurm
    stand-in --task`` unchecked, so a task id of ``0001`` (the script sent by hand) was click's
    "Invalid value for '--task' ... To fix: correct the command line", a command line the job
    wrote, and one past the array "To fix: pass the array task id". The job now checks it as
    the timed bench job does (``_bench_task_sh``), naming the tasks and the resubmit."""
    import subprocess

    camp = tmp_path / "camp"
    made = _kit(tmp_path, "slurm", "plan", "--stand-in", "--no-gpu", "--batch", "1,8", str(camp))
    assert made.returncode == 0, made.stdout + made.stderr
    for task in ("0001", "2"):
        env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "5", "SLURM_ARRAY_JOB_ID": "5",
               "SLURM_ARRAY_TASK_ID": task, "TMPDIR": str(tmp_path)}
        res = subprocess.run(["bash", str(camp / "scripts" / "30-bench.sbatch")], cwd="/",
                             env=env, capture_output=True, text=True, timeout=60, check=False)
        # without the fix: "correct the command line" (0001), "pass the array task id" (2)
        assert res.returncode == 2, res.stdout + res.stderr
        assert f"the array task id '{task}' is not one of this campaign's bench tasks, 0 to 1" \
            in res.stderr, res.stderr
        assert f"kvprefetch slurm resubmit {camp} bench --task N" in res.stderr
        assert (camp / "logs" / f"bench-5_{task}.exit").read_text() == "2\n"


def test_a_node_scratch_variable_that_is_no_folder_is_named_as_the_fix(tmp_path: Path) -> None:
    import subprocess

    camp = tmp_path / "camp"
    made = _kit(tmp_path, "slurm", "plan", "--stand-in", "--no-gpu", "--batch", "1", str(camp))
    assert made.returncode == 0, made.stdout + made.stderr
    (tmp_path / "file").write_text("x")
    for value in (" /x", "../", str(tmp_path / "file")):
        env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "5", "TMPDIR": str(tmp_path),
               "SLURM_TMPDIR": value}
        res = subprocess.run(["bash", str(camp / "scripts" / "10-build-patched.sbatch")],
                             cwd="/", env=env, capture_output=True, text=True, timeout=60,
                             check=False)
        assert res.returncode == 2, res.stdout + res.stderr
        # without the fix: "plan the campaign again with --scratch node ..." (it was node)
        assert "To fix: submit with the variables --scratch names" in res.stderr, res.stderr
        assert "SLURM_TMPDIR where set, else TMPDIR" in res.stderr, res.stderr
    assert (tmp_path / "file").read_text() == "x"


def test_a_job_id_past_ten_digits_is_refused_by_the_job_itself(tmp_path: Path) -> None:
    """An 11-digit ``SLURM_JOB_ID`` (or array job id): refused at the job's start as no Slurm job
    id, before any scratch; 10 digits run."""
    from tests.integration.test_hostile_pass20_d import _plan, _run

    camp = tmp_path / "camp"
    _plan(tmp_path, camp, python="/bin/true")
    for env in ({"SLURM_JOB_ID": "9" * 11}, {"SLURM_JOB_ID": "8", "SLURM_ARRAY_JOB_ID": "9" * 11,
                                             "SLURM_ARRAY_TASK_ID": "0"}):
        res = _run(tmp_path, camp, "10-build-baseline.sbatch", **env)
        assert res.returncode == 2, (env, res.stdout + res.stderr)
        assert "is longer than any Slurm job id" in res.stderr, res.stderr
    res = _run(tmp_path, camp, "00-prepare.sbatch", SLURM_JOB_ID="4294967295")
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_block_naming_a_missing_file_is_told_to_point_the_block_elsewhere(
        tmp_path: Path) -> None:
    readme = tmp_path / "R.md"
    text = "# runs\n<!-- report gone.json summary -->\n<!-- /report -->\n"
    readme.write_text(text)
    for extra in ((), ("--check",)):
        res = _kit(tmp_path, "report", "--readme", str(readme), *extra)
        assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
        assert f"names {tmp_path / 'gone.json'}, which does not exist" in res.stderr, res.stderr
        assert "To fix: point the block at a result file" in res.stderr, res.stderr
    assert readme.read_text() == text
