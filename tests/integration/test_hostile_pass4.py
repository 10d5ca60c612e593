"""Issue 41, the fourth hostile pass (against 4d500c5): what still hung, gave a traceback,
wrote outside the folder it belongs to, removed a user's files or sent the user round in a
loop. Each test fails on 4d500c5 (checked with the fixes stashed):

- JSON nested 200k deep in a tree's state record (fetch, apply, diff-upstream, clean, build)
  or a build manifest (verify-kernel): a RecursionError traceback; a FIFO at a build manifest
  hung verify-kernel; a FIFO as ``bench decode --config`` or ``bench e2e --verify-report`` hung,
  /dev/zero as the report filled memory, a deep report was a traceback; ``bench kernel
  --sample 10**23`` hung even a dry run. Now ``reading.load_json`` (bounded, a regular file
  only, too deep is a ValueError) reads them, and --sample has a ceiling;
- a Slurm job's shell wrote through links planted in the campaign folder: its exit record's
  temporary (``logs/<job>-<id>.exit.tmp``), ``mv -f`` into a link to a folder at the record,
  and ``verify-kernel --json > results/verify.json``. Now ``write_new`` (a new file with
  ``set -C``, then ``mv -T``);
- ``fetch --adopt`` of a directory holding a ``.kvprefetch-owned.json`` it did not write took
  the record as its own: ``clean`` then removed the user's ``trees/`` and ``build/`` it listed;
- a tree that is a symlink (moved elsewhere and linked back): fetch said "unchanged", apply
  "no tree, run fetch": a loop. ``build --torch-from /dev/null`` said "make /dev writable";
  a file named ``.locks`` said only "File exists"; ``export-header`` wrote an ownership record
  and its lock into any ``--workdir``, a user's folder too.

The autouse ``outside`` fixture checks that a folder outside the work directory is
byte-identical afterwards."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvprefetch.errors import BenchError, ConfigError, LockError, PatchError
from tests.integration.test_reliability import cli, outside, refused

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

DEEP = "[" * 200_000 + "]" * 200_000


def _no_traceback(res: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in res.stderr + res.stdout, res.stderr


# ------------------------------------------------------------------ records read back (class 1)


@pytest.mark.parametrize("command", [["fetch"], ["apply"], ["diff-upstream"],
                                     ["build", "--kernels-only", "--dry-run", "--skip-doctor"]])
def test_a_state_record_nested_too_deep_is_corrupt_not_a_traceback(
        fetched_workdir: Path, command: list[str]) -> None:
    """validate_state parsed with json.loads and caught ValueError only: RecursionError."""
    (fetched_workdir / "state" / "patched.json").write_text(DEEP)
    res = cli(*command, "--workdir", str(fetched_workdir), timeout=120)
    refused(res, PatchError.exit_code, "state/patched.json", "nested too deep", "--repair")


def test_clean_reads_a_state_record_nested_too_deep_without_a_traceback(
        fetched_workdir: Path) -> None:
    (fetched_workdir / "state" / "baseline.json").write_text(DEEP)
    res = cli("clean", "--workdir", str(fetched_workdir), "--what", "trees", "--dry-run")
    _no_traceback(res)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("kind", ["fifo", "deep"])
def test_a_build_manifest_that_is_no_record_is_no_build_for_verify(
        fetched_workdir: Path, kind: str) -> None:
    """newest_manifests read every build/*/*/manifest.json with read_text: a FIFO hung
    verify-kernel, JSON 200k deep was a RecursionError. Now: not a build."""
    manifest = fetched_workdir / "build" / "baseline" / "k" / "manifest.json"
    manifest.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(manifest)
    else:
        manifest.write_text(DEEP)
    res = cli("verify-kernel", "--workdir", str(fetched_workdir), "--no-gpu", timeout=60)
    refused(res, 6, "found builds for none")


def test_load_json_refuses_what_is_not_a_bounded_json_file(tmp_path: Path) -> None:
    from kvprefetch.reading import load_json

    deep = tmp_path / "deep.json"
    deep.write_text(DEEP)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, why in ((deep, "nested too deep"), (fifo, "not a regular file"),
                      (Path("/dev/zero"), "not a regular file")):
        with pytest.raises(ValueError, match=why):
            load_json(path)
    ok = tmp_path / "ok.json"
    ok.write_text('{"a": [1]}')
    assert load_json(ok) == {"a": [1]}


# ------------------------------------------------------------------------ bad input (class 5)


@pytest.mark.parametrize("case", ["decode-config-fifo", "e2e-report-fifo", "e2e-report-deep",
                                  "e2e-report-dev-zero", "kernel-sample-huge"])
def test_bench_inputs_that_hung_or_crashed_are_one_message(
        fetched_workdir: Path, tmp_path: Path, case: str) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    deep = tmp_path / "deep.json"
    deep.write_text(DEEP)
    wd = ["--workdir", str(fetched_workdir)]
    envs = ["--env", f"baseline={sys.executable}", "--env", f"patched={sys.executable}"]
    args, code, needle = {
        "decode-config-fifo": (["decode", *wd, "--dry-run", "--config", str(fifo)],
                               ConfigError.exit_code, "not a regular file"),
        "e2e-report-fifo": (["e2e", *wd, *envs, "--verify-report", str(fifo)],
                            BenchError.exit_code, "not a regular file"),
        "e2e-report-deep": (["e2e", *wd, *envs, "--verify-report", str(deep)],
                            BenchError.exit_code, "nested too deep"),
        "e2e-report-dev-zero": (["e2e", *wd, *envs, "--verify-report", "/dev/zero"],
                                BenchError.exit_code, "not a regular file"),
        "kernel-sample-huge": (["kernel", *wd, "--dry-run", "--sample", str(10**23)],
                               ConfigError.exit_code, "--sample N with N <="),
    }[case]
    res = cli("bench", *args, timeout=60)
    refused(res, code, needle)


def test_a_program_that_cannot_run_is_named_not_a_permission_fix(
        fetched_workdir: Path) -> None:
    """Popen's EACCES went to the generic OSError fix: "make /dev writable for this user"."""
    from kvprefetch.runner import run

    with pytest.raises(ConfigError, match="cannot run /dev/null"):
        run(["/dev/null"], echo=False)
    assert cli("apply", "--workdir", str(fetched_workdir)).returncode == 0
    res = cli("build", "--workdir", str(fetched_workdir), "--kernels-only", "--dry-run",
              "--skip-doctor", "--torch-from", "/dev/null")
    refused(res, ConfigError.exit_code, "cannot run /dev/null", "executable")
    assert "writable" not in res.stderr, res.stderr


