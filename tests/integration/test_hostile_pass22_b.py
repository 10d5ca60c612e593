"""Issue 41, the twenty-second hostile pass (tester b: campaigns from the command line, reports
and outputs). Each test fails without its fix (checked by reverting ``src`` and running it):

- ``slurm prepare`` makes the campaign's cached sdist read-only. It opened the file by path,
  ``O_NOFOLLOW`` on its last part only, after the download's checks: with ``cache/`` and a link
  to a folder outside exchanged by a ``renameat2`` loop, the chmod landed on the file of that
  name there, a user's own sdist in another work directory's ``downloads/`` (its mode 0644 was
  0444 by the 4th run of 12). Now the file is opened relative to ``cache/``, itself opened from
  the campaign down without following a link: a link swapped in is refused, nothing outside is
  touched. The test swaps the folder at the moment the race needs (deterministic).
- ``report --index R --out FILE`` read ``--out`` as a ``Path``, which drops a trailing ``/`` and
  reads ``''`` as ``.``: ``--out new/`` (a careless user's folder) wrote a *file* named ``new``
  (exit 0), ``--out ''`` said "cannot write .: a directory is in its place / To fix: move .
  away", and ``--out x/..`` made the folder ``x`` and said to move ``x/..`` away (1 run each;
  the twenty-first pass fixed the same for ``export-header -o``). Now ``--out`` is read as
  typed: with ``--index`` it is ``output_file``'s usage error, and an empty ``--out`` folder
  for the other modes names no folder (exit 2), nothing written.
- ``report --merge`` (and ``--repeats``) bounded each shard at 64 MiB of JSON, not their sum,
  and held them all in memory: eight gzip shards of 600 KB on disk (60 MiB of JSON each) took
  95 s and 2.9 GB, and under a 3 GB address-space limit (``ulimit -v``) ended in a
  ``SystemError`` traceback (1 run each; the twenty-first pass measured 20,000 small shards, 38 s
  and 1 GB). Now the shards together are held to the one-result cap: refused naming it (exit
  7) once their sum passes it, nothing written.
- ``slurm stand-in``/``resubmit --task 1000000`` (plain digits, past the six the task id takes)
  was refused as "not an array task id (0, 1, 2, ...: digits only, no sign, space, _ or leading
  zero)", a description of what was typed (1 run each). Now it says the task is past any
  campaign's last (tasks 0 to 999).
- ``report --index DIR`` with a folder 1,500 levels deep under DIR ended in a ``RecursionError``
  traceback (``Path.rglob`` calls itself once per level; the twenty-first pass fixed the same
  in ``hashing.walk`` and ``confine``; 1 run of 1). Now the runs are found by
  ``hashing.walk``: one message, exit 7. The same in ``slurm publish``'s look for FIFOs,
  devices and sockets in the scratch (``os.walk``; 1 run of 1): now ``hashing.walk``, and the
  deep build is published (16 s by hand).
- ``slurm publish`` with the scratch build's manifest.json, or its environment's build.json,
  nested 700 levels deep (json.loads takes it): ``rewrite_paths`` called itself once per level,
  a ``RecursionError`` traceback (1 run each). Now a build record nested past 64 levels is
  corrupt, named with the fix (exit 10), and nothing is published.
- ``slurm submit`` with a FIFO at a job script (scripts/20-verify.sbatch) sent prepare and both
  builds, then handed the FIFO to verify's sbatch, which opens and reads it (a real sbatch
  waits for a writer for ever; a link to /dev/zero is read without end); a fake sbatch that
  gives up said "failed ... To fix: run this on a Slurm login node" with half the campaign
  sent (1 run each). Now every script to be sent is looked at (``lstat``) before the first
  sbatch, in submit and resubmit: a non-regular file (or one past 1 MiB) is refused, named with
  the fix, nothing sent.
- ``fetch --source`` a FIFO, a device or a socket (``/dev/zero``) said "the directory /dev/zero
  has no csrc/attention/attention_kernels.cuh; it is not a vLLM source tree", a device called
  a folder (1 run each, real and dry run). Now what is there is named (exit 3).
- ``slurm plan --python /tmp``: a folder passes ``os.access(X_OK)``, so the plan was written
  (exit 0) and every job would fail on the node, "Is a directory" (1 run). Now refused (exit 2).
- ``report RESULT.json`` (md and png by default) drew one heatmap per group and variant, with
  a number in each cell: a 1 MB result of 600 groups took 150 s and 1.5 GB (1 run; a 64 MiB
  result holds tens of thousands). Now the figure holds at most 24 heatmaps (a title says how
  many of how many) and numbers only in heatmaps of at most 400 cells: 7 s. The same for
  ``bench ncu`` results: a bar group per shape and kernel, the figure as wide as they, took 59 s
  and 1.9 GB for 1,500 shapes (a 3 MB result; 1 run); now the first 48, 3 s.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_hostile_pass19_b import _plan
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_SRC = Path(__file__).resolve().parents[2] / "src"


def test_prepare_never_makes_a_file_outside_read_only_through_a_cache_swapped_for_a_link(
        tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cached sdist is checked, then ``cache/`` becomes a link to a folder outside that
    holds a file of the sdist's name (a user's other work directory): prepare refuses, and that
    file keeps its mode."""
    from kvprefetch import upstream
    from kvprefetch.errors import FetchError
    from kvprefetch.slurm.cluster import load
    from kvprefetch.slurm.prepare import source_cache
    from kvprefetch.sources import download

    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    (camp / "cache" / upstream.SDIST_NAME).write_bytes(b"the campaign's sdist\n")
    theirs = outside / upstream.SDIST_NAME  # inside the outside folder the fixture checks
    theirs.write_bytes(b"the user's own sdist\n")
    theirs.chmod(0o644)
    before = theirs.stat().st_mode

    def checked_then_swapped(path: Path, delete: bool = True, root: Path | None = None) -> None:
        # the hash is fine; the attacker then swaps cache/ for a link, as a renameat2 loop does
        (camp / "cache").rename(camp / "cache.real")
        (camp / "cache").symlink_to(outside, target_is_directory=True)

    monkeypatch.setattr(download, "verify_sdist", checked_then_swapped)
    c, _ = load(camp)
    with pytest.raises(FetchError) as err:
        source_cache(c)
    assert "symlink" in err.value.cause, err.value.cause
    assert stat.S_IMODE(theirs.stat().st_mode) == stat.S_IMODE(before)
    assert os.access(theirs, os.W_OK)
    theirs.unlink()  # the fixture's snapshot was taken without it


