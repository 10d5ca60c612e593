"""`kvprefetch slurm` for real (the campaign's scripts, chain and parsers are tested pure in
tests/unit/test_slurm.py): the slow integration test runs a REAL one-node Slurm (Debian's slurm-wlm:
munged, slurmctld, slurmd on this machine, a generated slurm.conf, no GPU gres) running a tiny
campaign end to end through real sbatch: the prepare job checks the read-only source (the cached
sdist); each build job (two) fetches from it into its own scratch folder, applies its variant,
builds one narrowed instantiation kernels-only and publishes the outputs into the campaign by
rename; then verify-kernel --no-gpu on the published builds, a 2-task array of CPU stand-in bench
shards, the merge; then one array task resubmitted alone. Every daemon the test starts is stopped by
the fixture's finalizer, pass or fail. Needs root (daemons, apt); skipped with the reason
otherwise."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvprefetch.slurm.campaign import (
    BenchSpec,
    Campaign,
    SlurmOptions,
    make_campaign,
    parse_trees,
)
from kvprefetch.slurm.cluster import status
from kvprefetch.slurm.folder import write_campaign
from tests.integration.helpers import kvprefetch_cli_split

# --------------------------------------------------------------------------- fast, pure


# --------------------------------------------------------------------------- a real Slurm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Cluster:
    def __init__(self, d: Path, env: dict[str, str]) -> None:
        self.dir = d
        self.env = env

    def logs(self) -> str:
        out = []
        for name in ("slurmctld.log", "slurmd.log"):
            p = self.dir / name
            if p.exists():
                out.append(f"--- {name} (last lines)\n" + "\n".join(
                    p.read_text(errors="replace").splitlines()[-30:]))
        return "\n".join(out)


def _ensure_slurm_installed() -> str | None:
    """None when slurmctld, slurmd and munged are installed (apt-get installs them if not),
    else why not."""
    if all(shutil.which(p) for p in ("slurmctld", "slurmd", "munged", "sbatch")):
        return None
    if shutil.which("apt-get") is None:
        return "slurm-wlm is not installed and there is no apt-get"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update"], ["apt-get", "install", "-y", "slurm-wlm", "munge"]):
        r = subprocess.run(argv, env=env, capture_output=True, text=True, check=False,
                           timeout=600)
        if r.returncode != 0:
            return f"{' '.join(argv)} failed: {r.stderr.strip()[-300:]}"
    return None


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """munged on a socket of its own, slurmctld and slurmd on this host with their own ports and
    a generated slurm.conf; all stopped after. (A munged shared with another run, as this
    fixture once used one already running, was stopped under that run by whichever started
    it: two suites on one machine, as a rehearsal beside a developer's run, broke each other.)
    No accounting and MinJobAge=2: the controller forgets a finished job within seconds, as a
    small cluster without slurmdbd does after 300 s, so `slurm status` must read how each job
    ended from its exit record (a campaign longer than 300 s failed exactly there)."""
    if os.geteuid() != 0:
        pytest.skip("a real Slurm needs root here (daemons, apt-get, munge key)")
    why = _ensure_slurm_installed()
    if why:
        pytest.skip(f"cannot install Slurm: {why}")
    d = tmp_path_factory.mktemp("slurm")
    host = socket.gethostname().split(".")[0]
    started: list[subprocess.Popen[bytes]] = []
    own_munged = False
    env = dict(os.environ, SLURM_CONF=str(d / "slurm.conf"))
    # munged checks that its socket's folder is the munge user's and not writable by others,
    # and runs as that user, who cannot enter pytest's 0700 folders: its files go beside the
    # system's, under names of this run
    tag = f"kvptest-{os.getpid()}-{secrets.token_hex(4)}"
    munge_socket = f"/run/munge/munge.socket.{tag}"
    munged_files = [f"--socket={munge_socket}", f"--pid-file=/run/munge/{tag}.pid",
                    f"--log-file=/var/log/munge/{tag}.log",
                    f"--seed-file=/var/lib/munge/{tag}.seed"]

    def stop() -> None:
        if started:
            subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True, check=False,
                           timeout=30)
        deadline = time.monotonic() + 15
        pids = [int(p.read_text().strip()) for p in d.glob("*.pid") if p.read_text().strip()]
        for p in started:
            pids.append(p.pid)
        while any(_pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.25)
            for p in started:
                p.poll()
        for pid in pids:
            if _pid_alive(pid):
                os.kill(pid, 15)
        for p in started:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if own_munged:
            subprocess.run(["runuser", "-u", "munge", "--", "munged", "--stop",
                            f"--socket={munge_socket}"],
                           capture_output=True, check=False, timeout=30)
            for leftover in (f"/var/log/munge/{tag}.log", f"/var/lib/munge/{tag}.seed"):
                Path(leftover).unlink(missing_ok=True)

    try:
        key = Path("/etc/munge/munge.key")
        if not key.exists():
            subprocess.run(["mungekey", "--create"], check=True, capture_output=True)
            shutil.chown(key, "munge", "munge")
            key.chmod(0o400)
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        for folder in ("/var/log/munge", "/var/lib/munge"):
            Path(folder).mkdir(parents=True, exist_ok=True)
            shutil.chown(folder, "munge", "munge")
        r = subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged", *munged_files],
                           capture_output=True, text=True, check=False)
        if r.returncode != 0:
            pytest.skip(f"munged does not start: {r.stderr.strip()}")
        own_munged = True
        cpus = os.cpu_count() or 1
        (d / "state").mkdir()
        (d / "spool").mkdir()
        (d / "slurm.conf").write_text(f"""ClusterName=kvptest
SlurmctldHost={host}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MinJobAge=2
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SchedulerParameters=sched_interval=2
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
NodeName={host} CPUs={cpus} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        for daemon in ("slurmctld", "slurmd"):
            with open(d / f"{daemon}.out", "wb") as out:
                started.append(subprocess.Popen([daemon, "-D"], env=env, stdout=out,
                                                stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True))
        deadline = time.monotonic() + 60
        state = ""
        while time.monotonic() < deadline:
            r = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True,
                               text=True, check=False)
            state = r.stdout.strip()
            if state == "idle":
                break
            time.sleep(0.5)
        else:
            stop()
            pytest.skip(f"the one-node cluster did not come up (sinfo: {state!r})\n"
                        + Cluster(d, env).logs())
        yield Cluster(d, env)
    finally:
        stop()


