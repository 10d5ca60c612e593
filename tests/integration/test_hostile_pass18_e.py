"""Issue 41, the eighteenth hostile pass (tester e: campaigns, job scripts and read-back files,
re-attacking the seventeenth pass's job PATH). Each test fails without its fix (checked by
reverting ``src`` and running it):

- The seventeenth pass had the jobs' PATH leave out the planner's entries that are not
  absolute or are in the campaign, by their text (``posixpath.normpath``). ``//campaign/bin``
  (normpath keeps two leading slashes) and an entry reaching the campaign through a link of
  the user's (``/home`` -> ``/gpfs/home``, or any alias of the campaign's path) passed, and a
  ``hostname`` planted in the campaign's ``bin/`` ran as the user in the job and wrote a file
  outside (2 cases of 2).
- A job inherits the submitter's environment (sbatch's ``--export=ALL``) and runs its first
  programs in the campaign folder (``hostname``, ``date``; ``write_new``'s ``mktemp``, ``dd``
  and ``mv`` in ``logs/``): a careless ``LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/cuda/lib64``, an
  empty first entry, is the working folder to the dynamic loader, and a ``libacl.so.1``
  planted in ``logs/`` was loaded into ``mv`` and ran as the user (a file outside written).
  ``.``, a relative entry and a link to the campaign the same.

- A ``campaign.json`` whose batch sizes and bench job's array were edited together (the job
  list the plan gives for them, so the seventeenth pass's job check took it) was used as it
  stood: 100,000 batch sizes had ``slurm status`` run for 111 s (a million: about 20
  minutes), and repeated sizes, which the plan drops, were taken. Now a campaign has at most
  1000 batch sizes, each once, at plan and read-back (exit 2 with a fix).
- ``slurm publish`` took a scratch build manifest's ``env.path`` for any folder of the
  scratch holding the library: a NUL in it was ``os.path.realpath``'s ``ValueError``, and the
  scratch root itself (the library under both it and the build folder) was a ``relative_to``
  ``ValueError``, both tracebacks, after the whole scratch had been copied into the campaign.
  Now the env must be the scratch's ``envs/<tree>``, the one published, or the manifest is
  named (exit 10 with a fix).
- ``bench e2e`` checked vLLM's throughput result with ``math.isfinite``: a 400-digit integer
  at ``tokens_per_second`` was an ``OverflowError`` traceback, and 1.7e308 tokens over
  5e-324 s an infinite rate the plot refused with a message blaming matplotlib (reinstall
  it). Now each of the three numbers is compared, never converted, with 1e-9 to 1e12.
- ``report --index`` took a run's ``provenance.json`` fields on trust: a ``tree`` of 0,
  null or an object was a ``TypeError`` traceback (``tree[:12]``), a ``date`` of a number one
  in the sort beside other runs, and a newline in a title broke the index's table. Now the
  seven text fields must be text of one line, or the file and the fields are named (exit 7).
- Slurm starts a job in the folder sbatch ran in: a user who ran ``slurm submit .`` from the
  campaign folder, with such an ``LD_LIBRARY_PATH``, had every job's bash load a
  ``libtinfo.so.6`` planted in the campaign before the script's first line (a file outside
  written), where no filter in the script can reach. Now sbatch is given ``--chdir=/`` and,
  like scontrol and sacct, runs from ``/``.
- ``slurm status`` read a forgotten job's exit record of 256 or a 23-digit number as its
  exit code (FAILED, "256:0"); a shell's status is 0 to 255. Now such a record is named as
  holding no exit status (ENDED).

Now each job, before it runs any program, keeps of PATH and LD_LIBRARY_PATH only the entries
that are absolute and neither are in nor reach (through any folder on their way) the
campaign as the node sees it, with shell builtins; ``slurm plan``'s own check folds ``//``.
Slurm is absent: the job scripts are run by bash as Slurm runs them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

_SRC = Path(__file__).resolve().parents[2] / "src"


def _plan(tmp_path: Path, camp: Path, path: str, python: str = "/bin/true") -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path), PATH=path)
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp),
                          "--stand-in", "--python", python], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout + res.stderr


def _run_job(tmp_path: Path, camp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    job_env = {"HOME": str(tmp_path), "SLURM_JOB_ID": "7", "PATH": "/usr/bin:/bin", **env}
    return subprocess.run(["bash", str(camp / "scripts" / "00-prepare.sbatch")], env=job_env,
                          capture_output=True, text=True, timeout=60, check=False, cwd="/")


@pytest.mark.parametrize("how", ["double-slash", "link"])
def test_a_planners_path_entry_reaching_the_campaign_by_another_name_is_left_out(
        tmp_path: Path, outside: Path, how: str) -> None:
    """``//<campaign>/bin`` or ``<link to the campaign's parent>/camp/bin`` on the planner's
    PATH: a ``hostname`` planted in the campaign's bin/ never runs in the job."""
    camp, bad = tmp_path / "camp", outside / "ran-by-the-job"
    (tmp_path / "alias").symlink_to(tmp_path)
    entry = "/" + str(camp / "bin") if how == "double-slash" else str(tmp_path / "alias/camp/bin")
    _plan(tmp_path, camp, f"{entry}:/usr/bin:/bin")
    (camp / "bin").mkdir()
    (camp / "bin" / "hostname").write_text(f"#!/bin/sh\necho pwned > {bad}\n")
    (camp / "bin" / "hostname").chmod(0o755)
    res = _run_job(tmp_path, camp)
    assert res.returncode == 0, res.stdout + res.stderr
    assert not bad.exists(), "the job ran a program planted in the campaign"
    assert (camp / "logs" / "prepare-7.exit").read_text() == "0\n"