# ----------------------------------------------------------------- Slurm job scripts (class 2/4)


def test_campaign_job_scripts_never_write_through_a_planted_link(
        tmp_path: Path, outside: Path) -> None:
    """Run the prepare and verify jobs' scripts with bash (/bin/true as the interpreter) after
    planting links at the exit record's temporary, at the exit record (to a folder) and at
    results/verify.json: nothing lands outside; the records and the report are plain files."""
    camp = tmp_path / "camp"
    assert cli("slurm", "plan", str(camp), "--source", "sdist",
               "--python", "/bin/true").returncode == 0
    (camp / "logs" / "prepare-4242.exit.tmp").symlink_to(outside / "notes.txt")
    (camp / "logs" / "verify-4243.exit").symlink_to(outside / "patched",
                                                    target_is_directory=True)
    (camp / "results" / "verify.json").symlink_to(outside / "baseline.json")
    for script, job_id in (("00-prepare.sbatch", "4242"), ("20-verify.sbatch", "4243")):
        res = subprocess.run(["bash", str(camp / "scripts" / script)], capture_output=True,
                             text=True, timeout=60, check=False,
                             env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": job_id})
        assert res.returncode == 0, res.stderr
    for rec in ("prepare-4242.exit", "verify-4243.exit", "../results/verify.json"):
        p = camp / "logs" / rec
        assert p.is_file() and not p.is_symlink(), rec
    assert (camp / "logs" / "verify-4243.exit").read_text() == "0\n"


def test_a_job_script_refuses_a_symlinked_results_folder(tmp_path: Path,
                                                         outside: Path) -> None:
    camp = tmp_path / "camp"
    assert cli("slurm", "plan", str(camp), "--source", "sdist",
               "--python", "/bin/true").returncode == 0
    (camp / "results").rmdir()
    (camp / "results").symlink_to(outside, target_is_directory=True)
    res = subprocess.run(["bash", str(camp / "scripts" / "20-verify.sbatch")],
                         capture_output=True, text=True, timeout=60, check=False,
                         env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7"})
    assert res.returncode != 0
    assert "is a symlink" in res.stderr, res.stderr
    assert (camp / "logs" / "verify-7.exit").read_text() != "0\n"


# ------------------------------------------------------------------------ adoption (class 3)


def test_adoption_refuses_an_ownership_record_it_did_not_write(
        tmp_path: Path, vllm_sdist: Path) -> None:
    """The user's directory held a .kvprefetch-owned.json (copied in, or forged) listing their
    own trees/baseline and build/baseline: fetch --adopt took it as its record, and clean
    --what all --discard-edits removed both."""
    home = tmp_path / "home"
    for rel in ("trees/baseline/mine.txt", "build/baseline/mine.txt"):
        (home / rel).parent.mkdir(parents=True)
        (home / rel).write_text("mine\n")
    (home / ".kvprefetch-owned.json").write_text(json.dumps({"paths": {
        "trees/baseline": {"kind": "tree", "digest": "0" * 64},
        "build/baseline": {"kind": "build"}}}))
    res = cli("fetch", "--workdir", str(home), "--adopt", "--source", str(vllm_sdist))
    refused(res, ConfigError.exit_code, ".kvprefetch-owned.json", "move")
    cli("clean", "--workdir", str(home), "--what", "all", "--discard-edits")
    for rel in ("trees/baseline/mine.txt", "build/baseline/mine.txt"):
        assert (home / rel).read_text() == "mine\n", rel
    # the fix works: with the record moved away, adoption keeps every user file
    shutil.move(str(home / ".kvprefetch-owned.json"), str(tmp_path / "record.json"))
    res = cli("fetch", "--workdir", str(home), "--adopt", "--source", str(vllm_sdist))
    _no_traceback(res)
    cli("clean", "--workdir", str(home), "--what", "all", "--discard-edits")
    for rel in ("trees/baseline/mine.txt", "build/baseline/mine.txt"):
        assert (home / rel).read_text() == "mine\n", rel


def test_a_file_in_place_of_the_locks_folder_is_named(tmp_path: Path,
                                                      vllm_sdist: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".locks").write_text("mine\n")
    res = cli("fetch", "--workdir", str(home), "--adopt", "--source", str(vllm_sdist))
    refused(res, LockError.exit_code, ".locks, is a file", "move")
    assert (home / ".locks").read_text() == "mine\n"


# -------------------------------------------------------------------------- messages (class 6)


def test_a_tree_that_is_a_symlink_is_named_and_its_fix_works(
        fetched_workdir: Path, outside: Path, tmp_path: Path) -> None:
    """trees/patched moved elsewhere and linked back: fetch said "unchanged" (its inventory
    followed the link) and apply "there is no tree, run fetch": round and round."""
    elsewhere = tmp_path / "elsewhere"
    shutil.move(str(fetched_workdir / "trees" / "patched"), str(elsewhere))
    (fetched_workdir / "trees" / "patched").symlink_to(elsewhere, target_is_directory=True)
    before = {p: p.stat().st_mtime_ns for p in elsewhere.rglob("*")}
    refused(cli("apply", "--workdir", str(fetched_workdir)), PatchError.exit_code,
            "is a symlink", "move")
    refused(cli("fetch", "--workdir", str(fetched_workdir)), PatchError.exit_code,
            "is a symlink")
    assert {p: p.stat().st_mtime_ns for p in elsewhere.rglob("*")} == before
    (fetched_workdir / "trees" / "patched").unlink()
    assert cli("fetch", "--workdir", str(fetched_workdir)).returncode == 0
    assert cli("apply", "--workdir", str(fetched_workdir)).returncode == 0


def test_export_header_writes_nothing_into_the_work_directory(
        fetched_workdir: Path, tmp_path: Path) -> None:
    """Its scratch went through the ownership record: a --workdir that is a user's folder got
    a .kvprefetch-owned.json and its lock (which then made `fetch --adopt` refuse it), and a
    work directory got a record write. Now a system temp folder, as diff-upstream --check's."""
    from tests.integration.helpers import tree_bytes

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "f.txt").write_text("mine\n")
    out = tmp_path / "out" / "attention_kernels.cuh"
    refused(cli("export-header", "--workdir", str(mine), "-o", str(out)),
            PatchError.exit_code, "run `kvprefetch fetch` first")
    assert sorted(p.name for p in mine.iterdir()) == ["f.txt"]
    before = tree_bytes(fetched_workdir)
    res = cli("export-header", "--workdir", str(fetched_workdir), "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert out.is_file() and tree_bytes(fetched_workdir) == before