def _status(campaign: Path, env: dict[str, str], timeout: int) -> tuple[int, list[dict]]:
    r = kvprefetch_cli_split("slurm", "status", str(campaign), "--wait", "--timeout",
                             str(timeout), "--json", env=env, timeout=timeout + 60)
    return r.returncode, (json.loads(r.stdout) if r.stdout.strip() else [])


@pytest.mark.slow
@pytest.mark.slurm
def test_a_campaign_end_to_end_on_a_real_slurm(slurm_cluster: Cluster, vllm_sdist: Path,
                                               tmp_path: Path) -> None:
    import kvprefetch

    env = {k: v for k, v in slurm_cluster.env.items()
           if k not in ("KVPREFETCH_WORKDIR", "VLLM_USE_PRECOMPILED")}
    # this kit, whatever the interpreter's own install is (the campaign pins the same path)
    env["PYTHONPATH"] = str(Path(kvprefetch.__file__).resolve().parent.parent)
    # What sbatch passes on is job_env's list, not this shell (--export=ALL, its default): a
    # BASH_ENV here, which every job's bash would read as it starts, reaches no job
    sourced, rc_file = tmp_path / "sourced", tmp_path / "rc"
    rc_file.write_text(f'[ -z "${{SLURM_JOB_ID:-}}" ] || echo "$SLURM_JOB_ID" >> {sourced}\n')
    env.update(BASH_ENV=str(rc_file), SBATCH_EXPORT="ALL")
    camp = tmp_path / "camp"
    scratch = tmp_path / "node-scratch"  # stands for a node-local disk ($SLURM_TMPDIR)
    t0 = time.monotonic()
    cpus = os.cpu_count() or 1
    plan = kvprefetch_cli_split(
        "slurm", "plan", str(camp), "--source", str(vllm_sdist), "--trees", "baseline,patched",
        "--scratch", str(scratch), "--head-sizes", "128",
        "--block-sizes", "16", "--kv-dtypes", "fp16", "--no-gpu", "--batch", "1,8",
        "--context", "1k", "--stand-in", *(["--cpus-per-build", "1"] if cpus == 2 else []),
        "--submit", "--json", env=env)
    assert plan.returncode == 0, plan.stderr + slurm_cluster.logs()
    rec = json.loads((camp / "campaign.json").read_text())
    ids = {job: subs[0]["id"] for job, subs in rec["submitted"].items()}
    assert sorted(ids) == ["bench", "build-baseline", "build-patched", "merge", "prepare",
                           "verify"]
    assert rec["plan"]["python"] == sys.executable
    assert rec["plan"]["kit_root"] == env["PYTHONPATH"]
    # Slurm itself holds the chain: verify waits on both builds by their ids
    r = subprocess.run(["scontrol", "-o", "show", "job", ids["verify"]], env=env,
                       capture_output=True, text=True, check=False)
    assert f"afterok:{ids['build-baseline']}" in r.stdout or r.returncode != 0 or \
        "JobState=COMPLETED" in r.stdout, r.stdout

    # a net for a hang, not a speed check: run in parallel (scripts/test.sh), the campaign's two
    # builds share the cores with other workers' compiles; beside the kernels build, the overlay
    # build and three other testers on 2 cores its builds took 807 and 836 s and the 900 s
    # wait ran out before the merge
    rc, states = _status(camp, env, 1800)
    logs = "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace")
                                                   .splitlines()[-25:])
                     for p in sorted((camp / "logs").glob("*.out")))
    assert rc == 0, f"{states}\n{logs}\n{slurm_cluster.logs()}"
    assert {(s["job"], s["state"]) for s in states} == {
        ("prepare", "COMPLETED"), ("build-baseline", "COMPLETED"),
        ("build-patched", "COMPLETED"), ("verify", "COMPLETED"), ("bench", "COMPLETED"),
        ("merge", "COMPLETED")}
    assert sorted(s["id"] for s in states if s["job"] == "bench") == \
        [f"{ids['bench']}_0", f"{ids['bench']}_1"]
    assert not sourced.exists(), f"a job's bash read the submitting shell's BASH_ENV: {ids}"

    # the builds are real, built in their jobs' own scratch and published into the campaign:
    # one manifest per tree, its paths the published ones; the scratch folders are gone
    manifests = {json.loads(p.read_text())["tree"]: json.loads(p.read_text())
                 for p in (camp / "work").glob("build/*/*/manifest.json")}
    assert sorted(manifests) == ["baseline", "patched"]
    for tree, m in manifests.items():
        assert m["published"]["from"].startswith(f"{scratch}/kvprefetch-camp-build-{tree}-")
        assert m["so_path"].startswith(f"{camp}/work/envs/{tree}/")
        assert m["env"]["path"] == f"{camp}/work/envs/{tree}"
    assert list(scratch.iterdir()) == []
    assert not [p for p in (camp / "work").rglob(".*") if ".publish-" in p.name]
    assert not (camp / "work" / "trees").exists()  # the sources stayed in the scratch
    verify = json.loads((camp / "results" / "verify.json").read_text())
    assert verify["passed"] is True, verify
    # verify probed the moved environments: each interpreter inside its published env
    moved = ("interpreter inside its env", "loads its own library")
    assert {(c["tree"], c["name"], c["status"]) for c in verify["checks"]
            if c["name"] in moved} == {(t, n, "pass") for t in manifests for n in moved}
    merged = json.loads((camp / "report" / "merged.json").read_text())
    assert [s["file"] for s in merged["meta"]["merge"]["shards"]] == \
        [str(camp / "results" / f"bench-{i}.json") for i in (0, 1)]
    assert {v["name"]: v["so_sha256"] for v in merged["meta"]["variants"]} == \
        {t: m["so_sha256"] for t, m in manifests.items()}
    assert {r["batch"] for r in merged["results"]} == {1, 8}
    assert all(r["status"] == "skipped" for r in merged["results"])  # nothing was timed
    md = (camp / "report" / "merged.md").read_text()
    assert "merged from 2 shard(s)" in md and "CPU stand-in, nothing timed" in md
    assert "CPU stand-in shard: no GPU here, nothing was timed" in md

    # A task that fails: its library no longer matches the manifest (the stand-in re-hashes
    # it); status --wait says so and exits 10. Then, repaired, the task alone again.
    so = Path(manifests["patched"]["so_path"])
    original = so.read_bytes()
    so.write_bytes(original + b"\0")
    try:
        r1 = kvprefetch_cli_split("slurm", "resubmit", str(camp), "bench", "--task", "1",
                                  "--json", env=env)
        assert r1.returncode == 0, r1.stderr
        failed = json.loads(r1.stdout)
        rc, states = _status(camp, env, 120)
    finally:
        so.write_bytes(original)
    assert rc == 10, states
    assert {(s["id"], s["state"]) for s in states if s["job"] == "bench"} == \
        {(f"{failed['id']}_1", "FAILED"), (f"{ids['bench']}_0", "COMPLETED")}
    # each job writes its own log in logs/ (Slurm's own output is /dev/null: slurm/joblog.py)
    log = camp / "logs" / f"bench-{failed['id']}_1.out"
    assert "its manifest" in log.read_text()

    r2 = kvprefetch_cli_split("slurm", "resubmit", str(camp), "bench", "--task", "1", "--json",
                              env=env)
    assert r2.returncode == 0, r2.stderr
    again = json.loads(r2.stdout)
    assert not any(a.startswith("--dependency") for a in again["argv"])  # verify completed
    rc, states = _status(camp, env, 120)
    assert rc == 0, states
    bench = {(s["id"], s["state"]) for s in states if s["job"] == "bench"}
    assert bench == {(f"{again['id']}_1", "COMPLETED"), (f"{ids['bench']}_0", "COMPLETED")}
    print(f"campaign end to end in {time.monotonic() - t0:.0f} s")


