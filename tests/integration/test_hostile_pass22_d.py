"""Issue 41, the twenty-second hostile pass (tester d: the generated job scripts as they run on
a node, and the jobs' environment allow-list, ``slurm/job_env.py``). Each test fails without
its fix (checked by reverting ``src`` and running it):

- ``LD_LIBRARY_PATH`` is passed to every job; the job keeps its entries that are absolute and
  outside the campaign (``keep_outside``), split on ``:``. glibc's loader splits it on ``;`` as
  well, and reads an empty or relative entry from the folder each program runs in, so
  ``/usr/lib;.`` (or ``/usr/lib;``) was one absolute entry to the job, kept, while the job's
  ``mv`` (run in the campaign's logs/) loaded a ``libacl.so.1`` planted there (3 runs of 3:
  ``/usr/lib;.``, ``/usr/lib;``, ``;/usr/lib``). Submit's check reads those entries from
  ``/``, where the job's bash starts, and passed them, rightly: only later programs run in the
  campaign. Now the job splits ``LD_LIBRARY_PATH`` on both, and keeps no entry holding either.
- The loader expands ``$ORIGIN`` in an ``LD_LIBRARY_PATH`` entry to the folder of each program
  it starts; submit's check knows bash's folders, the job's none (a folder named ``$ORIGIN`` is
  not there, so the entry was kept as it reads). ``/$ORIGIN/../../../../camp/lib`` with the
  kit's interpreter under /root/.pyenv and the campaign /root/camp had the merge job's Python
  load a ``libuuid.so.1`` planted in the campaign (1 run of 1). Now the job keeps no entry
  holding a ``$``.
- ``TZ`` is passed to every job and was not checked: glibc reads it as a file (less a leading
  ``:``; a relative one under /usr/share/zoneinfo, ``..`` and all) as every Python starts, so
  ``TZ=:<campaign>/zone`` let the campaign's writer put a FIFO there after submit: the merge
  job's interpreter blocked before its first instruction (1 run of 1, killed by ``timeout``
  after 15 s, exit 143). Now submit refuses a zone file in the campaign, however spelled.
- ``SSL_CERT_DIR`` is checked as one folder, but OpenSSL reads it as a ``:``-separated list:
  ``/etc/ssl/certs:<campaign>/certs`` passed submit (1 run of 1), and the prepare job would
  trust certificates whoever writes the campaign put there. Now each folder is checked.
- The re-run under ``env -i`` (``keep_only_sh``) handed ``env`` what it keeps as arguments
  and the whole environment as well, both under the kernel's ARG_MAX: a job given about
  1.3 MiB of variables (22 ``SLURM_*`` of 60 kB) ended "Argument list too long", exit 2, with
  no exit record and a fix that blamed a missing ``/usr/bin/env`` (1 run of 1; it ran before
  the allow-list). Now nothing is exported to that exec but what is kept.
- The same re-run names the script by ``$0``: read from standard input (``bash < script``,
  ``cat script | bash``) or sourced, ``$0`` is the shell's name, and ``bash -- bash`` ran a
  file named ``bash`` from the folder it started in: in the campaign, one planted there
  (1 run of 1); elsewhere "cannot execute binary file". Now such a run is refused, exit 2.
- A ``--scratch`` variable goes into the ``--export`` list of every job; sbatch reads a name
  ``ALL`` there, in any case, as "and the whole environment" (its ``_env_merge_filter``), so
  ``--scratch '$ALL/k'`` (or ``$all``, or a campaign.json edited to name it) undid the
  allow-list: the whole submitting shell, ``BASH_ENV`` and ``LD_PRELOAD`` included, reached
  each job's first bash, unchecked (read from Slurm's source; 4 plans and dry runs accepted it,
  no Slurm here). Now such a scratch (``ALL``, ``NONE``, ``NIL``) is refused.
- The scripts carried ``#SBATCH --export=`` for an sbatch by hand, but not submit's
  ``--chdir=/``: ``sbatch scripts/40-merge.sbatch`` run in the campaign folder starts the job
  there, and with the careless ``LD_LIBRARY_PATH=:/usr/local/cuda/lib64`` (the eighteenth
  pass's) its bash loaded a ``libtinfo.so.6`` planted in the campaign (1 run of 1, the job run
  by bash in the campaign as Slurm would; no Slurm here). Now each script says ``--chdir=/``.

Slurm is absent: the job scripts are run by bash as Slurm runs them (from ``/``, with the
environment given)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass18_e import _fake_lib, _fake_libacl
from tests.integration.test_hostile_pass20_d import _fake_sbatch, _plan, _run
from tests.integration.test_job_env import _submit_env
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


def _env_stub(tmp_path: Path) -> tuple[Path, Path]:
    """The jobs' "interpreter": it writes the LD_LIBRARY_PATH it was given to ``got``."""
    got, py = tmp_path / "got", tmp_path / "python"
    py.write_text(f'#!/bin/bash\nprintf "%s\\n" "${{LD_LIBRARY_PATH-unset}}" >> {got}\n')
    py.chmod(0o755)
    return got, py