def _kit(tmp_path: Path, *args: str, timeout: float = 120,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    full.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path), HOME=str(tmp_path), **(env or {}))
    return subprocess.run([sys.executable, "-m", "kvprefetch", *args], env=full, cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.parametrize("spelling", ["new/", "new/.", "", "x/.."])
def test_an_index_out_naming_a_folder_or_nothing_is_a_usage_error(
        tmp_path: Path, spelling: str) -> None:
    """``report --index R --out new/`` (a folder not made yet) wrote a file named ``new``, exit
    0; ``--out ''`` said "move . away", ``--out x/..`` made ``x`` and said "move x/.. away".
    Now each is a usage error on the option as typed, and nothing is written."""
    runs = tmp_path / "runs"
    runs.mkdir()
    work = tmp_path / "w"
    work.mkdir()
    res = _kit(work, "report", "--index", str(runs), "--out", spelling)
    out = res.stdout + res.stderr
    assert res.returncode == 2 and "Traceback" not in out, out
    assert "--out" in out and "move" not in out, out
    assert sorted(os.listdir(work)) == [], os.listdir(work)


@pytest.mark.parametrize("mode", [["--merge"], ["--repeats", "runs"]])
def test_shards_holding_more_than_one_result_together_are_refused_before_they_fill_memory(
        tmp_path: Path, mode: list[str]) -> None:
    """Three gzip shards of 25 MiB of JSON each (a few KiB on disk; the padding in a key the
    report does not read): more than one result holds together, refused naming the cap
    (exit 7), nothing written. Eight shards of 60 MiB took 95 s and 2.9 GB before."""
    import gzip
    import json

    from tests.unit.test_report_merge import _shard

    shards = []
    for batch in (1, 8, 32):
        doc = _shard(batch) | {"padding": "x" * (25 << 20)}
        p = tmp_path / f"bench-{batch}.json.gz"
        p.write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=1))
        shards.append(str(p))
    out = tmp_path / "report"
    res = _kit(tmp_path, "report", *mode, *shards, "--out", str(out), "--formats", "md")
    text = res.stdout + res.stderr
    assert res.returncode == 7 and "Traceback" not in text, text
    assert "64 MiB" in text and "To fix" in text, text
    assert not out.exists() or not os.listdir(out)