def test_the_gpu_bench_script_parses_with_the_real_cli(tmp_path: Path) -> None:
    """The generated `bench kernel` line of a GPU campaign, run as Slurm would run array task 1
    (bash, SLURM_ARRAY_TASK_ID=1) on this GPU-less machine with no builds: it must get past
    option parsing and stop at bench's own refusal (exit 7), never a usage error (exit 2)."""
    import kvprefetch

    kit = str(Path(kvprefetch.__file__).resolve().parent.parent)
    c = make_campaign(tmp_path / "camp", python=sys.executable, kit_root=kit, kit_commit=None,
                      kit_version="0", path=os.environ.get("PATH", os.defpath), source="sdist",
                      trees=parse_trees("baseline,patched"), arch="9.0a", build_args=(),
                      no_gpu=False, bench=BenchSpec((1, 8), ("1k",), ("llama-3.1-8b",)),
                      slurm=SlurmOptions(gres="gpu:1"))
    write_campaign(c)
    script = Path(c.root) / c.job("bench").script
    r = subprocess.run(["bash", str(script)], env=dict(os.environ, SLURM_ARRAY_TASK_ID="1"),
                       capture_output=True, text=True, check=False, timeout=300)
    assert r.returncode == 7, r.stdout + r.stderr
    assert "no kernels-only builds under" in r.stderr
    assert "kvprefetch job bench on" in r.stderr  # its log, copied to stderr (joblog.py)