@pytest.mark.parametrize("ld", [":/usr/local/cuda/lib64", ".", "logs", "{alias}/camp/logs",
                                "/{camp}/logs"])
def test_an_inherited_library_path_never_reaches_the_campaign(
        tmp_path: Path, outside: Path, ld: str) -> None:
    """The job's programs, its kit included, see an LD_LIBRARY_PATH (and PATH) of absolute
    entries outside the campaign only; the submitter's good entries are kept."""
    camp, seen = tmp_path / "camp", outside.parent / f"{outside.name}-seen"
    (tmp_path / "alias").symlink_to(tmp_path)
    ld = ld.format(alias=tmp_path / "alias", camp=camp)
    py = tmp_path / "python"  # the job's "interpreter": it writes what it was given
    py.write_text(f'#!/bin/sh\nprintf "%s\\n%s\\n" "$LD_LIBRARY_PATH" "$PATH" > {seen}\n')
    py.chmod(0o755)
    try:
        _plan(tmp_path, camp, "/usr/bin:/bin", python=str(py))
        res = _run_job(tmp_path, camp, LD_LIBRARY_PATH=f"{ld}:/opt/keep/lib")
        assert res.returncode == 0, res.stdout + res.stderr
        lib_path, path = seen.read_text().splitlines()
    finally:
        seen.unlink(missing_ok=True)
    # each entry kept is the folder's own path, with no link on it (the twentieth pass)
    kept = [os.path.realpath(e) for e in ld.split(":") if e.startswith("/usr/")]
    assert lib_path == ":".join([*kept, os.path.realpath("/opt/keep/lib")]), lib_path
    assert path == ":".join(map(os.path.realpath, ("/usr/bin", "/bin"))), path