def test_a_library_path_entry_after_a_semicolon_never_loads_from_the_campaign(
        tmp_path: Path, outside: Path) -> None:
    """The attack: a ``libacl.so.1`` in the campaign and its logs/, the verify job (its
    ``write_new`` runs ``mv`` in logs/) given an ``LD_LIBRARY_PATH`` whose ``;`` hides an empty
    or relative entry: the planted library is never loaded, and the kit gets the absolute
    entries alone."""
    camp, bad = tmp_path / "camp", outside / "loaded-by-the-job"
    lib = _fake_libacl(tmp_path, bad)
    if lib is None:
        pytest.skip("no C compiler, or this mv does not link libacl.so.1")
    got, py = _env_stub(tmp_path)
    _plan(tmp_path, camp, python=str(py))
    for where in (camp / "logs", camp):
        shutil.copy(lib, where / "libacl.so.1")
    for value in ("/usr/lib;.", "/usr/lib;", ";/usr/lib", "/usr/lib;logs"):
        res = _run(tmp_path, camp, "20-verify.sbatch", LD_LIBRARY_PATH=value)
        assert res.returncode == 0, (value, res.stdout + res.stderr)
        assert not bad.exists(), f"LD_LIBRARY_PATH={value!r}: a library in the campaign loaded"
    assert got.read_text().splitlines() == ["/usr/lib"] * 4


def _dry_run(tmp_path: Path, camp: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "slurm-bin"
    if not bin_dir.exists():
        _fake_sbatch(tmp_path)
    return subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "submit", str(camp),
                           "--dry-run"], env=_submit_env(tmp_path, bin_dir, **extra),
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("name", "value"), [
    ("TZ", ":{camp}/zone"), ("TZ", "{camp}/zone"), ("TZ", "../../../../../../..{camp}/zone"),
    ("TZ", ":../../../../../../..{camp}/zone"), ("SSL_CERT_DIR", "/etc/ssl/certs:{camp}/certs"),
])
def test_submit_refuses_a_zone_file_or_certificate_folder_in_the_campaign(
        tmp_path: Path, outside: Path, name: str, value: str) -> None:
    """A ``TZ`` naming a zone file in the campaign (glibc reads it as every Python starts: a
    FIFO there blocked the merge job's interpreter until it was killed), however it is spelled,
    and an ``SSL_CERT_DIR`` list with a folder in the campaign: the dry run refuses to send,
    exit 2, with a fix. Before, both passed and every job got them."""
    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    res = _dry_run(tmp_path, camp, **{name: value.format(camp=camp)})
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{name}=" in res.stderr and "is in the campaign" in res.stderr, res.stderr
    assert f"To fix: point {name} outside the campaign" in res.stderr, res.stderr


def test_submit_takes_a_zone_and_certificate_folders_outside_the_campaign(
        tmp_path: Path, outside: Path) -> None:
    """What a user sets is still passed: zone names, a POSIX rule (its ``/``), a zone file and
    a list of certificate folders outside the campaign."""
    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    for tz in ("UTC", ":Europe/Berlin", "EST5EDT,M3.2.0/2,M11.1.0/2", "/etc/localtime"):
        res = _dry_run(tmp_path, camp, TZ=tz, SSL_CERT_DIR=f"/etc/ssl/certs:{tmp_path}")
        assert res.returncode == 0, (tz, res.stdout + res.stderr)