def test_each_job_records_how_it_ended_and_status_reads_it(tmp_path: Path) -> None:
    """Every script's EXIT trap writes logs/<job>-<id>.exit (Slurm's own %j / %A_%a id) last,
    after a build's scratch is gone. Run here by bash as Slurm runs them, with /bin/true or
    /bin/false as the interpreter; `status` then reads the records for jobs Slurm does not
    know (the fetch that stands for scontrol and sacct returns nothing, as both do then)."""
    import kvprefetch

    # the kit's own folder: each job enters it before it runs the kit (the 24th hostile pass)
    kit = str(Path(kvprefetch.__file__).resolve().parent.parent)

    def campaign(python: str) -> Campaign:
        return make_campaign(tmp_path / "camp", python=python, kit_root=kit, kit_commit=None,
                             kit_version="0", path=os.environ.get("PATH", os.defpath),
                             source="sdist", trees=parse_trees("baseline,patched"), arch="9.0a",
                             build_args=(), no_gpu=True, bench=BenchSpec((1, 8)),
                             slurm=SlurmOptions(), scratch=str(tmp_path / "scratch"))

    def run_job(c: Campaign, job: str, **env: str) -> int:
        r = subprocess.run(["bash", str(Path(c.root) / c.job(job).script)],
                           env=dict(os.environ, **env), capture_output=True, text=True,
                           check=False, timeout=60)
        return r.returncode

    ok, bad = campaign("/bin/true"), campaign("/bin/false")
    write_campaign(ok)
    assert run_job(ok, "prepare", SLURM_JOB_ID="11") == 0
    assert run_job(ok, "bench", SLURM_JOB_ID="14", SLURM_ARRAY_JOB_ID="13",
                   SLURM_ARRAY_TASK_ID="0") == 0
    write_campaign(bad)  # the same plan but the interpreter: the kit's scripts are replaced
    assert run_job(bad, "build-baseline", SLURM_JOB_ID="12") == 1
    assert run_job(bad, "bench", SLURM_JOB_ID="15", SLURM_ARRAY_JOB_ID="13",
                   SLURM_ARRAY_TASK_ID="1") == 1
    logs = Path(bad.root) / "logs"
    assert sorted(p.name for p in logs.glob("*.exit")) == [
        "bench-13_0.exit", "bench-13_1.exit", "build-baseline-12.exit", "prepare-11.exit"]
    assert (logs / "build-baseline-12.exit").read_text() == "1\n"
    assert not list((tmp_path / "scratch").iterdir())  # removed before the record

    rec = json.loads((Path(bad.root) / "campaign.json").read_text())
    rec["submitted"] = {"prepare": [{"id": "11"}], "build-baseline": [{"id": "12"}],
                        "build-patched": [{"id": "16"}], "bench": [{"id": "13"}]}
    (Path(bad.root) / "campaign.json").write_text(json.dumps(rec))
    got = {(s.job, s.id): (s.state, s.source) for s in status(Path(bad.root), lambda j, i: [])}
    assert got == {("prepare", "11"): ("COMPLETED", "exit record"),
                   ("build-baseline", "12"): ("FAILED", "exit record"),
                   ("build-patched", "16"): ("ENDED", "none"),  # no record: killed?
                   ("bench", "13_0"): ("COMPLETED", "exit record"),
                   ("bench", "13_1"): ("FAILED", "exit record")}


@pytest.mark.parametrize(("scratch", "keep"), [("node", False), ("/lscratch/$USER/kvp", False),
                                              ("/lscratch/$USER/kvp", True)])
def test_every_generated_script_is_valid_bash(tmp_path: Path, scratch: str, keep: bool) -> None:
    """`bash -n` over every script of a campaign with five trees, in each scratch mode."""
    c = make_campaign(tmp_path / "camp", python=sys.executable, kit_root="/k", kit_commit=None,
                      kit_version="0", path="/usr/bin:/bin", source="sdist",
                      trees=parse_trees("baseline,patched,launch,paper,control"), arch="9.0a",
                      build_args=("--head-sizes", "128"), no_gpu=True,
                      bench=BenchSpec((1, 8)), slurm=SlurmOptions(), scratch=scratch,
                      keep_scratch=keep)
    for path in write_campaign(c)[1:]:
        r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
        assert r.returncode == 0, (path.name, r.stderr)
