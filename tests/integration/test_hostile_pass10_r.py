"""Issue 41, the tenth hostile pass (tester r: Slurm steps end to end with fake ``sbatch`` /
``scontrol`` / ``sacct`` on PATH, environment variables no pass swept, ``bench ncu`` /
``verify-kernel`` / ``bench kernel --sample*`` options). Each test fails without its fix
(checked by reverting ``src`` to the pass's base commit):

- ``slurm status`` on an ``scontrol -o show job`` line with no ``JobId`` field (``ArrayJobId=5
  JobState=RUNNING``, ``XJobId=5``) was a ``KeyError`` traceback; an ``sacct`` line with an
  empty state (``5||0:0``) an ``IndexError`` traceback;
- values Slurm printed (state, reason, id, sbatch's error) reached the terminal raw: an escape
  sequence cleared or retitled it;
- ``sbatch --parsable`` printing ``²`` (``str.isdigit``) was taken as a job id and recorded,
  and every later command then refused campaign.json as corrupt;
- ``slurm status --wait --timeout nan`` (or ``inf``) never gave up; ``-5`` said "after -5 s";
- ``slurm publish`` with a FIFO in the scratch blamed the destination ("free space or fix the
  permissions"), a device there was copied without end, and ``--logs-only`` kept nothing;
- a result file that is a symlink: the fix said to replace it "by a real directory";
- ``bench ncu --out ''`` wrote ncu's log into the current folder; a FIFO at the CSV ncu's
  output is read from hung the run.

The autouse ``outside`` fixture checks that a folder outside the campaign is byte-identical
afterwards."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_reliability import _env, outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_REPO = Path(__file__).resolve().parents[2]

_FAKE = """#!/bin/bash
# a fake {name}: prints the file $FAKE_{upper} names (else {default}), exits $FAKE_{upper}_RC
if [ -n "$FAKE_{upper}" ]; then cat "$FAKE_{upper}"; exit ${{FAKE_{upper}_RC:-0}}; fi
{default}
"""


def _fake_slurm(tmp_path: Path) -> Path:
    """A folder of fake ``sbatch`` (ids 101, 102, ...), ``scontrol`` and ``sacct``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    counter = tmp_path / "sbatch-counter"
    defaults = {
        "sbatch": f'n=$(cat {counter} 2>/dev/null || echo 100); n=$((n+1)); '
                  f'echo $n > {counter}; echo "$n;cluster"',
        "scontrol": 'echo "JobId=$4 JobState=COMPLETED Reason=None ExitCode=0:0"',
        "sacct": "exit 1",
    }
    for name, default in defaults.items():
        p = bin_dir / name
        p.write_text(_FAKE.format(name=name, upper=name.upper(), default=default))
        p.chmod(0o755)
    return bin_dir


def _kit(tmp_path: Path, *args: str, **fake: str) -> subprocess.CompletedProcess[str]:
    """This checkout's CLI with the fake Slurm first on PATH and ``FAKE_*`` set."""
    env = dict(_env(), PYTHONPATH=str(_REPO / "src"), TMPDIR=str(tmp_path))
    env["PATH"] = f"{tmp_path / 'bin'}:{env.get('PATH', '')}"
    env.update(fake)
    try:
        return subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=env,
                              capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"kvprefetch {args!r} hung")


def _no_traceback(res: subprocess.CompletedProcess[str]) -> str:
    text = res.stdout + res.stderr
    assert "Traceback" not in text, text
    return text


@pytest.fixture
def submitted(tmp_path: Path) -> Path:
    """A stand-in campaign planned and submitted with the fake sbatch (ids 101..106)."""
    _fake_slurm(tmp_path)
    camp = tmp_path / "camp"
    for args in (("plan", str(camp), "--stand-in", "--batch", "1,8"), ("submit", str(camp))):
        res = _kit(tmp_path, "slurm", *args)
        assert res.returncode == 0, res.stderr
    return camp