def test_a_job_with_a_large_environment_still_runs(tmp_path: Path, outside: Path) -> None:
    """A job given about 1.3 MiB of Slurm's variables (and an exported function) runs the kit
    with them, exit 0, and records it. Before, the re-run under ``env -i`` passed the whole
    environment as well as what it keeps, over the kernel's ARG_MAX: "Argument list too long",
    exit 2, no exit record."""
    camp = tmp_path / "camp"
    got, py = _env_stub(tmp_path)
    _plan(tmp_path, camp, python=str(py))
    big = {f"SLURM_BIG{i}": "x" * 60_000 for i in range(22)}
    funcs = {"BASH_FUNC_f%%": "() { :; }", "BASH_FUNC_*%%": "() { :; }"}
    res = _run(tmp_path, camp, "40-merge.sbatch", **big, **funcs)
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]
    assert "not a function" not in res.stderr, res.stderr  # `*` is a name, not a pattern
    assert (camp / "logs" / "merge-7.exit").read_text() == "0\n"
    assert got.read_text() == "unset\n"


def test_a_library_path_entry_through_origin_never_loads_from_the_campaign(
        tmp_path: Path, outside: Path) -> None:
    """The attack: the kit's interpreter lives beside the campaign (here a copy of ``mv``,
    which links ``libacl.so.1``, in ``tools/bin``) and ``LD_LIBRARY_PATH`` has
    ``/$ORIGIN/../../camp/lib``, which from bash's folder (submit's check) is ``/camp/lib``
    but from the interpreter's is the campaign's lib/: the library planted there is never
    loaded, and the kit gets the plain entries alone."""
    camp, bad = tmp_path / "camp", outside / "loaded-by-the-job"
    lib, mv = _fake_libacl(tmp_path, bad), shutil.which("mv")
    if lib is None or mv is None:
        pytest.skip("no C compiler, or this mv does not link libacl.so.1")
    tools = tmp_path / "tools" / "bin"
    tools.mkdir(parents=True)
    py = shutil.copy(mv, tools / "python")
    _plan(tmp_path, camp, python=str(py))
    (camp / "lib").mkdir()
    shutil.copy(lib, camp / "lib" / "libacl.so.1")
    for value in ("/$ORIGIN/../../camp/lib:/usr/lib", "/usr/lib:/${ORIGIN}/../../camp/lib"):
        _run(tmp_path, camp, "40-merge.sbatch", LD_LIBRARY_PATH=value)
        assert not bad.exists(), f"LD_LIBRARY_PATH={value!r}: a library in the campaign loaded"


