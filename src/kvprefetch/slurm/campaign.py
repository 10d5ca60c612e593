"""A Slurm campaign: the frozen plan (``Campaign``), the self-contained ``sbatch`` scripts it is
written as, and the order and ``afterok`` dependencies they are submitted with. Pure: nothing
here runs Slurm (``cluster.py`` does).

    <campaign>/
      campaign.json            the frozen plan, then the job ids of every submission
      scripts/NN-<job>.sbatch  one self-contained script per job
      logs/<job>-<jobid>.out   Slurm's output of each job (arrays: <job>-<array>_<task>.out)
      work/                    the kit's work directory: trees, builds, envs (shared by the jobs)
      results/                 verify.json, bench-<task>.json (one per array task)
      report/                  merged.json, merged.md

Jobs, each after the previous stage succeeded (``--dependency=afterok``):
``prepare`` (fetch + apply), ``build-<tree>`` (one per tree, kernels-only), ``verify``,
``bench`` (an array, one batch size per task), ``merge`` (``report --merge``).

Locks: the build jobs run at the same time on possibly different nodes, and each writes only its
own tree's paths (``build/<tree>``, ``envs/<tree>``, ``state/<tree>.json``, its tree lock). The
one file every build would otherwise touch, the work directory's ownership record, is written by
``prepare`` for every tree's build folder beforehand, so no lock has to hold across nodes.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..sources import upstream

SCHEMA = 1
CAMPAIGN_FILE = "campaign.json"


@dataclass(frozen=True)
class SlurmOptions:
    """Passed to ``sbatch`` only when given. ``gres`` goes to the jobs that use a GPU (bench,
    and verify unless ``--no-gpu``); ``cpus_per_build`` to the build jobs (and their --jobs)."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None
    gres: str | None = None
    cpus_per_build: int | None = None

    def directives(self, gpu: bool, cpus: int | None = None) -> list[str]:
        out = []
        for name in ("partition", "account", "time"):
            value = getattr(self, name)
            if value:
                out.append(f"--{name}={value}")
        if gpu and self.gres:
            out.append(f"--gres={self.gres}")
        if cpus:
            out.append(f"--cpus-per-task={cpus}")
        return out


@dataclass(frozen=True)
class Job:
    name: str                     # prepare, build-<tree>, verify, bench, merge
    script: str                   # relative to the campaign folder
    after: tuple[str, ...] = ()   # jobs that must have succeeded first (afterok)
    array: int | None = None      # number of array tasks (bench)


@dataclass(frozen=True)
class BenchSpec:
    """The benchmark matrix, sharded one batch size per array task."""

    batches: tuple[int, ...] = (1, 8, 32, 64, 128)
    contexts: tuple[str, ...] = ()
    presets: tuple[str, ...] = ()
    stand_in: bool = False        # CPU-only stand-in shards (no GPU timing): see standin.py


@dataclass(frozen=True)
class Campaign:
    root: str
    python: str                   # absolute path of the interpreter the jobs run
    kit_root: str                 # put on PYTHONPATH: the jobs run exactly this kit
    kit_commit: str | None
    kit_version: str
    path: str                     # PATH for the jobs (nvcc, git, cuobjdump are found on it)
    source: str                   # fetch --source
    trees: tuple[str, ...]
    arch: str
    build_args: tuple[str, ...]   # --head-sizes/--block-sizes/--kv-dtypes as given
    no_gpu: bool
    bench: BenchSpec
    slurm: SlurmOptions
    jobs: tuple[Job, ...] = field(default=())
    schema: int = SCHEMA

    # ------------------------------------------------------------------ paths
    @property
    def workdir(self) -> Path:
        return Path(self.root) / "work"

    @property
    def results(self) -> Path:
        return Path(self.root) / "results"

    @property
    def report_dir(self) -> Path:
        return Path(self.root) / "report"

    def shard(self, task: int) -> Path:
        return self.results / f"bench-{task}.json"

    def job(self, name: str) -> Job:
        for j in self.jobs:
            if j.name == name:
                return j
        raise ConfigError(f"the campaign {self.root} has no job {name!r} (its jobs: "
                          f"{', '.join(j.name for j in self.jobs)})", "pass one of those names")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_campaign(root: Path, *, python: str, kit_root: str, kit_commit: str | None,
                  kit_version: str, path: str, source: str, trees: Sequence[str], arch: str,
                  build_args: Sequence[str], no_gpu: bool, bench: BenchSpec,
                  slurm: SlurmOptions) -> Campaign:
    if tuple(trees) != upstream.TREE_NAMES:
        # prepare runs plain `fetch` + `apply`, which make exactly these two trees; other
        # variants' trees (--with-paper, --extra-tree) are not wired into campaigns yet
        raise ConfigError(f"a campaign builds the trees {', '.join(upstream.TREE_NAMES)}, "
                          f"not {', '.join(trees) or 'none'}",
                          "benchmark other variants with `kvprefetch bench kernel` on one "
                          "machine for now")
    if not bench.batches:
        raise ConfigError("no batch sizes to benchmark", "pass --batch 1,8 (one array task each)")
    jobs = [Job("prepare", "scripts/00-prepare.sbatch")]
    builds = tuple(f"build-{t}" for t in trees)
    jobs += [Job(b, f"scripts/10-{b}.sbatch", ("prepare",)) for b in builds]
    jobs.append(Job("verify", "scripts/20-verify.sbatch", builds))
    jobs.append(Job("bench", "scripts/30-bench.sbatch", ("verify",), len(bench.batches)))
    jobs.append(Job("merge", "scripts/40-merge.sbatch", ("bench",)))
    return Campaign(str(root.resolve()), python, kit_root, kit_commit, kit_version, path,
                    source, tuple(trees), arch, tuple(build_args), no_gpu, bench, slurm,
                    tuple(jobs))


