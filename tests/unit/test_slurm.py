"""`kvprefetch slurm`: the campaign's scripts, its dependency chain, replanning refusals, and the
scontrol/sacct parsers behind `status`, all pure (a real one-node Slurm runs a campaign in
tests/integration/test_slurm.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvprefetch.errors import ConfigError, SlurmError
from kvprefetch.slurm.campaign import (
    BenchSpec,
    SlurmOptions,
    TreeSpec,
    campaign_from_dict,
    make_campaign,
    parse_trees,
)
from kvprefetch.slurm.cluster import (
    JobState,
    parse_parsable,
    parse_sacct,
    parse_scontrol,
    status,
    submit,
    wait,
)
from kvprefetch.slurm.folder import write_campaign
from kvprefetch.slurm.scripts import render_script
from kvprefetch.slurm.values import check_scratch

TWO = parse_trees("baseline,patched")


def _campaign(root: Path, trees: str = "baseline,patched", scratch: str = "node",
              keep_scratch: bool = False, source: str = "/cache/vllm-0.10.2.tar.gz",
              **slurm: object):  # type: ignore[no-untyped-def]
    return make_campaign(
        root, python="/opt/py/bin/python", kit_root="/opt/kit/src", kit_commit="abc123",
        kit_version="0.1.0", path="/usr/bin:/bin", source=source,
        trees=parse_trees(trees), arch="9.0a", build_args=("--head-sizes", "128"),
        no_gpu=False, bench=BenchSpec((1, 8, 32)),
        slurm=SlurmOptions(**slurm),  # type: ignore[arg-type]
        scratch=scratch, keep_scratch=keep_scratch)


def test_scripts_are_self_contained_and_pass_options_only_when_given(tmp_path: Path) -> None:
    c = _campaign(tmp_path / "camp", partition="gpu", gres="gpu:1", cpus_per_build=4)
    write_campaign(c)
    root = Path(c.root)
    scripts = {j.name: (root / j.script).read_text() for j in c.jobs}
    assert sorted(scripts) == ["bench", "build-baseline", "build-patched", "merge", "prepare",
                               "verify"]
    for name, text in scripts.items():
        assert text.startswith("#!/bin/bash\n")
        assert "set -euo pipefail" in text
        assert "export PYTHONPATH=/opt/kit/src" in text and "export PATH=/usr/bin:/bin" in text
        assert "/opt/py/bin/python -m kvprefetch" in text
        assert "#SBATCH --output=/dev/null" in text  # the job writes its own log
        assert "#SBATCH --partition=gpu" in text
        assert "--account" not in text and "--time" not in text  # never given: never passed
        # the GPU is asked for only by the jobs that use one
        assert ("#SBATCH --gres=gpu:1" in text) == (name in ("verify", "bench"))
        assert ("#SBATCH --cpus-per-task=4" in text) == name.startswith("build-")
    assert 'build --workdir "$SCRATCH" --kernels-only --trees patched --arch 9.0a --jobs 4 ' \
           "--head-sizes 128" in scripts["build-patched"]
    assert "#SBATCH --array=0-2" in scripts["bench"]
    assert "BATCHES=(1 8 32)" in scripts["bench"]
    assert '--batch "${BATCHES[$SLURM_ARRAY_TASK_ID]}"' in scripts["bench"]
    assert f"-m kvprefetch slurm prepare {root}" in scripts["prepare"]
    assert 'fetch --workdir "$SCRATCH" --source /cache/vllm-0.10.2.tar.gz' \
        in scripts["build-patched"]
    assert f"report --merge {root}/results/bench-0.json {root}/results/bench-1.json " \
           f"{root}/results/bench-2.json" in scripts["merge"]
    plan = json.loads((root / "campaign.json").read_text())
    assert campaign_from_dict(plan["plan"]) == c
    assert plan["submitted"] == {}


def test_no_gpu_and_stand_in_ask_for_no_gpu(tmp_path: Path) -> None:
    c = make_campaign(tmp_path, python="/p", kit_root="/k", kit_commit=None, kit_version="0",
                      path="/bin", source="sdist", trees=TWO, arch="9.0a",
                      build_args=(), no_gpu=True, bench=BenchSpec((1, 8), stand_in=True),
                      slurm=SlurmOptions(gres="gpu:1"))
    for j in c.jobs:
        assert "--gres" not in render_script(c, j)
    bench = render_script(c, c.job("bench"))
    assert 'slurm stand-in' in bench and "bench kernel" not in bench
    assert "--no-gpu" in render_script(c, c.job("verify"))


def test_dependency_chain_is_afterok_on_the_previous_stage(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # set, the index is not asked of pip (a process: job_env.sbatch_environ)
    monkeypatch.setenv("PIP_INDEX_URL", "https://pypi.org/simple")
    c = _campaign(tmp_path / "camp")
    write_campaign(c)
    rows = {r["job"]: r["argv"] for r in submit(Path(c.root), dry_run=True)}
    assert list(rows) == ["prepare", "build-baseline", "build-patched", "verify", "bench",
                          "merge"]
    assert rows["prepare"][:2] == ["sbatch", "--parsable"]
    assert not any(a.startswith("--dependency") for a in rows["prepare"])
    assert "--dependency=afterok:<prepare>" in rows["build-baseline"]
    assert "--dependency=afterok:<prepare>" in rows["build-patched"]
    assert "--dependency=afterok:<build-baseline>:<build-patched>" in rows["verify"]
    assert "--dependency=afterok:<verify>" in rows["bench"]
    assert "--dependency=afterok:<bench>" in rows["merge"]
    assert rows["merge"][-1] == f"{c.root}/scripts/40-merge.sbatch"


def test_trees_name_variants_and_baseline_comes_first() -> None:
    assert parse_trees("patched,launch,paper,control,mine=launch,old=seed") == (
        TreeSpec("baseline", None), TreeSpec("patched", "prefetch"), TreeSpec("launch", "launch"),
        TreeSpec("paper", "paper"), TreeSpec("control", "control"), TreeSpec("mine", "launch"),
        TreeSpec("old", "paper"))
    assert parse_trees("prefetch,baseline") == TWO
    for bad, why in (("baseline", "no tree to compare"), ("patched,prefetch", "named twice"),
                     ("x=nope", "not a variant"), ("zzz", "not a variant"),
                     ("../x=launch", "not a tree name")):
        with pytest.raises(ConfigError, match=why):
            parse_trees(bad)


def test_a_campaign_builds_baseline_first_and_never_from_git(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"builds baseline \(stock\) first"):
        make_campaign(tmp_path, python="/p", kit_root="/k", kit_commit=None, kit_version="0",
                      path="/bin", source="sdist", trees=(TreeSpec("patched", "prefetch"),),
                      arch="9.0a", build_args=(), no_gpu=True, bench=BenchSpec(),
                      slurm=SlurmOptions())
    with pytest.raises(ConfigError, match="--source git has none"):
        _campaign(tmp_path, source="git")


def test_one_build_job_per_tree_each_applying_its_variant(tmp_path: Path) -> None:
    c = _campaign(tmp_path / "camp", trees="baseline,patched,launch,paper,control,mine=launch")
    names = [j.name for j in c.jobs]
    assert names == ["prepare", "build-baseline", "build-patched", "build-launch", "build-paper",
                     "build-control", "build-mine", "verify", "bench", "merge"]
    assert c.job("verify").after == tuple(n for n in names if n.startswith("build-"))
    scripts = {j.name: render_script(c, j) for j in c.jobs}
    # each job fetches only its own tree into its scratch
    for name in names:
        if name.startswith("build-"):
            assert f"--source /cache/vllm-0.10.2.tar.gz --only {name[6:]}\n" in scripts[name]
            assert "--extra-tree" not in scripts[name]
    assert "apply" not in scripts["build-baseline"]
    assert ('apply --workdir "$SCRATCH" --variant prefetch --tree patched'
            in scripts["build-patched"])
    assert 'apply --workdir "$SCRATCH" --variant launch --tree mine' in scripts["build-mine"]
    assert 'apply --workdir "$SCRATCH" --variant control --tree control' \
        in scripts["build-control"]
    assert "--trees baseline,patched,launch,paper,control,mine --json" in scripts["verify"]
    assert "--tree mine --out" in scripts["bench"]
    # round trip through campaign.json
    write_campaign(c)
    rec = json.loads((Path(c.root) / "campaign.json").read_text())
    assert rec["plan"]["trees"][-1] == {"name": "mine", "variant": "launch"}
    assert campaign_from_dict(rec["plan"]) == c


def test_build_jobs_work_in_their_own_scratch_and_publish_at_the_end(tmp_path: Path) -> None:
    c = _campaign(tmp_path / "camp")
    root = Path(c.root)
    text = render_script(c, c.job("build-patched"))
    body = text.split("\n")
    assert 'SCRATCH_BASE="${SLURM_TMPDIR:-${TMPDIR:-/tmp}}"' in body
    assert 'SCRATCH="$SCRATCH_BASE/kvprefetch-camp-build-patched-${SLURM_JOB_ID:-$$}"' in body
    # checked as spelled before anything is made, made, checked as resolved, then used by the
    # resolved path, all before the job's own folder is made in it
    base = next(i for i, ln in enumerate(body) if ln.startswith('mkdir -p -- "$SCRATCH_BASE" ||'))
    spelled = next(i for i, ln in enumerate(body)
                   if ln.startswith('if in_campaign "$SCRATCH_BASE"'))
    real = next(i for i, ln in enumerate(body) if ln.startswith('if in_campaign "$SCRATCH_REAL"'))
    assert spelled < base < real < body.index("SCRATCH_BASE=$SCRATCH_REAL") < next(
        i for i, ln in enumerate(body) if ln.startswith('SCRATCH="$SCRATCH_BASE/'))
    # the exit trap is set only once the folder is this job's own (mkdir without -p)
    made = next(i for i, ln in enumerate(body) if ln.startswith('mkdir -- "$SCRATCH" || {'))
    assert made < body.index("at_exit() {")  # the build job's own end: its scratch
    assert '  rm -rf -- "$SCRATCH"' in body
    publish = f"/opt/py/bin/python -m kvprefetch slurm publish {root} --tree patched --scratch " \
              '"$SCRATCH"'
    assert f'  if [ "$rc" -ne 0 ]; then {publish} --logs-only || true; fi' in body
    # the steps in order, the last one publishing; nothing of the build writes to the campaign
    steps = [ln for ln in body if ln.startswith("/opt/py/bin/python")]
    assert [s.split()[3] for s in steps] == ["fetch", "apply", "build", "slurm"]
    assert steps[-1] == publish
    assert all(f"{root}/work" not in s for s in steps)
    # other scratch places
    kept = render_script(_campaign(tmp_path / "c2", scratch="/lscratch/kvp", keep_scratch=True),
                         c.job("build-patched"))
    assert 'SCRATCH_BASE="/lscratch/kvp"\n' in kept
    assert 'rm -rf -- "$SCRATCH"' not in kept and 'echo "scratch kept: $SCRATCH"' in kept
    own = render_script(_campaign(tmp_path / "c3", scratch="/lscratch/$USER"),
                        c.job("build-baseline"))
    # $USER as the job's first shell read it, before it kept only job_env's names
    assert 'SCRATCH_BASE="/lscratch/${KVPREFETCH_SCRATCH_USER}"\n' in own
    assert "  for KVPREFETCH_V in USER; do\n" in own


def test_scratch_folders_a_shell_could_run_are_refused() -> None:
    assert check_scratch("/scratch/${USER}/kvp", "/c") == "/scratch/${USER}/kvp"
    assert check_scratch("/camp2/x", "/camp") == "/camp2/x"  # beside the campaign, not in it
    for bad in ("relative/dir", '/x"; rm -rf /; "', "/x/$(id)", "/x/`id`", "/a\\b", "/a\nb"):
        with pytest.raises(ConfigError, match="--scratch"):
            check_scratch(bad, "/c")


def test_a_scratch_in_the_campaign_is_refused() -> None:
    """A build job works in its scratch by path: a scratch in the campaign is one whoever can
    write the campaign could swap for a link (issue 41, the twelfth hostile pass)."""
    for bad in ("campaign", "/camp", "/camp/", "/camp/scratch", "/camp/scratch/$USER"):
        with pytest.raises(ConfigError, match="campaign") as e:
            check_scratch(bad, "/camp")
        assert "pass node" in e.value.fix


def test_replanning_a_submitted_campaign_differently_is_refused(tmp_path: Path) -> None:
    c = _campaign(tmp_path / "camp")
    write_campaign(c)
    rec = json.loads((Path(c.root) / "campaign.json").read_text())
    rec["submitted"] = {"prepare": [{"id": "7", "task": None}]}
    (Path(c.root) / "campaign.json").write_text(json.dumps(rec))
    write_campaign(c)  # the same plan again: fine, the ids are kept
    assert json.loads((Path(c.root) / "campaign.json").read_text())["submitted"]["prepare"]
    with pytest.raises(ConfigError, match="already submitted"):
        write_campaign(_campaign(tmp_path / "camp", partition="other"))


# Lines as Slurm 22.05 prints them (taken from the real cluster of the test below).
SCONTROL = (
    "JobId=12 ArrayJobId=12 ArrayTaskId=1 ArrayTaskThrottle=0 JobName=kvp-c-bench UserId=root(0) "
    "JobState=COMPLETED Reason=None Dependency=(null) ExitCode=0:0\n"
    "JobId=13 ArrayJobId=12 ArrayTaskId=0 JobName=kvp-c-bench UserId=root(0) "
    "JobState=FAILED Reason=NonZeroExitCode Dependency=(null) ExitCode=1:0\n")


def test_parsers() -> None:
    assert parse_parsable("42\n") == "42" and parse_parsable("42;cluster\n") == "42"
    with pytest.raises(SlurmError):
        parse_parsable("sbatch: error: Batch job submission failed\n")
    recs = parse_scontrol(SCONTROL)
    assert [(r["ArrayJobId"], r["ArrayTaskId"], r["JobState"]) for r in recs] == \
        [("12", "1", "COMPLETED"), ("12", "0", "FAILED")]
    assert parse_sacct("12_0|FAILED|1:0\n12_1|COMPLETED|0:0\n13|CANCELLED by 0|0:0\n") == [
        {"JobID": "12_0", "State": "FAILED", "ExitCode": "1:0"},
        {"JobID": "12_1", "State": "COMPLETED", "ExitCode": "0:0"},
        {"JobID": "13", "State": "CANCELLED", "ExitCode": "0:0"}]


def test_status_shows_a_resubmitted_task_in_place_of_the_failed_one(tmp_path: Path) -> None:
    # the state source is passed in: this checks the bookkeeping, the real cluster test below
    # checks the same thing against real scontrol output
    c = _campaign(tmp_path / "camp")
    write_campaign(c)
    rec = json.loads((Path(c.root) / "campaign.json").read_text())
    rec["submitted"] = {"bench": [{"id": "12", "task": None}, {"id": "20", "task": 0}]}
    (Path(c.root) / "campaign.json").write_text(json.dumps(rec))
    states = {"12": [JobState("bench", "12_0", "FAILED", "1:0", "", "t"),
                     JobState("bench", "12_1", "COMPLETED", "0:0", "", "t")],
              "20": [JobState("bench", "20_0", "COMPLETED", "0:0", "", "t")]}
    got = status(Path(c.root), lambda job, jid: states[jid])
    assert [(s.id, s.state) for s in got] == [("20_0", "COMPLETED"), ("12_1", "COMPLETED")]


def test_a_forgotten_job_ends_by_its_exit_record_and_wait_stops_on_one_without(
        tmp_path: Path) -> None:
    """Neither scontrol nor sacct knows the jobs (the fetch returns nothing): the exit records
    in logs/ decide, a resubmitted task by its own record; a job with no record is ENDED,
    final and not a success, so `wait` returns instead of polling until its timeout. A
    controller that does not answer (UNKNOWN) is not final: `wait` keeps asking."""
    c = _campaign(tmp_path / "camp")
    write_campaign(c)
    root = Path(c.root)
    rec = json.loads((root / "campaign.json").read_text())
    rec["submitted"] = {"prepare": [{"id": "3"}], "bench": [{"id": "12"}, {"id": "20", "task": 2}]}
    (root / "campaign.json").write_text(json.dumps(rec))
    for name, code in (("prepare-3", "0"), ("bench-12_0", "0"), ("bench-12_1", "2"),
                       ("bench-12_2", "1"), ("bench-20_2", "0")):
        (root / "logs" / f"{name}.exit").write_text(code + "\n")
    got = [(s.id, s.state, s.exit_code) for s in wait(root, 5, 0, lambda job, jid: [])]
    assert got == [("3", "COMPLETED", "0:0"), ("12_0", "COMPLETED", "0:0"),
                   ("12_1", "FAILED", "2:0"), ("20_2", "COMPLETED", "0:0")]

    (root / "logs" / "prepare-3.exit").unlink()
    (root / "logs" / "bench-12_1.exit").write_text("garbage")
    got = [(s.id, s.state) for s in wait(root, 5, 0, lambda job, jid: [])]
    assert got == [("3", "ENDED"), ("12_0", "COMPLETED"), ("12_1", "ENDED"),
                   ("20_2", "COMPLETED")]

    def down(job: str, jid: str) -> list[JobState]:
        return [JobState(job, jid, "UNKNOWN", "?", "scontrol failed", "none")]
    with pytest.raises(SlurmError, match="still not done: prepare 3 UNKNOWN"):
        wait(root, -1, 0, down)


# --------------------------------------------------------------------------- publish, prepare


def _fake_scratch_build(scratch: Path, tree: str, key: str = "k1", payload: bytes = b"lib") \
        -> Path:
    """A scratch work directory as `build --kernels-only --trees TREE` leaves it (files only)."""
    import hashlib

    env = scratch / "envs" / tree
    site = env / "lib" / "python3.11" / "site-packages"
    pkg = site / "kvprefetch_kernels"
    pkg.mkdir(parents=True)
    (env / "bin").mkdir()
    (env / "bin" / "python").symlink_to("/usr/bin/python3")
    (env / "lib64").symlink_to("lib")
    (env / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (pkg / "_C.so").write_bytes(payload)
    bdir = scratch / "build" / tree / key
    (bdir / "logs").mkdir(parents=True)
    (bdir / "logs" / "01-compile.log").write_text("compiled\n")
    (bdir / f"kvprefetch_{tree}_C.so").write_bytes(payload)
    (bdir / "paged_attention_v1.cuda.o").write_bytes(b"object")
    (bdir / "src").mkdir()
    (bdir / "src" / "paged_attention_v1.cu").write_text("// narrowed\n")
    (pkg / "build.json").write_text(json.dumps({"build_so": str(bdir / f"kvprefetch_{tree}_C.so"),
                                                "tree": tree, "key": key}))
    sha = hashlib.sha256(payload).hexdigest()
    (bdir / "manifest.json").write_text(json.dumps({
        "tree": tree, "variant": "prefetch", "namespace": f"kvprefetch_{tree}", "key": key,
        "mode": "kernels-only", "so_path": str(pkg / "_C.so"), "so_sha256": sha,
        "build_so_path": str(bdir / f"kvprefetch_{tree}_C.so"),
        "head_sizes": [128], "block_sizes": [16], "kv_dtypes": ["fp16"],
        "env": {"backend": "venv", "path": str(env), "python": str(env / "bin" / "python")},
        "inputs": {"source_tree": str(scratch / "trees" / tree),
                   "sources": {str(bdir / "src" / "paged_attention_v1.cu"): "ab"}}}))
    return bdir


def test_publish_moves_a_build_into_the_layout_its_readers_accept(tmp_path: Path) -> None:
    from kvprefetch.kernels.ops import find_builds
    from kvprefetch.slurm.publish import publish_build

    scratch, dest = tmp_path / "node-local" / "job-7", tmp_path / "camp" / "work"
    _fake_scratch_build(scratch, "patched")
    res = publish_build(scratch, dest, "patched", label="7", host="n1")
    assert res.build_dir == dest / "build" / "patched" / "k1"
    assert res.env_dir == dest / "envs" / "patched"
    [built] = find_builds(dest, ["patched"])
    assert built.so_path == (
        dest / "envs/patched/lib/python3.11/site-packages/kvprefetch_kernels/_C.so")
    assert built.so_path.read_bytes() == b"lib"
    m = json.loads(built.manifest_path.read_text())
    assert m["env"] == {"backend": "venv", "path": str(res.env_dir),
                        "python": str(res.env_dir / "bin" / "python")}
    assert m["build_so_path"] == str(res.build_dir / "kvprefetch_patched_C.so")
    assert list(m["inputs"]["sources"]) == [str(res.build_dir / "src/paged_attention_v1.cu")]
    # where it was built stays recorded as it was, and the publication is recorded
    assert m["inputs"]["source_tree"] == str(scratch / "trees" / "patched")
    assert m["published"]["from"] == str(scratch / "build" / "patched" / "k1")
    assert m["published"]["job"] == "7" and m["published"]["host"] == "n1"
    bj = json.loads((built.so_path.parent / "build.json").read_text())
    assert bj["build_so"] == str(res.build_dir / "kvprefetch_patched_C.so")
    # the env is still a venv, its links intact; objects are not published, logs are
    assert (res.env_dir / "bin" / "python").readlink() == Path("/usr/bin/python3")
    assert (res.env_dir / "lib64").readlink() == Path("lib")
    assert not (res.build_dir / "paged_attention_v1.cuda.o").exists()
    assert (res.build_dir / "logs" / "01-compile.log").is_file()
    # no temporary names are left behind
    leftovers = [p.name for p in dest.rglob(".*") if ".publish-" in p.name or ".old-" in p.name]
    assert leftovers == []


def test_a_resubmitted_build_replaces_its_tree_and_touches_no_other(tmp_path: Path) -> None:
    from kvprefetch.kernels.ops import find_builds
    from kvprefetch.slurm.publish import publish_build

    dest = tmp_path / "work"
    _fake_scratch_build(tmp_path / "s1", "baseline", payload=b"base")
    _fake_scratch_build(tmp_path / "s2", "patched", payload=b"old")
    publish_build(tmp_path / "s1", dest, "baseline", label="1")
    publish_build(tmp_path / "s2", dest, "patched", label="2")
    _fake_scratch_build(tmp_path / "s3", "patched", payload=b"new")
    publish_build(tmp_path / "s3", dest, "patched", label="3")
    got = {b.tree: b.so_path.read_bytes() for b in find_builds(dest)}
    assert got == {"baseline": b"base", "patched": b"new"}
    assert sorted(p.name for p in (dest / "envs").iterdir()) == ["baseline", "patched"]


def test_publish_refuses_a_library_that_does_not_match_its_manifest(tmp_path: Path) -> None:
    from kvprefetch.slurm.publish import publish_build

    bdir = _fake_scratch_build(tmp_path / "s", "patched")
    m = json.loads((bdir / "manifest.json").read_text())
    Path(m["so_path"]).write_bytes(b"tampered")
    with pytest.raises(SlurmError, match="sha256"):
        publish_build(tmp_path / "s", tmp_path / "work", "patched", label="9")
    assert not (tmp_path / "work" / "build" / "patched" / "k1").exists()
    assert not (tmp_path / "work" / "envs" / "patched").exists()
    with pytest.raises(SlurmError, match="no kernels-only build of launch"):
        publish_build(tmp_path / "s", tmp_path / "work", "launch", label="9")


def test_a_failed_build_keeps_its_logs_not_its_objects(tmp_path: Path) -> None:
    from kvprefetch.slurm.publish import keep_logs

    _fake_scratch_build(tmp_path / "s", "patched")
    kept = keep_logs(tmp_path / "s", "patched", tmp_path / "logs" / "build-patched-5",
                     root=tmp_path)
    assert kept is not None
    assert sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*")) == \
        ["k1", "k1/logs", "k1/logs/01-compile.log", "k1/manifest.json"]
    assert keep_logs(tmp_path / "s", "launch", tmp_path / "logs" / "x", root=tmp_path) is None


def test_prepare_checks_the_source_and_records_the_build_folders(tmp_path: Path) -> None:
    from kvprefetch.errors import FetchError
    from kvprefetch.slurm.prepare import prepare
    from kvprefetch.workspace import ownership

    wrong = tmp_path / "vllm-0.10.2.tar.gz"
    wrong.write_bytes(b"not the sdist")
    c = _campaign(tmp_path / "camp", trees="patched,launch", source=str(wrong))
    with pytest.raises(FetchError, match=r"not the vLLM 0\.10\.2 sdist"):
        prepare(c)
    assert wrong.read_bytes() == b"not the sdist"  # the user's file, never deleted
    clone = tmp_path / "vllm-clone"
    clone.mkdir()
    c = _campaign(tmp_path / "camp", trees="patched,launch", source=str(clone))
    res = prepare(c)
    assert res.source == str(clone) and not res.downloaded
    assert res.recorded == ("baseline", "patched", "launch")
    work = Path(c.root) / "work"
    assert (work / ".kvprefetch-workdir").is_file()
    assert {k for k, v in ownership.entries(work).items() if v["kind"] == "build"} == \
        {"build/baseline", "build/patched", "build/launch"}
    assert prepare(c).recorded == ()  # a resubmitted prepare records nothing twice
    assert c.source_cache == str(clone)
    assert _campaign(tmp_path / "c2", source="sdist").source_cache == \
        f"{tmp_path}/c2/cache/vllm-0.10.2.tar.gz"