def _fake_libacl(tmp_path: Path, bad: Path) -> Path | None:
    """A ``libacl.so.1`` that writes ``bad`` when loaded and defines (as stubs) what ``mv``
    takes from the real one; None where this machine's ``mv`` does not link libacl or no C
    compiler is found."""
    cc, mv = shutil.which("cc") or shutil.which("gcc"), shutil.which("mv")
    if cc is None or mv is None:
        return None
    ldd = subprocess.run(["ldd", mv], capture_output=True, text=True, check=False).stdout
    real = [line.split("=>")[1].split()[0] for line in ldd.splitlines()
            if "libacl.so.1" in line and "=>" in line]
    if not real:
        return None
    nm = subprocess.run(["nm", "-D", "--defined-only", real[0]], capture_output=True,
                        text=True, check=False).stdout
    names = sorted({f.split()[2].split("@")[0] for f in nm.splitlines()
                    if len(f.split()) == 3 and f.split()[1] in "TW"})
    src = tmp_path / "fake.c"
    src.write_text('#include <fcntl.h>\n#include <unistd.h>\n'
                   '__attribute__((constructor)) static void loaded(void) {\n'
                   f'  int f = open("{bad}", O_WRONLY | O_CREAT, 0644);\n'
                   '  if (f >= 0) { write(f, "pwned\\n", 6); close(f); }\n}\n'
                   + "".join(f"long {n}(void) {{ return 0; }}\n" for n in names))
    lib = tmp_path / "libacl.so.1"
    res = subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src),
                          "-Wl,-soname,libacl.so.1"], capture_output=True, check=False)
    return lib if res.returncode == 0 else None


def test_a_library_planted_in_the_campaign_never_loads_through_an_empty_library_path_entry(
        tmp_path: Path, outside: Path) -> None:
    """The attack itself: a ``libacl.so.1`` in the campaign's logs/ and folder, the job
    started with ``LD_LIBRARY_PATH=:/usr/local/cuda/lib64``: it is never loaded."""
    camp, bad = tmp_path / "camp", outside / "loaded-by-the-job"
    lib = _fake_libacl(tmp_path, bad)
    if lib is None:
        pytest.skip("no C compiler, or this mv does not link libacl.so.1")
    _plan(tmp_path, camp, "/usr/bin:/bin")
    for where in (camp / "logs", camp):
        shutil.copy(lib, where / "libacl.so.1")
    res = _run_job(tmp_path, camp, LD_LIBRARY_PATH=":/usr/local/cuda/lib64")
    assert res.returncode == 0, res.stdout + res.stderr
    assert not bad.exists(), "the job loaded a library planted in the campaign"
    assert (camp / "logs" / "prepare-7.exit").read_text() == "0\n"