def test_scontrol_and_sacct_lines_without_the_fields_are_no_traceback(
        tmp_path: Path, submitted: Path) -> None:
    """``scontrol -o show job`` printing a line with ``JobId=`` inside another field name
    (``ArrayJobId=12 JobState=RUNNING``, ``XJobId=5 ...``) and no ``JobId`` field: a
    ``KeyError: 'JobId'`` traceback. ``sacct`` printing ``5||0:0`` (no state): an
    ``IndexError`` traceback. Now the first is UNKNOWN ("scontrol printed no job record"; the
    wait keeps asking), the second's state UNKNOWN."""
    for line in ("ArrayJobId=12 JobState=RUNNING\n", "XJobId=5 JobState=RUNNING\n"):
        out = tmp_path / "scontrol.out"
        out.write_text(line)
        res = _kit(tmp_path, "slurm", "status", str(submitted), FAKE_SCONTROL=str(out))
        text = _no_traceback(res)
        assert res.returncode == 0, text
        assert "UNKNOWN" in text and "no job record" in text, text
    forgotten = tmp_path / "forgotten.out"
    forgotten.write_text("slurm_load_jobs error: Invalid job id specified\n")
    acct = tmp_path / "sacct.out"
    for line in ("5||0:0\n", "5| |0:0\n"):
        acct.write_text(line)
        res = _kit(tmp_path, "slurm", "status", str(submitted), "--json",
                   FAKE_SCONTROL=str(forgotten), FAKE_SCONTROL_RC="1", FAKE_SACCT=str(acct))
        text = _no_traceback(res)
        assert res.returncode == 0, text
        assert '"state": "UNKNOWN"' in res.stdout and '"source": "sacct"' in res.stdout, text


def test_control_characters_slurm_prints_do_not_reach_the_terminal(
        tmp_path: Path, submitted: Path) -> None:
    """An escape sequence in a job's id, state or reason as scontrol printed it (``\\x1b[2J``
    clears the screen, ``\\x1b]0;...\\x07`` retitles the terminal), or in the last line of a
    failed scontrol or sbatch, was printed raw. Now each is escaped (``\\x1b``)."""
    out = tmp_path / "scontrol.out"
    out.write_text("JobId=1\x1b[31m JobState=RUN\x1b]0;pwn\x07NING Reason=\x1b[2J\n")
    for rc in ("0", "1"):
        res = _kit(tmp_path, "slurm", "status", str(submitted), FAKE_SCONTROL=str(out),
                   FAKE_SCONTROL_RC=rc)
        text = _no_traceback(res)
        assert res.returncode == 0, text
        assert "\x1b" not in text and "\x07" not in text, text
        assert "\\x1b[2J" in text, text
    err = tmp_path / "sbatch.err"
    err.write_text("sbatch: error: \x1b[2Jrefused\n")
    res = _kit(tmp_path, "slurm", "resubmit", str(submitted), "merge", FAKE_SBATCH=str(err),
               FAKE_SBATCH_RC="1")
    text = _no_traceback(res)
    assert res.returncode != 0 and "To fix" in text, text
    assert "\x1b" not in text and "\\x1b[2Jrefused" in text, text


def test_an_sbatch_id_of_non_ascii_digits_is_not_recorded(tmp_path: Path) -> None:
    """``sbatch --parsable`` printing ``²`` (or Arabic-Indic digits): ``str.isdigit`` took it
    as a job id, submit recorded it, and every later command (status, resubmit, submit)
    refused campaign.json as corrupt, a record the kit itself had written. Now it is "sbatch
    printed '²', not a job id" and campaign.json stays readable."""
    _fake_slurm(tmp_path)
    camp = tmp_path / "camp"
    assert _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in").returncode == 0
    answer = tmp_path / "sbatch.out"
    answer.write_text("\u00b2\n")
    res = _kit(tmp_path, "slurm", "submit", str(camp), FAKE_SBATCH=str(answer))
    text = _no_traceback(res)
    assert res.returncode != 0 and "not a job id" in text, text
    res = _kit(tmp_path, "slurm", "status", str(camp))
    text = _no_traceback(res)
    assert "corrupt" not in text, text