@pytest.mark.parametrize("command", [["stand-in", "{camp}"], ["resubmit", "{camp}", "bench"]])
def test_a_task_id_of_too_many_digits_is_not_blamed_on_its_spelling(
        tmp_path: Path, command: list[str]) -> None:
    """``--task 1000000`` (plain digits) was refused as "not an array task id (0, 1, 2, ...:
    digits only, no sign, space, _ or leading zero)", which is what was typed. Now it says
    the task is past any campaign's last (exit 2)."""
    camp = tmp_path / "camp"
    argv = [a.format(camp=camp) for a in command]
    res = _kit(tmp_path, "slurm", *argv, "--task", "1000000")
    out = res.stdout + res.stderr
    assert res.returncode == 2 and "Traceback" not in out, out
    assert "digits only" not in out and "0 to 999" in out, out


def _deep(top: Path, levels: int) -> None:
    """A folder ``levels`` deep under ``top``, made relative to descriptors (its path grows
    past PATH_MAX)."""
    top.mkdir(parents=True, exist_ok=True)
    fd = os.open(top, os.O_RDONLY)
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
    finally:
        os.close(fd)


def test_an_index_over_a_folder_thousands_of_levels_deep_is_no_traceback(tmp_path: Path) -> None:
    """``report --index DIR`` with a folder 1,500 levels deep under DIR: ``Path.rglob`` calls
    itself once per level and ended in a ``RecursionError`` traceback. Now the runs are found
    by the kit's own walk: "no provenance.json under DIR", with its fix (exit 7)."""
    runs = tmp_path / "runs"
    _deep(runs, 1500)
    try:
        res = _kit(tmp_path, "report", "--index", str(runs))
    finally:  # pytest's own clean-up of tmp_path recurses once per level too
        subprocess.run(["rm", "-rf", "--", str(runs)], check=True)
    out = res.stdout + res.stderr
    assert "Traceback" not in out and "RecursionError" not in out, out[-2000:]
    assert res.returncode == 7 and "no provenance.json" in out and "To fix" in out, out


def test_a_scratch_folder_thousands_of_levels_deep_is_no_traceback_in_publish(
        tmp_path: Path) -> None:
    """``slurm publish`` first looks for a FIFO, device or socket in the scratch's build and
    environment; with ``os.walk`` a folder 1,500 levels deep there was a ``RecursionError``
    traceback. Now that look (``publish._refuse_special``) walks with the kit's own stack: it
    finds nothing to refuse in the deep folder, and names a FIFO at its bottom."""
    from kvprefetch.errors import SlurmError
    from kvprefetch.slurm.publish import _refuse_special

    env = tmp_path / "env"
    _deep(env, 1500)
    try:
        _refuse_special(env)
        bottom = env.joinpath(*["d"] * 1500)
        fd = os.open(env, os.O_RDONLY)
        for _ in range(1500):
            nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        os.mkfifo("pipe", dir_fd=fd)
        os.close(fd)
        with pytest.raises(SlurmError) as err:
            _refuse_special(env)
        assert str(bottom / "pipe") in err.value.cause
    finally:  # pytest's own clean-up of tmp_path recurses once per level too
        subprocess.run(["rm", "-rf", "--", str(env)], check=True)


