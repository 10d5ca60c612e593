"""Issue 41: nothing outside the work directory, whatever the kit reads. One test per class of
the issue (records trusted as code, writes through symlinked folders, adoption, Slurm
injection, tracebacks on bad input, dry runs that write), each written to fail on the code as
it was (c751e20 / ceb12c9), plus a seeded fuzz test that corrupts records at random and checks
that nothing outside a sandbox changed. docs/reliability.md lists them.

Every case checks: the family's exit code with "To fix" and no traceback (``refused``), and
that a folder outside the work directory is byte-identical afterwards (the autouse
``outside`` fixture, shared with test_reliability.py)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kvprefetch import upstream
from kvprefetch.errors import ConfigError, FetchError, PatchError
from tests.integration.helpers import link_tree, seed_downloads, tree_bytes
from tests.integration.test_reliability import cli, outside, refused

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

OWNED = ".kvprefetch-owned.json"


def _owned(wd: Path) -> dict:
    return json.loads((wd / OWNED).read_text())


def _set_owned(wd: Path, extra: dict[str, dict]) -> None:
    data = _owned(wd)
    data["paths"].update(extra)
    (wd / OWNED).write_text(json.dumps(data))


# --------------------------------------------------------------------------- 1. records


@pytest.mark.parametrize(("key", "entry", "argv"), [
    ("../victim/dir", {"kind": "build"}, ("clean", "--what", "builds")),
    ("ABS", {"kind": "build"}, ("clean", "--what", "builds")),
    ("../victim/dir", {"kind": "tmp", "pid": 999_999_999}, ("fetch", "--source", "sdist")),
    ("trees/patched", {"kind": "tmp"}, ("fetch", "--source", "sdist")),
    ("trees/patched", {"kind": "tmp", "pid": 999_999_999}, ("clean", "--what", "builds")),
    ("trees/baseline", {"kind": "build"}, ("clean", "--what", "builds")),
], ids=["dotdot-build", "absolute-build", "dotdot-tmp-dead-pid", "tmp-without-pid-on-a-tree",
        "tmp-dead-pid-on-a-tree", "build-entry-on-a-tree"])
def test_a_record_naming_a_path_outside_its_place_is_corrupt_and_nothing_is_removed(
        fetched_workdir: Path, tmp_path: Path, key: str, entry: dict, argv: tuple[str, ...]
) -> None:
    wd = fetched_workdir
    victim = tmp_path / "victim" / "dir"
    victim.mkdir(parents=True)
    (victim / "data.txt").write_text("precious\n")
    if key == "ABS":
        key = str(victim)
    _set_owned(wd, {key: entry})
    trees = tree_bytes(wd / "trees")
    res = cli(argv[0], "--workdir", str(wd), *argv[1:])
    refused(res, ConfigError.exit_code, "is corrupt", "--repair")
    assert (victim / "data.txt").read_text() == "precious\n"
    assert tree_bytes(wd / "trees") == trees


@pytest.mark.parametrize("rel", ["../../../victim.txt", "ABS"], ids=["dotdot", "absolute"])
def test_an_apply_journal_naming_a_path_outside_the_tree_is_corrupt(
        fetched_workdir: Path, tmp_path: Path, rel: str) -> None:
    wd = fetched_workdir
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    # trees/patched/../../../victim.txt is tmp_path/victim.txt (wd = tmp_path/work)
    rel = str(victim) if rel == "ABS" else rel
    stage = wd / "trees" / ".patched.apply"
    stage.mkdir()
    digest = hashlib.sha256(victim.read_bytes()).hexdigest()
    (stage / "journal.json").write_text(json.dumps({
        "tree": "patched", "state": {"not": "the state"},
        "files": [{"rel": rel, "before": None, "after": digest}]}))
    res = cli("apply", "--workdir", str(wd))
    refused(res, PatchError.exit_code, "journal.json is corrupt")
    assert victim.read_text() == "precious\n"


# ---------------------------------------------------------------- 2. symlinked folders


def test_state_downloads_and_pristine_symlinked_elsewhere_are_never_written_through(
        fetched_workdir: Path, tmp_path: Path, vllm_sdist: Path) -> None:
    # state/: fetch would rewrite patched.json behind the link
    wd = fetched_workdir
    elsewhere = tmp_path / "state-elsewhere"
    shutil.move(wd / "state", elsewhere)
    (wd / "state").symlink_to(elsewhere, target_is_directory=True)
    shutil.rmtree(wd / "trees" / "patched")
    before = tree_bytes(elsewhere)
    res = cli("fetch", "--workdir", str(wd), "--source", "sdist")
    refused(res, ConfigError.exit_code, f"{wd / 'state'} is a symlink")
    assert tree_bytes(elsewhere) == before

    # downloads/: a file with the wrong hash behind the link was deleted
    wd2 = tmp_path / "work2"
    seed_downloads(wd2, vllm_sdist)
    dl = tmp_path / "dl-elsewhere"
    shutil.move(wd2 / "downloads", dl)
    (dl / vllm_sdist.name).write_bytes(b"my own tarball, not vLLM\n")
    (wd2 / "downloads").symlink_to(dl, target_is_directory=True)
    res = cli("fetch", "--workdir", str(wd2), "--source", "sdist")
    refused(res, FetchError.exit_code, f"{wd2 / 'downloads'} is a symlink")
    assert (dl / vllm_sdist.name).read_bytes() == b"my own tarball, not vLLM\n"

    # pristine/: a 3,400-file temporary tree was left behind the link
    wd3 = tmp_path / "work3"
    seed_downloads(wd3, vllm_sdist)
    pr = tmp_path / "pristine-elsewhere"
    pr.mkdir()
    (wd3 / "pristine").symlink_to(pr, target_is_directory=True)
    res = cli("fetch", "--workdir", str(wd3), "--source", "sdist")
    # fetch's own error, as for downloads/ above: the temporary's refusal was the general
    # configuration error (exit 2) and the copy's a moment later fetch's (exit 3)
    refused(res, FetchError.exit_code, f"{wd3 / 'pristine'} is a symlink")
    assert list(pr.iterdir()) == []


# --------------------------------------------------------------------------- 3. adoption


def test_adoption_never_overwrites_moves_or_deletes_a_user_file(
        tmp_path: Path, vllm_sdist: Path) -> None:
    # a user's downloads/vllm-0.10.2.tar.gz (not the real one) was deleted by fetch --adopt
    home = tmp_path / "home"
    (home / "downloads").mkdir(parents=True)
    (home / "downloads" / upstream.SDIST_NAME).write_bytes(b"my own build of vllm\n")
    res = cli("fetch", "--workdir", str(home), "--source", "sdist", "--adopt")
    refused(res, FetchError.exit_code, "kvprefetch did not download it")
    assert (home / "downloads" / upstream.SDIST_NAME).read_bytes() == b"my own build of vllm\n"

    # a user's state/baseline.json was overwritten
    home2 = tmp_path / "home2"
    (home2 / "state").mkdir(parents=True)
    (home2 / "state" / "baseline.json").write_text('{"mine": true}\n')
    res = cli("fetch", "--workdir", str(home2), "--source", str(vllm_sdist), "--adopt")
    refused(res, FetchError.exit_code, f"{home2 / 'state' / 'baseline.json'} exists but "
                                       "kvprefetch did not create it")
    assert (home2 / "state" / "baseline.json").read_text() == '{"mine": true}\n'

    # a user's trees/baseline/ was moved to backup/ by --force, then deleted by clean
    home3 = tmp_path / "home3"
    (home3 / "trees" / "baseline").mkdir(parents=True)
    (home3 / "trees" / "baseline" / "a.py").write_text("mine\n")
    before = tree_bytes(home3)
    res = cli("fetch", "--workdir", str(home3), "--source", str(vllm_sdist), "--adopt",
              "--force")
    refused(res, FetchError.exit_code, f"{home3 / 'trees' / 'baseline'} exists but "
                                       "kvprefetch did not create it")
    res = cli("clean", "--workdir", str(home3), "--what", "all", "--discard-edits")
    assert res.returncode == 0, res.stderr
    after = tree_bytes(home3)
    assert {k: after.get(k) for k in before} == before
    assert not (home3 / "backup").exists()


# --------------------------------------------------------------------------- 4. Slurm


def _plan(camp: Path, *args: str) -> subprocess.CompletedProcess:
    return cli("slurm", "plan", str(camp), "--source", "sdist", *args)


@pytest.mark.parametrize(("args", "needle"), [
    (("--partition", "gpu\ntouch PWNED"), "--partition"),
    (("--gres", "gpu:1\ntouch PWNED"), "--gres"),
    (("--account", "me;touch PWNED"), "--account"),
    (("--time", "1:00:00 --wrap=x"), "--time"),
    (("--scratch", "/scratch/$USER\rtouch PWNED"), "--scratch"),
    (("--preset", "a\ntouch PWNED"), "control character"),
], ids=["partition-newline", "gres-newline", "account-semicolon", "time-space",
        "scratch-carriage-return", "preset-newline"])
def test_slurm_values_a_shell_or_sbatch_would_split_are_refused(
        tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    camp = tmp_path / "camp"
    res = _plan(camp, *args)
    refused(res, ConfigError.exit_code, needle)
    assert not camp.exists()


@pytest.mark.parametrize("name", ["c$(touch PWNED)", "c\nd", "c d", "c%j"],
                         ids=["dollar-paren", "newline", "space", "percent"])
def test_a_campaign_folder_a_script_cannot_hold_safely_is_refused(tmp_path: Path,
                                                                  name: str) -> None:
    res = _plan(tmp_path / name)
    refused(res, ConfigError.exit_code, "cannot go into an sbatch script safely")
    assert not (tmp_path / name).exists()
    assert not (tmp_path / "PWNED").exists()


def test_slurm_plan_never_overwrites_a_user_script_and_no_other_line_runs(
        tmp_path: Path) -> None:
    from kvprefetch.runner import run

    # a folder with the user's own scripts: refused, the scripts intact
    mine = tmp_path / "mine"
    (mine / "scripts").mkdir(parents=True)
    (mine / "scripts" / "00-prepare.sbatch").write_text("#!/bin/bash\necho mine\n")
    before = tree_bytes(mine)
    refused(_plan(mine), ConfigError.exit_code, "not empty and holds no kvprefetch campaign")
    assert tree_bytes(mine) == before

    # values hostile to a shell: no longer legal for --preset and --context (a known preset, a
    # size: the fourth pass's values, test_hostile_pass4_values.py), refused, nothing written
    camp = tmp_path / "camp"
    hostile = "x;$(touch PWNED)`touch PWNED`'\""
    for option in ("--preset", "--context"):
        refused(_plan(camp, "--python", "/bin/echo", option, hostile), ConfigError.exit_code,
                f"Invalid value for '{option}'")
        assert not camp.exists()
    # legal values, quoted, so nothing but the kit runs
    res = _plan(camp, "--python", "/bin/echo", "--partition", "gpu,debug", "--time", "1-12:00",
                "--gres", "gpu:h100:2", "--preset", "llama-3.1-8b,gemma-2b", "--context",
                "512,1k", "--stand-in")
    assert res.returncode == 0, res.stderr
    # the kit's own scripts are replaced on a replan, a user's edit of one is not
    assert _plan(camp, "--python", "/bin/echo").returncode == 0
    for script in sorted((camp / "scripts").iterdir()):
        text = script.read_text()
        assert run(["bash", "-n", str(script)], echo=False, check=False).returncode == 0
        for line in text.splitlines():
            assert not line.startswith("#SBATCH") or " " not in line[len("#SBATCH "):], line
    verify = camp / "scripts" / "20-verify.sbatch"
    res2 = _plan(camp, "--python", "/bin/echo", "--preset", "gemma-2b", "--context", "1k")
    assert res2.returncode == 0, res2.stderr
    bench = camp / "scripts" / "30-bench.sbatch"
    env = {"PATH": os.environ["PATH"], "SLURM_ARRAY_TASK_ID": "0", "HOME": str(tmp_path)}
    out = run(["bash", str(bench)], env=env, cwd=tmp_path, echo=False, check=False)
    assert out.returncode == 0, out.output
    assert "--context 1k --preset gemma-2b" in out.output  # /bin/echo printed the values
    assert not list(tmp_path.rglob("PWNED")) and not list(camp.rglob("PWNED"))
    verify.write_text(verify.read_text() + "echo my edit\n")
    refused(_plan(camp, "--python", "/bin/echo"), ConfigError.exit_code,
            f"{verify} exists and was not written by")


# ------------------------------------------------------------------ 5. bad input, no traceback


def test_bad_input_is_one_message_never_a_traceback_or_a_hang(
        tmp_path: Path, fetched_template: Path) -> None:
    res = cli("fetch", "--workdir", str(tmp_path / "w"), "--source", "sdist", "--index-url",
              "not a url")
    refused(res, ConfigError.exit_code, "--index-url 'not a url'")
    assert not (tmp_path / "w").exists()

    # a FIFO inside a --source folder: reading it would block forever
    src = tmp_path / "src"
    link_tree(fetched_template / "pristine" / "sdist", src)
    os.mkfifo(src / "vllm" / "pipe")
    res = cli("fetch", "--workdir", str(tmp_path / "w2"), "--source", str(src), timeout=300)
    refused(res, FetchError.exit_code, "not the complete vLLM v0.10.2 source")

    # malformed campaign.json: missing keys, wrong types, a root elsewhere, 200k deep
    camp = tmp_path / "camp"
    assert cli("slurm", "plan", str(camp), "--source", "sdist").returncode == 0
    good = json.loads((camp / "campaign.json").read_text())
    bad_plans = [{"schema": 2}, {**good["plan"], "trees": 5},
                 {**good["plan"], "slurm": {"partition": "gpu\nrm -rf ~"}},
                 {**good["plan"], "root": str(tmp_path / "elsewhere")},
                 {**good["plan"], "jobs": [{"name": "prepare", "script": "../../x.sbatch",
                                            "after": [], "array": None}]}]
    for plan in bad_plans:
        (camp / "campaign.json").write_text(json.dumps({"plan": plan, "submitted": {}}))
        refused(cli("slurm", "status", str(camp)), ConfigError.exit_code)
    (camp / "campaign.json").write_text("[" * 200_000 + "]" * 200_000)
    refused(cli("slurm", "status", str(camp)), ConfigError.exit_code, "cannot read")


# --------------------------------------------------------------------------- fuzz


def test_fuzz_corrupt_records_never_touch_anything_outside_the_work_dir(tmp_path: Path) -> None:
    """Seeded: 250 work directories whose ownership record and apply journal hold random,
    hostile paths and kinds; clean (every --what, with --discard-edits), orphan removal and
    apply recovery run on each. Nothing outside the work directory may change, and every
    failure must be the kit's own error (no other exception)."""
    import random

    from kvprefetch.errors import KvprefetchError
    from kvprefetch.workspace import ownership, treetxn
    from kvprefetch.workspace.cleaning import clean
    from kvprefetch.workspace.workdir import Workdir

    rng = random.Random(41)
    sandbox = tmp_path / "sandbox"
    outside_dir = sandbox / "outside"
    (outside_dir / "d").mkdir(parents=True)
    (outside_dir / "d" / "f.txt").write_text("keep\n")
    (outside_dir / "g.txt").write_text("keep too\n")
    before = tree_bytes(outside_dir)
    pieces = ["..", ".", "", "outside", "d", "f.txt", "trees", "build", "state", "tmp",
              "patched", "x.json", "backup", "pristine", "\n", "a\x00b", "-1"]
    kinds = ["tree", "state", "build", "tmp", "backup", "pristine", "download", "toolkit", 7]

    def hostile_path() -> str:
        if rng.random() < 0.15:
            return str(outside_dir / rng.choice(["d", "g.txt", "d/f.txt", ""]))
        return "/".join(rng.choice(pieces) for _ in range(rng.randint(1, 5)))

    for i in range(250):
        wd = sandbox / f"w{i % 5}"
        shutil.rmtree(wd, ignore_errors=True)
        (wd / "trees" / "patched").mkdir(parents=True)
        (wd / "trees" / "patched" / "a.txt").write_text("a\n")
        (wd / "build" / "patched").mkdir(parents=True)
        (wd / ".kvprefetch-workdir").write_text("created by kvprefetch\n")
        if rng.random() < 0.3:  # a symlink the kit did not make, somewhere on the way
            linked = wd / rng.choice(["build", "trees"])
            shutil.rmtree(linked)
            linked.symlink_to(outside_dir, target_is_directory=True)
        paths = {}
        for _ in range(rng.randint(1, 4)):
            entry: dict = {"kind": rng.choice(kinds)}
            if rng.random() < 0.7:
                entry["pid"] = rng.choice([999_999_999, os.getpid(), None, "1", -5])
            paths[hostile_path()] = entry
        (wd / OWNED).write_text(json.dumps({"paths": paths}))
        stage = wd / "trees" / ".patched.apply"
        if rng.random() < 0.5 and not (wd / "trees").is_symlink():
            stage.mkdir(parents=True, exist_ok=True)
            target = outside_dir / "g.txt"
            (stage / "journal.json").write_text(json.dumps({"tree": "patched", "state": {},
                "files": [{"rel": hostile_path(), "before": rng.choice([None, "0" * 64]),
                           "after": hashlib.sha256(target.read_bytes()).hexdigest()}]}))
        what = rng.choice(["builds", "trees", "all"])
        for step in range(3):
            try:
                if step == 0:
                    clean(wd, what, discard_edits=True)
                elif step == 1:
                    ownership.remove_orphans(wd)
                else:
                    treetxn.recover(Workdir(wd), "patched")
            except KvprefetchError:
                pass
        assert tree_bytes(outside_dir) == before, f"iteration {i} changed the outside folder"