@pytest.mark.parametrize("value", ["nan", "inf", "-5"])
def test_a_wait_timeout_that_never_ends_is_refused(tmp_path: Path, submitted: Path,
                                                   value: str) -> None:
    """``slurm status --wait --timeout nan`` with a job still running: NaN compares false, so
    the wait never gave up (a hang); ``inf`` the same; ``-5`` gave up at once saying "after
    -5 s". Now each is a usage error naming the range (0 to a year)."""
    out = tmp_path / "scontrol.out"
    out.write_text("JobId=1 JobState=RUNNING\n")
    env = {"FAKE_SCONTROL": str(out)}
    try:
        res = subprocess.run(
            [sys.executable, "-m", "kvprefetch", "slurm", "status", str(submitted), "--wait",
             "--timeout", value],
            env={**_env(), "PYTHONPATH": str(_REPO / "src"), "TMPDIR": str(tmp_path),
                 "PATH": f"{tmp_path / 'bin'}:{_env().get('PATH', '')}", **env},
            capture_output=True, text=True, timeout=10, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"slurm status --wait --timeout {value} never gave up")
    text = _no_traceback(res)
    assert res.returncode == 2 and "--timeout" in text and "finite number" in text, text


def test_a_fifo_in_the_scratch_is_named_not_blamed_on_the_destination(tmp_path: Path) -> None:
    """``slurm publish`` (and ``--logs-only``) with a FIFO in the scratch build's folder:
    copytree's "copying ... failed: ... is a named pipe / To fix: free space or fix the
    permissions of the destination" sent the user to the campaign, and ``--logs-only`` kept no
    log at all. Now publish names the FIFO in the scratch and the fix (remove it), and
    ``--logs-only`` keeps the logs without it."""
    import os

    from tests.unit.test_slurm import _fake_scratch_build

    _fake_slurm(tmp_path)
    camp, scratch = tmp_path / "camp", tmp_path / "scratch"
    assert _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in").returncode == 0
    bdir = _fake_scratch_build(scratch, "patched")
    os.mkfifo(bdir / "logs" / "pipe")
    res = _kit(tmp_path, "slurm", "publish", str(camp), "--tree", "patched", "--scratch",
               str(scratch), SLURM_JOB_ID="77")
    text = _no_traceback(res)
    assert res.returncode != 0 and "FIFO" in text and "remove it from the scratch" in text, text
    assert "free space" not in text, text
    assert not (camp / "work" / "build" / "patched" / "k1").exists()
    res = _kit(tmp_path, "slurm", "publish", str(camp), "--tree", "patched", "--scratch",
               str(scratch), "--logs-only", SLURM_JOB_ID="78")
    text = _no_traceback(res)
    assert res.returncode == 0, text
    kept = camp / "logs" / "build-patched-78" / "k1" / "logs"
    assert (kept / "01-compile.log").is_file() and not os.path.lexists(kept / "pipe"), text