@pytest.mark.parametrize("record", ["manifest.json", "build.json"])
def test_a_build_record_nested_hundreds_deep_in_the_scratch_is_corrupt_not_a_traceback(
        tmp_path: Path, record: str) -> None:
    """``slurm publish`` rewrites the paths in the scratch build's manifest.json and in the
    environment's build.json, calling itself once per level: either nested 700 deep (which
    json.loads still takes) was a ``RecursionError`` traceback. Now a record nested past
    ``MAX_JSON_DEPTH`` is corrupt, named (the scratch's file) with the fix; nothing published."""
    import json

    from tests.unit.test_slurm import _fake_scratch_build

    camp, scratch = tmp_path / "camp", tmp_path / "scratch"
    _plan(tmp_path, camp)
    _fake_scratch_build(scratch, "baseline")
    if record == "manifest.json":
        path = next((scratch / "build" / "baseline").glob("*/manifest.json"))
    else:
        path = next((scratch / "envs" / "baseline").rglob("kvprefetch_kernels/build.json"))
    deep: object = 1
    for _ in range(700):
        deep = {"k": deep}
    path.write_text(json.dumps(json.loads(path.read_text()) | {"extra": deep}))
    res = _kit(tmp_path, "slurm", "publish", str(camp), "--tree", "baseline", "--scratch",
               str(scratch), env={"SLURM_JOB_ID": "12"})
    out = res.stdout + res.stderr
    assert "Traceback" not in out, out[-2000:]
    if record == "manifest.json":
        # since the one bounded reader (reading.parse_json), a manifest nested past its depth is
        # one the kernels' finder cannot read, skipped as it always skipped those
        assert res.returncode == 10 and "no kernels-only build of baseline" in out, out
    else:
        assert res.returncode == 10 and f"{path} is corrupt" in out and "To fix" in out, out
    envs = camp / "work" / "envs"
    assert not envs.exists() or not any(envs.iterdir())


def _fake_sbatch_reading(tmp_path: Path) -> tuple[Path, Path]:
    """A ``bin`` folder whose ``sbatch`` records each call in ``calls``, reads its script as a
    real one does (given up after 3 s, where a real one waits on a FIFO for ever) and prints
    an id."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "sbatch").write_text(
        "#!/bin/bash\n"
        f'echo "$*" >> {calls}\n'
        'for last; do :; done\n'
        'timeout 3 head -c 1000000 -- "$last" > /dev/null || exit 1\n'
        "echo $$\n")
    (bin_dir / "sbatch").chmod(0o755)
    return bin_dir, calls


@pytest.mark.parametrize("planted", ["fifo", "device", "folder"])
def test_a_job_script_that_is_no_regular_file_is_refused_before_any_sbatch(
        tmp_path: Path, planted: str) -> None:
    """A FIFO at scripts/20-verify.sbatch had ``slurm submit`` send prepare and both builds,
    then stop at verify's sbatch (a real one waits for a writer for ever), its fix "run this on
    a Slurm login node"; a link to /dev/zero is read without end. Now every script is looked at
    (``lstat``) before the first sbatch: refused, named with the fix, nothing sent."""
    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    script = camp / "scripts" / "20-verify.sbatch"
    script.unlink()
    if planted == "fifo":
        os.mkfifo(script)
    elif planted == "device":
        script.symlink_to("/dev/zero")
    else:
        script.mkdir()
    bin_dir, calls = _fake_sbatch_reading(tmp_path)
    res = _kit(tmp_path, "slurm", "submit", str(camp),
               env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    out = res.stdout + res.stderr
    assert res.returncode == 10 and "Traceback" not in out, out
    assert f"the job script {script} is" in out and "nothing was sent" in out, out
    assert "To fix: move" in out, out
    assert not calls.exists(), calls.read_text()


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_a_source_that_is_a_fifo_is_named_as_one_not_as_a_folder(
        tmp_path: Path, dry_run: list[str]) -> None:
    """``fetch --source FIFO`` (or a device) said "the directory FIFO has no
    csrc/attention/attention_kernels.cuh": what is there is named now (exit 3), no hang."""
    fifo = tmp_path / "vllm.tar.gz"
    os.mkfifo(fifo)
    res = _kit(tmp_path, "fetch", "--workdir", str(tmp_path / "w"), "--source", str(fifo),
               *dry_run, timeout=60)
    out = res.stdout + res.stderr
    assert res.returncode == 3 and "Traceback" not in out, out
    assert "is a FIFO" in out and "the directory" not in out and "To fix" in out, out