def campaign_from_dict(d: dict[str, Any]) -> Campaign:
    if d.get("schema") != SCHEMA:
        raise ConfigError(f"campaign schema {d.get('schema')!r} is not {SCHEMA}",
                          "plan the campaign again with this kit (`kvprefetch slurm plan`)")
    return Campaign(
        d["root"], d["python"], d["kit_root"], d.get("kit_commit"), d["kit_version"], d["path"],
        d["source"], tuple(d["trees"]), d["arch"], tuple(d["build_args"]), d["no_gpu"],
        BenchSpec(tuple(d["bench"]["batches"]), tuple(d["bench"]["contexts"]),
                  tuple(d["bench"]["presets"]), d["bench"]["stand_in"]),
        SlurmOptions(**d["slurm"]),
        tuple(Job(j["name"], j["script"], tuple(j["after"]), j["array"]) for j in d["jobs"]))


def load_record(root: Path) -> dict[str, Any]:
    p = root / CAMPAIGN_FILE
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{root} is not a campaign (no {CAMPAIGN_FILE})",
                          "plan one with `kvprefetch slurm plan DIR`") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {p}: {exc}", "plan the campaign again") from None
    if not isinstance(data, dict) or not isinstance(data.get("plan"), dict):
        raise ConfigError(f"{p} is not a kvprefetch campaign", "plan the campaign again")
    data.setdefault("submitted", {})
    return data


# ---------------------------------------------------------------------------- scripts


def _q(argv: Sequence[str | Path]) -> str:
    return " ".join(shlex.quote(str(a)) for a in argv)


def kit_argv(c: Campaign, *args: str | Path) -> list[str]:
    return [c.python, "-m", "kvprefetch", *map(str, args)]


def job_commands(c: Campaign, job: Job) -> list[str]:
    """The body of a job's script, one shell line each (arguments quoted; the only shell
    features used are ``$SLURM_ARRAY_TASK_ID`` and an array of batch sizes)."""
    wd = str(c.workdir)
    if job.name == "prepare":
        return [_q(kit_argv(c, "fetch", "--workdir", wd, "--source", c.source)),
                _q(kit_argv(c, "apply", "--workdir", wd)),
                # the build folders' ownership, recorded here: see prepare.py
                _q([c.python, "-m", "kvprefetch.slurm.prepare", wd, *c.trees])]
    if job.name.startswith("build-"):
        tree = job.name[len("build-"):]
        jobs = ["--jobs", str(c.slurm.cpus_per_build)] if c.slurm.cpus_per_build else []
        return [_q(kit_argv(c, "build", "--workdir", wd, "--kernels-only", "--trees", tree,
                            "--arch", c.arch, *jobs, *c.build_args))]
    if job.name == "verify":
        argv = kit_argv(c, "verify-kernel", "--workdir", wd, "--trees", ",".join(c.trees),
                        "--json", *(["--no-gpu"] if c.no_gpu else []))
        return [_q(argv) + " > " + shlex.quote(str(c.results / "verify.json"))]
    if job.name == "bench":
        task = '"$SLURM_ARRAY_TASK_ID"'
        if c.bench.stand_in:
            return [_q(kit_argv(c, "slurm", "stand-in", c.root, "--task")) + " " + task]
        lines = ["BATCHES=(" + " ".join(str(b) for b in c.bench.batches) + ")"]
        extra: list[str] = []
        for ctx in c.bench.contexts:
            extra += ["--context", ctx]
        for p in c.bench.presets:
            extra += ["--preset", p]
        trees = [x for t in c.trees for x in ("--tree", t)]
        lines.append(_q(kit_argv(c, "bench", "kernel", "--workdir", wd, *trees, *extra,
                                 "--out", c.results, "--formats", "json"))
                     + ' --batch "${BATCHES[$SLURM_ARRAY_TASK_ID]}"'
                     + ' --name "bench-$SLURM_ARRAY_TASK_ID"')
        return lines
    if job.name == "merge":
        shards = [c.shard(i) for i in range(job.array or len(c.bench.batches))]
        return [_q(kit_argv(c, "report", "--merge", *shards, "--out", c.report_dir,
                            "--formats", "md"))]
    raise ConfigError(f"unknown job {job.name!r}", "plan the campaign again")