def test_a_result_file_that_is_a_symlink_is_moved_away_not_made_a_folder(
        tmp_path: Path, outside: Path) -> None:
    """``slurm stand-in --task 1`` with ``results/bench-1.json`` a symlink to a file outside:
    refused (nothing written through it), but the fix said "replace the symlink ... by a real
    directory", a folder where the kit writes a file (the next run then failed on it). Now
    the fix is to move the symlink away, its target left as it is."""
    _fake_slurm(tmp_path)
    camp = tmp_path / "camp"
    assert _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in", "--batch", "1,8"
                ).returncode == 0
    from tests.unit.test_slurm import _fake_scratch_build

    for i, tree in enumerate(("baseline", "patched")):
        _fake_scratch_build(tmp_path / f"scratch-{tree}", tree)
        res = _kit(tmp_path, "slurm", "publish", str(camp), "--tree", tree, "--scratch",
                   str(tmp_path / f"scratch-{tree}"), SLURM_JOB_ID=str(10 + i))
        assert res.returncode == 0, res.stderr
    shard = camp / "results" / "bench-1.json"
    shard.symlink_to(outside / "notes.txt")
    res = _kit(tmp_path, "slurm", "stand-in", str(camp), "--task", "1")
    text = _no_traceback(res)
    assert res.returncode != 0 and "is a symlink" in text, text
    assert f"move the symlink {shard} away" in text and "real directory" not in text, text
    assert (outside / "notes.txt").read_text() == "keep me\n"


def _published_workdir(tmp_path: Path) -> Path:
    """A work directory holding fake kernels-only builds of baseline and patched (published
    by ``slurm publish`` into a campaign's ``work/``)."""
    from tests.unit.test_slurm import _fake_scratch_build

    _fake_slurm(tmp_path)
    camp = tmp_path / "camp"
    assert _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in").returncode == 0
    for i, tree in enumerate(("baseline", "patched")):
        _fake_scratch_build(tmp_path / f"scratch-{tree}", tree)
        res = _kit(tmp_path, "slurm", "publish", str(camp), "--tree", tree, "--scratch",
                   str(tmp_path / f"scratch-{tree}"), SLURM_JOB_ID=str(10 + i))
        assert res.returncode == 0, res.stderr
    return camp / "work"


def _fake_ncu(tmp_path: Path) -> Path:
    ncu = tmp_path / "bin" / "fakencu"
    ncu.write_text("#!/bin/bash\necho fake ncu >&2\nexit 0\n")
    ncu.chmod(0o755)
    return ncu


def test_bench_ncu_out_empty_writes_nowhere_and_a_csv_fifo_is_no_hang(tmp_path: Path) -> None:
    """``bench ncu --out ''``: ``Path('')`` is ``.``, so ncu's log was written into the
    current folder, outside the work directory; ``--out FIFO`` was "File exists / check the
    path". A FIFO planted at ``bench/ncu-1-baseline.csv`` (where ncu's CSV is read back) hung
    the read for ever; a CSV ncu never wrote was "No such file or directory / check the path
    and its file system". Now '' and a FIFO are usage errors, and the CSV is read as a record
    (regular file only): "Nsight Compute left no readable CSV", pointing at ncu's log."""
    import os

    wd = _published_workdir(tmp_path)
    ncu = _fake_ncu(tmp_path)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = dict(_env(), PYTHONPATH=str(_REPO / "src"), TMPDIR=str(tmp_path))
    base = [sys.executable, "-m", "kvprefetch", "bench", "ncu", "--workdir", str(wd), "--ncu",
            str(ncu), "--shape", "1x1k"]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for out in ("", str(fifo)):
        res = subprocess.run([*base, "--out", out], cwd=cwd, env=env, capture_output=True,
                             text=True, timeout=60, check=False)
        assert res.returncode == 2 and "--out" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr and list(cwd.iterdir()) == [], res.stderr
    (wd / "bench").mkdir()
    os.mkfifo(wd / "bench" / "ncu-1-baseline.csv")
    for _ in range(2):
        try:
            res = subprocess.run(base, cwd=cwd, env=env, capture_output=True, text=True,
                                 timeout=30, check=False)
        except subprocess.TimeoutExpired:
            pytest.fail("bench ncu hung reading a FIFO as ncu's CSV")
        assert res.returncode != 0 and "left no readable CSV" in res.stderr, res.stderr
        assert "ncu-1-baseline.log" in res.stderr and "Traceback" not in res.stderr, res.stderr
        (wd / "bench" / "ncu-1-baseline.csv").unlink(missing_ok=True)  # then: no CSV at all