def test_a_folder_as_the_jobs_python_is_refused_at_plan(tmp_path: Path) -> None:
    """``slurm plan --python /tmp`` (a folder passes ``os.access(X_OK)``) was planned, exit 0,
    and every job would fail on the node with "Is a directory". Now refused (exit 2)."""
    camp = tmp_path / "camp"
    res = _kit(tmp_path, "slurm", "plan", str(camp), "--stand-in", "--batch", "1", "--python",
               str(tmp_path))
    out = res.stdout + res.stderr
    assert res.returncode == 2 and "Traceback" not in out, out
    assert "--python" in out and "To fix" in out, out
    assert not camp.exists()


def _report_in_time(tmp_path: Path, name: str, doc: dict[str, Any], seconds: int,
                    last: str) -> None:
    """``report NAME.json`` of ``doc`` ends within ``seconds`` with a figure, and its markdown
    still lists the ``last`` row."""
    import json

    (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    try:
        res = _kit(tmp_path, "report", str(tmp_path / f"{name}.json"), "--out",
                   str(tmp_path / "out"), timeout=seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(f"report of {name}.json still drawing after {seconds} s")
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "Traceback" not in out, out
    assert (tmp_path / "out" / f"{name}.png").stat().st_size > 0
    assert last in (tmp_path / "out" / f"{name}.md").read_text()


def test_a_result_of_hundreds_of_groups_draws_a_bounded_figure(tmp_path: Path) -> None:
    """``report RESULT.json`` (png by default) drew one heatmap per group and variant: a 1 MB
    result of 600 groups (600 presets) took 150 s and 1.5 GB, and a 64 MiB one would run for
    hours. Now the figure holds at most ``render.MAX_PANELS`` heatmaps, saying so; the markdown
    lists every group. 400 groups: well within a minute, the png written."""
    import copy

    from tests.unit.test_report_merge import _row, _shard

    doc = _shard(1)
    rows = []
    for i in range(400):
        r = copy.deepcopy(_row(1, 1.5))
        r["preset"], r["label"] = f"p{i}", f"l{i}"
        rows.append(r)
    doc["results"] = rows
    _report_in_time(tmp_path, "many", doc, 60, "p399")


def test_an_ncu_result_of_thousands_of_shapes_draws_a_bounded_figure(tmp_path: Path) -> None:
    """``report NCU.json`` drew a group of bars per shape and kernel, the figure as wide as
    they: 1,500 shapes (a 3 MB result) took 59 s and 1.9 GB. Now the figure holds the first
    ``render.MAX_BARS``, saying so; the markdown lists them all. Here: a few seconds."""
    import copy

    from tests.unit.test_report import ncu_doc

    doc = ncu_doc()
    first = doc["shapes"][0]
    doc["shapes"] = [dict(copy.deepcopy(first), label=f"shape{i}") for i in range(1500)]
    _report_in_time(tmp_path, "ncu", doc, 40, "shape1499")