def _fake_sbatch(tmp_path: Path) -> dict[str, str]:
    """An environment with a fake ``sbatch`` (a new id each call) and ``scontrol`` that has
    forgotten every job on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    counter = tmp_path / "ids"
    (bin_dir / "sbatch").write_text(
        f'#!/bin/bash\nn=$(( $(cat {counter} 2>/dev/null || echo 100) + 1 ))\n'
        f'echo "$n" > {counter}\necho "$n"\n')
    (bin_dir / "scontrol").write_text(
        '#!/bin/bash\necho "slurm_load_jobs error: Invalid job id specified"; exit 1\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM"))}
    env.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path),
               PATH=f"{bin_dir}:{os.environ['PATH']}")
    return env


@pytest.mark.parametrize("batches", [list(range(1, 60001)), [1] * 2, [8, 1, 8]])
def test_a_campaign_forged_with_a_huge_or_repeated_batch_list_is_refused_at_once(
        tmp_path: Path, outside: Path, batches: list[int]) -> None:
    """campaign.json's batch sizes and the bench job's array edited together (the job list
    the plan gives for them, so the job check takes it): status, submit and its dry run refuse
    it in seconds (exit 2, with a fix); 60,000 tasks had status run for over a minute."""
    env = _fake_sbatch(tmp_path)
    camp = tmp_path / "camp"
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp),
                          "--stand-in"], env=env, capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 0, res.stderr
    assert subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "submit", str(camp)],
                          env=env, capture_output=True, timeout=60, check=False).returncode == 0
    rec = json.loads((camp / "campaign.json").read_text())
    rec["plan"]["bench"]["batches"] = batches
    for job in rec["plan"]["jobs"]:
        if job["name"] == "bench":
            job["array"] = len(batches)
    (camp / "campaign.json").write_text(json.dumps(rec))
    for args in (("status",), ("submit", "--dry-run"), ("resubmit", str(camp), "bench")):
        argv = [sys.executable, "-m", "kvprefetch", "slurm", *args]
        if args[0] != "resubmit":
            argv.append(str(camp))
        res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=20,
                             check=False)
        out = res.stdout + res.stderr
        assert "Traceback" not in out, out[-2000:]
        assert res.returncode == 2 and "batch sizes" in out and "To fix" in out, \
            (args, res.returncode, out[-2000:])


def test_a_plan_of_more_batch_sizes_than_one_array_takes_is_refused(tmp_path: Path) -> None:
    """``slurm plan --batch 1,...,1001``: refused with its fix (exit 2), nothing planned."""
    env = _fake_sbatch(tmp_path)
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan",
                          str(tmp_path / "camp"), "--stand-in", "--batch",
                          ",".join(str(b) for b in range(1, 1002))], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2 and "at most 1000 batch sizes" in res.stderr, res.stderr
    assert not (tmp_path / "camp").exists()


_EMPTY_SHA = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


@pytest.mark.parametrize("case", ["nul", "scratch-root", "build-folder"])
def test_a_scratch_manifest_whose_env_is_not_the_trees_environment_is_refused_by_publish(
        tmp_path: Path, outside: Path, case: str) -> None:
    """The scratch build's manifest names as its env a path with a NUL, the scratch root or
    its build folder (each holding the library): publish names the manifest or refuses the
    library (exit 10, a fix), no traceback, nothing published."""
    env = _fake_sbatch(tmp_path)
    camp, scr = tmp_path / "camp", tmp_path / "scr"
    kit = [sys.executable, "-m", "kvprefetch", "slurm"]
    res = subprocess.run([*kit, "plan", str(camp), "--stand-in", "--no-gpu"], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    build = scr / "build" / "baseline" / "k"
    build.mkdir(parents=True)
    (build / "lib.so").write_bytes(b"")
    env_path = {"nul": "a\x00b", "scratch-root": str(scr), "build-folder": str(scr / "build")}
    (build / "manifest.json").write_text(json.dumps({
        "tree": "baseline", "variant": "baseline", "namespace": "kvprefetch_baseline",
        "so_path": str(build / "lib.so"), "so_sha256": _EMPTY_SHA, "head_sizes": [128],
        "block_sizes": [16], "kv_dtypes": ["auto"], "env": {"path": env_path[case]}}))
    res = subprocess.run([*kit, "publish", str(camp), "--tree", "baseline", "--scratch",
                          str(scr)], env=env, capture_output=True, text=True, timeout=60,
                         check=False)
    out = res.stdout + res.stderr
    assert "Traceback" not in out, out[-3000:]
    assert res.returncode == 10 and "To fix" in out, (res.returncode, out[-2000:])
    assert not (camp / "work" / "envs" / "baseline").exists()


_FAKE_VLLM = """#!/bin/sh
# an environment's python that prints vLLM's version, and as `vllm bench throughput` writes
# $FAKE_JSON to --output-json
prev=""; out=""
for a in "$@"; do [ "$prev" = "--output-json" ] && out="$a"; prev="$a"; done
if [ -n "$out" ]; then printf '%s' "$FAKE_JSON" > "$out"; else echo '{"vllm": "0.10.2"}'; fi
"""


@pytest.mark.parametrize("written", [
    '{"tokens_per_second": 1%s, "num_requests": 1, "elapsed_time": 1}' % ("0" * 400),
    '{"tokens_per_second": 1.7e308, "num_requests": 1.7e308, "elapsed_time": 5e-324}'],
    ids=["huge-integer", "infinite-rate"])
def test_a_throughput_result_with_numbers_out_of_reach_is_one_message(
        tmp_path: Path, outside: Path, written: str) -> None:
    """vLLM's ``--output-json`` with a 400-digit integer, or a rate that overflows: one
    message naming the file and the run's log (exit 7), no traceback, no blame on
    matplotlib."""
    # in the work directory's envs/, where a verify report's pythons must be (the 31st pass)
    python = tmp_path / "wd" / "envs" / "baseline" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(_FAKE_VLLM)
    python.chmod(0o755)
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"passed": True, "envs": {
        "baseline": {"python": str(python)}, "patched": {"python": str(python)}}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVPREFETCH")}
    env.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path), FAKE_JSON=written)
    res = subprocess.run(
        [sys.executable, "-m", "kvprefetch", "bench", "e2e", "--workdir", str(tmp_path / "wd"),
         "--out", str(tmp_path / "out"), "--model-dir", str(tmp_path), "--verify-report",
         str(report), "--max-num-seqs", "8", "--repeats", "1"],
        capture_output=True, text=True, timeout=120, env=env, check=False)
    out = res.stdout + res.stderr
    assert "Traceback" not in out and "matplotlib" not in out, out[-3000:]
    assert res.returncode == 7, (res.returncode, out[-2000:])
    assert "baseline-seqs8-r0.json" in out and "baseline-seqs8-r0.log" in out, out[-2000:]
    assert "To fix" in out, out[-2000:]


def _smallest_runs(n: int) -> list[Path]:
    """The ``n`` smallest committed runs (folders with a provenance.json) of docs/results."""
    results = _SRC.parent / "docs" / "results"
    runs = [p.parent for p in results.rglob("provenance.json")]
    return sorted(runs, key=lambda r: sum(f.stat().st_size for f in r.rglob("*")))[:n]


@pytest.mark.parametrize("edit", [{"tree": 0}, {"tree": None}, {"tree": {"a": 1}},
                                  {"date": 20261201}, {"title": "two\nlines"}],
                         ids=["tree-number", "tree-null", "tree-object", "date-number",
                              "title-newline"])
def test_a_provenance_whose_fields_are_not_text_is_named_by_the_index(
        tmp_path: Path, outside: Path, edit: dict[str, object]) -> None:
    """``report --index`` over two committed runs, one's ``provenance.json`` edited: a
    ``tree`` that is no text was a TypeError traceback at ``tree[:12]`` and a ``date`` of a
    number one in the sort; a newline broke the index's table. Now the file and its fields
    are named (exit 7, a fix), and the index is not written."""
    runs = tmp_path / "runs"
    for src in _smallest_runs(2):
        shutil.copytree(src, runs / src.name)
    prov = runs / min(p.name for p in runs.iterdir()) / "provenance.json"
    rec = json.loads(prov.read_text())
    rec.update(edit)
    prov.write_text(json.dumps(rec))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVPREFETCH")}
    env.update(PYTHONPATH=str(_SRC), TMPDIR=str(tmp_path))
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "report", "--index", str(runs),
                          "--out", str(tmp_path / "results.md")], env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    out = res.stdout + res.stderr
    assert "Traceback" not in out, out[-3000:]
    assert res.returncode == 7 and "should be text of one line" in out and "To fix" in out, \
        (res.returncode, out[-2000:])
    assert str(prov) in out, out[-2000:]
    assert not (tmp_path / "results.md").exists()


def _fake_lib(tmp_path: Path, program: str, soname: str, bad: Path) -> Path | None:
    """A ``soname`` that writes ``bad`` when loaded and defines (as stubs) what the real one
    exports; None where ``program`` does not link it or no C compiler is found."""
    cc, exe = shutil.which("cc") or shutil.which("gcc"), shutil.which(program)
    if cc is None or exe is None:
        return None
    ldd = subprocess.run(["ldd", exe], capture_output=True, text=True, check=False).stdout
    real = [line.split("=>")[1].split()[0] for line in ldd.splitlines()
            if soname in line and "=>" in line]
    if not real:
        return None
    nm = subprocess.run(["nm", "-D", "--defined-only", real[0]], capture_output=True,
                        text=True, check=False).stdout
    fields = [f.split() for f in nm.splitlines() if len(f.split()) == 3]
    src = tmp_path / f"fake-{soname}.c"
    src.write_text('#include <fcntl.h>\n#include <unistd.h>\n'
                   '__attribute__((constructor)) static void loaded(void) {\n'
                   f'  int f = open("{bad}", O_WRONLY | O_CREAT, 0644);\n'
                   '  if (f >= 0) { write(f, "pwned\\n", 6); close(f); }\n}\n'
                   + "".join(f"long {n.split('@')[0]}(void) {{ return 0; }}\n"
                             for _, t, n in fields if t in "TW")
                   + "".join(f"char {n.split('@')[0]}[64];\n"
                             for _, t, n in fields if t in "BDR"))
    lib = tmp_path / soname
    res = subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src),
                          f"-Wl,-soname,{soname}"], capture_output=True, check=False)
    return lib if res.returncode == 0 else None


_SLURM_LIKE_SBATCH = """#!/bin/bash
# sbatch as Slurm runs a job: in --chdir, else the folder sbatch ran in; the prepare job run
# there at once (with the environment sbatch was given, --export=ALL)
n=$(( $(cat {ids} 2>/dev/null || echo 100) + 1 )); echo "$n" > {ids}
dir=$PWD
for a in "$@"; do case "$a" in --chdir=*) dir=${{a#--chdir=}};; esac; done
echo "$PWD $dir" >> {where}
script=${{@: -1}}
case "$script" in *00-prepare.sbatch)
  (cd "$dir" && SLURM_JOB_ID=$n exec bash "$script" >/dev/null 2>&1) ;; esac
echo "$n"
"""


def test_a_job_never_starts_in_the_campaign_a_user_submits_from(
        tmp_path: Path, outside: Path) -> None:
    """``slurm submit`` run from inside the campaign folder, with an inherited
    ``LD_LIBRARY_PATH=:/usr/local/cuda/lib64``: Slurm started each job there, and bash, the
    job's shell, loaded a ``libtinfo.so.6`` planted in the campaign before the script's first
    line (a file outside written). Now sbatch gets ``--chdir=/`` and runs from ``/`` itself;
    where the machine's bash links libtinfo and a C compiler is found, the planted library is
    shown never to load."""
    camp, where, bad = tmp_path / "camp", tmp_path / "where", outside / "loaded-by-bash"
    env = _fake_sbatch(tmp_path)
    (tmp_path / "bin" / "sbatch").write_text(
        _SLURM_LIKE_SBATCH.format(ids=tmp_path / "ids", where=where))
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp),
                          "--stand-in", "--python", "/bin/true"], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    lib = _fake_lib(tmp_path, "bash", "libtinfo.so.6", bad)
    if lib is not None:
        shutil.copy(lib, camp / "libtinfo.so.6")
    env["LD_LIBRARY_PATH"] = ":/usr/local/cuda/lib64"
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "submit", "."],
                         env=env, cwd=camp, capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = where.read_text().splitlines()
    assert lines == ["/ /"] * 6, lines  # sbatch ran in /, each job starts in /
    assert not bad.exists(), "the job's shell loaded a library planted in the campaign"
    if lib is not None:
        assert (camp / "logs" / "prepare-101.exit").read_text() == "0\n"


@pytest.mark.parametrize("record", ["256", "99999999999999999999999", "1000"])
def test_an_exit_record_holding_no_shell_status_is_not_shown_as_one(
        tmp_path: Path, outside: Path, record: str) -> None:
    """A forgotten job's exit record (in the campaign, writable by whoever can write it)
    holding 256 or a 23-digit number: status showed it as the job's exit code (FAILED); now
    the record is named as holding no exit status (ENDED, not a success)."""
    env = _fake_sbatch(tmp_path)
    camp = tmp_path / "camp"
    kit = [sys.executable, "-m", "kvprefetch", "slurm"]
    for args in (("plan", str(camp), "--stand-in"), ("submit", str(camp))):
        res = subprocess.run([*kit, *args], env=env, capture_output=True, text=True,
                             timeout=60, check=False)
        assert res.returncode == 0, res.stderr
    (camp / "logs" / "prepare-101.exit").write_text(record + "\n")
    res = subprocess.run([*kit, "status", str(camp), "--json"], env=env, capture_output=True,
                         text=True, timeout=60, check=False)
    assert "Traceback" not in res.stdout + res.stderr, res.stderr
    assert f"{record}:0" not in res.stdout, res.stdout
    assert "not an exit status" in res.stdout, res.stdout[-2000:]