def render_script(c: Campaign, job: Job) -> str:
    log = Path(c.root) / "logs" / (f"{job.name}-%A_%a.out" if job.array else f"{job.name}-%j.out")
    gpu = job.name == "bench" and not c.bench.stand_in or job.name == "verify" and not c.no_gpu
    cpus = c.slurm.cpus_per_build if job.name.startswith("build-") else None
    directives = [f"--job-name=kvp-{Path(c.root).name}-{job.name}", f"--output={log}"]
    if job.array:
        directives.append(f"--array=0-{job.array - 1}")
    directives += c.slurm.directives(gpu, cpus)
    lines = ["#!/bin/bash"] + [f"#SBATCH {d}" for d in directives] + [
        (f"# kvprefetch campaign job {job.name!r}; written by `kvprefetch slurm plan` "
         f"(kit {c.kit_version} @ {c.kit_commit or 'no git commit'})."),
        "# Self-contained: the interpreter, the kit and PATH are pinned below.",
        "set -euo pipefail",
        f"export PYTHONPATH={shlex.quote(c.kit_root)}",
        f"export PATH={shlex.quote(c.path)}",
        "unset KVPREFETCH_WORKDIR VLLM_USE_PRECOMPILED VLLM_PRECOMPILED_WHEEL_LOCATION",
        f"cd {shlex.quote(c.root)}",
        'echo "kvprefetch job ' + job.name + ' on $(hostname) at $(date -u +%FT%TZ)"',
    ]
    return "\n".join(lines + job_commands(c, job)) + "\n"


def write_campaign(c: Campaign) -> list[Path]:
    """Write campaign.json (keeping the ids of earlier submissions when the plan is unchanged)
    and every job's script. Refuses to replace the plan of a campaign already submitted."""
    root = Path(c.root)
    record_path = root / CAMPAIGN_FILE
    submitted: dict[str, Any] = {}
    if record_path.exists():
        old = load_record(root)
        if old["submitted"] and old["plan"] != json.loads(json.dumps(c.to_dict())):
            raise ConfigError(f"{root} holds a campaign already submitted with another plan",
                              "plan into a new folder, or resubmit single jobs with "
                              "`kvprefetch slurm resubmit`")
        submitted = old["submitted"]
    for d in ("scripts", "logs", "results", "report"):
        (root / d).mkdir(parents=True, exist_ok=True)
    written = []
    for job in c.jobs:
        p = root / job.script
        p.write_text(render_script(c, job), encoding="utf-8")
        p.chmod(0o755)
        written.append(p)
    save_record(root, {"plan": c.to_dict(), "submitted": submitted})
    return [record_path, *written]


def save_record(root: Path, record: dict[str, Any]) -> None:
    from ..workspace.workdir import write_json_atomic

    write_json_atomic(root / CAMPAIGN_FILE, record)


def sbatch_argv(c: Campaign, job: Job, dependency_ids: Sequence[str],
                task: int | None = None) -> list[str]:
    """``sbatch --parsable [--dependency=afterok:ID:ID] [--array=TASK] SCRIPT``."""
    argv = ["sbatch", "--parsable"]
    if dependency_ids:
        argv.append("--dependency=afterok:" + ":".join(dependency_ids))
    if task is not None:
        argv.append(f"--array={task}")  # overrides the script's #SBATCH --array
    argv.append(str(Path(c.root) / job.script))
    return argv


def submission_order(c: Campaign) -> list[Job]:
    """Every job after the jobs it depends on (the plan is already in that order; checked)."""
    seen: set[str] = set()
    for j in c.jobs:
        missing = [a for a in j.after if a not in seen]
        if missing:
            raise ConfigError(f"job {j.name} depends on {', '.join(missing)}, planned after it",
                              "plan the campaign again")
        seen.add(j.name)
    return list(c.jobs)