def test_a_job_script_read_from_standard_input_runs_nothing_from_the_campaign(
        tmp_path: Path, outside: Path) -> None:
    """The careless run: ``bash < scripts/40-merge.sbatch`` (and ``source``) in the campaign
    folder, which holds a file named ``bash``: the planted file never runs; the script refuses,
    exit 2, with a fix, and run as a file it still runs."""
    camp, bad = tmp_path / "camp", outside / "ran-from-the-campaign"
    _plan(tmp_path, camp, python="/bin/true")
    (camp / "bash").write_text(f"echo planted > {bad}\n")
    script = camp / "scripts" / "40-merge.sbatch"
    env = {"HOME": str(tmp_path), "SLURM_JOB_ID": "7", "PATH": "/usr/bin:/bin"}
    for argv, stdin in ((["bash"], script.read_text()),
                        (["bash", "-c", f"source {script}; echo returned $?"], "")):
        res = subprocess.run(argv, input=stdin, env=env, cwd=camp, capture_output=True,
                             text=True, timeout=60, check=False)
        assert not bad.exists(), "a file named bash in the campaign ran"
        assert "refusing to run: this kvprefetch job script was read from standard input" \
            in res.stderr, res.stdout + res.stderr
        assert "To fix: run it as a file" in res.stderr
        assert res.returncode == 2 or "returned 2" in res.stdout, res.stdout + res.stderr
    res = subprocess.run(["bash", script.name], env=env, cwd=camp / "scripts",
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("scratch", ["$ALL/k", "/scratch/${all}", "$All/x/$USER", "$NONE/k"])
def test_a_scratch_naming_an_sbatch_export_word_is_refused(
        tmp_path: Path, outside: Path, scratch: str) -> None:
    """``--scratch '$ALL/k'`` put ``ALL`` in the ``--export`` list every job is sent with, which
    sbatch reads (in any case) as "and the whole environment": the allow-list undone, every
    variable of the submitting shell unchecked in each job's first bash. Now plan refuses it
    (exit 2, with a fix), and so does submit when campaign.json is edited to name it."""
    camp = tmp_path / "camp"
    bin_dir, _ = _fake_sbatch(tmp_path)
    env = _submit_env(tmp_path, bin_dir, ALL=str(tmp_path), all=str(tmp_path),
                      All=str(tmp_path), NONE=str(tmp_path), USER="u")
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", str(camp),
                          "--stand-in", "--batch", "1", "--scratch", scratch], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "which sbatch's --export list reads as its own word" in res.stderr, res.stderr
    assert "To fix: name the scratch folder without it" in res.stderr
    _plan(tmp_path, camp)
    record = camp / "campaign.json"
    record.write_text(record.read_text().replace('"scratch": "node"',
                                                 f'"scratch": {json.dumps(scratch)}'))
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "submit", str(camp),
                          "--dry-run"], env=env, capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "which sbatch's --export list reads as its own word" in res.stderr, res.stderr
    assert ",ALL" not in res.stdout.upper(), res.stdout


# sbatch by hand as Slurm runs a job: in --chdir (the command line's, else the script's
# #SBATCH directive), else the folder sbatch ran in; the job run there at once, with the
# LD_LIBRARY_PATH of the user's shell (here JOB_LLP: this stand-in is bash itself, which the
# real sbatch is not)
_HAND_SBATCH = """#!/bin/bash
dir=$PWD script=${{@: -1}}
d=$(sed -n 's/^#SBATCH --chdir=//p' "$script" | head -1); dir=${{d:-$dir}}
for a in "$@"; do case "$a" in --chdir=*) dir=${{a#--chdir=}};; esac; done
echo "$dir" >> {where}
(cd "$dir" && LD_LIBRARY_PATH=$JOB_LLP SLURM_JOB_ID=7 exec bash "$script" >/dev/null 2>&1)
echo 7
"""


def test_a_job_sent_by_hand_from_the_campaign_never_starts_there(
        tmp_path: Path, outside: Path) -> None:
    """``sbatch scripts/40-merge.sbatch`` run by hand in the campaign folder, with the careless
    ``LD_LIBRARY_PATH=:/usr/local/cuda/lib64`` (its empty entry is the folder bash starts in):
    the job starts in ``/`` (the script's ``#SBATCH --chdir=/``), and bash never loads the
    ``libtinfo.so.6`` planted in the campaign. Before, no directive said so, and Slurm starts
    a job where sbatch ran."""
    camp, where, bad = tmp_path / "camp", tmp_path / "where", outside / "loaded-by-bash"
    _plan(tmp_path, camp, python="/bin/true")
    sbatch = tmp_path / "sbatch"
    sbatch.write_text(_HAND_SBATCH.format(where=where))
    sbatch.chmod(0o755)
    lib = _fake_lib(tmp_path, "bash", "libtinfo.so.6", bad)
    if lib is not None:
        shutil.copy(lib, camp / "libtinfo.so.6")
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "JOB_LLP": ":/usr/local/cuda/lib64"}
    res = subprocess.run([str(sbatch), "scripts/40-merge.sbatch"], env=env, cwd=camp,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert where.read_text() == "/\n", "the job started in the campaign"
    assert not bad.exists(), "the job's shell loaded a library planted in the campaign"
