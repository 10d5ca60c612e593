"""A Slurm campaign: the frozen plan (``Campaign``), its options checked against what sbatch and
a shell accept, and its record (``campaign.json``: the plan, then the job ids of every
submission). The scripts it is written as, and the order they are submitted in, are
``scripts.py``'s. Pure: nothing here runs Slurm (``cluster.py`` does).

    <campaign>/
      campaign.json            the frozen plan, then the job ids of every submission
      scripts/NN-<job>.sbatch  one self-contained script per job
      logs/<job>-<jobid>.out   each job's output (arrays: <job>-<array>_<task>.out), written
                               by the job itself (joblog.py; Slurm's own is /dev/null);
                               a failed build's own logs in logs/build-<tree>-<jobid>/
      logs/<job>-<jobid>.exit  the job's exit status, written last by the script's EXIT trap
      cache/                   the read-only source cache: the hash-checked sdist (prepare)
      work/                    the published outputs only: build/<tree>/<key>/ (manifest.json,
                               the library) and envs/<tree>/, then verify/ (a kit work dir)
      results/                 verify.json, bench-<task>.json (one per array task)
      report/                  merged.json, merged.md
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import upstream
from ..errors import ConfigError
from .values import (
    MAX_CPUS_PER_BUILD,
    SCRATCH_NODE,
    check_arch,
    check_batches,
    check_campaign_path,
    check_contexts,
    check_presets,
    check_program_outside,
    check_scratch,
    check_slurm_value,
    check_source,
    check_task_shapes,
    check_utf8,
    check_words,
)

SCHEMA = 2
CAMPAIGN_FILE = "campaign.json"
EXIT_SUFFIX = ".exit"  # logs/<job>-<id>.exit: the job's exit status, written by its EXIT trap
# Exported by every job's script (the campaign's folder): the kit then follows no --workdir that
# is a link (cli.common._real_workdir). A job names only real folders, the campaign's work/ and
# its own resolved scratch; a link there was put by whoever writes the campaign, who can also
# move campaign.json away, so campaign.json beside it cannot be what tells a job's work/ apart.
JOB_ENV = "KVPREFETCH_CAMPAIGN"
# --scratch: where a build job makes its own work directory. ``node``: the node-local folder
# the cluster gives the job (``$SLURM_TMPDIR`` where the site sets it, as the Alliance's
# clusters do; else ``$TMPDIR``, which job_container/tmpfs sites make per job; else /tmp).
# ``campaign``: ``<campaign>/scratch``, for nodes without usable local disk.
NODE_SCRATCH_SH = "${SLURM_TMPDIR:-${TMPDIR:-/tmp}}"



@dataclass(frozen=True)
class SlurmOptions:
    """Passed to ``sbatch`` only when given. ``gres`` goes to the jobs that use a GPU (bench,
    and verify unless ``--no-gpu``); ``cpus_per_build`` to the build jobs (and their --jobs)."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None
    gres: str | None = None
    cpus_per_build: int | None = None

    def __post_init__(self) -> None:
        for name in ("partition", "account", "time", "gres"):
            check_slurm_value(name, getattr(self, name))
        if self.cpus_per_build is not None and (
                not isinstance(self.cpus_per_build, int) or isinstance(self.cpus_per_build, bool)
                or not 1 <= self.cpus_per_build <= MAX_CPUS_PER_BUILD):
            raise ConfigError(f"--cpus-per-build {self.cpus_per_build!r} is not a count from 1 "
                              f"to {MAX_CPUS_PER_BUILD}", "pass e.g. --cpus-per-build 16")

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
class TreeSpec:
    """One tree of the campaign and the variant ``apply`` gives it (None: stock, baseline)."""

    name: str
    variant: str | None


def parse_trees(text: str) -> tuple[TreeSpec, ...]:
    """``baseline,patched,launch,paper,control,mine=launch``: a variant's name stands for its
    usual tree (``patched`` or ``prefetch``: the prefetch variant); ``NAME=VARIANT`` names the
    tree. ``baseline`` (stock) is always built, first: verify and bench compare against it."""
    from ..workspace.workdir import check_tree_name

    by_tree = {t: v for v, t in upstream.DEFAULT_TREE_FOR_VARIANT.items()}
    out: dict[str, TreeSpec] = {"baseline": TreeSpec("baseline", None)}
    for item in (p.strip() for p in text.split(",")):
        if not item or item == "baseline":
            continue
        name, sep, variant = item.partition("=")
        if not sep:
            variant = by_tree.get(name, upstream.canonical_variant(name))
            name = upstream.DEFAULT_TREE_FOR_VARIANT.get(variant, name)
        variant = upstream.canonical_variant(variant)
        check_tree_name(name, "--trees")
        if variant not in upstream.VARIANTS:
            raise ConfigError(f"--trees {item}: {variant!r} is not a variant "
                              f"({', '.join(upstream.VARIANTS)})",
                              "name a variant, or a tree as NAME=VARIANT (e.g. mine=launch)")
        if name == "baseline" or name in out:
            raise ConfigError(f"--trees {item}: the tree {name} is named twice",
                              "give each tree its own name: NAME=VARIANT")
        out[name] = TreeSpec(name, variant)
    if len(out) < 2:
        raise ConfigError(f"--trees {text!r} names no tree to compare with baseline",
                          "pass e.g. --trees baseline,patched")
    return tuple(out.values())


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


def check_bench_spec(bench: BenchSpec) -> None:
    check_batches(bench.batches)
    check_contexts(bench.contexts)
    check_presets(bench.presets)
    check_task_shapes(bench.contexts, bench.presets)


@dataclass(frozen=True)
class Campaign:
    root: str
    python: str                   # absolute path of the interpreter the jobs run
    kit_root: str                 # put on PYTHONPATH: the jobs run exactly this kit
    kit_commit: str | None
    kit_version: str
    path: str                     # PATH for the jobs (nvcc, git, cuobjdump are found on it)
    source: str                   # fetch --source
    trees: tuple[TreeSpec, ...]
    arch: str
    build_args: tuple[str, ...]   # --head-sizes/--block-sizes/--kv-dtypes as given
    no_gpu: bool
    bench: BenchSpec
    slurm: SlurmOptions
    scratch: str = SCRATCH_NODE   # see check_scratch
    keep_scratch: bool = False
    jobs: tuple[Job, ...] = field(default=())
    schema: int = SCHEMA

    def __post_init__(self) -> None:
        """Every value that reaches a script is checked here, whether it came from the command
        line or from a campaign.json read back (which anyone may have edited)."""
        from ..workspace.confine import rel_problem
        from ..workspace.workdir import check_tree_name

        check_campaign_path(self.root)
        for what, value in (("--python", self.python), ("--source", self.source),
                            ("the kit's checkout", self.kit_root)):
            if isinstance(value, str):
                check_utf8(what, value)
        if isinstance(self.path, str):
            check_utf8("PATH", self.path, "take the folder whose name is not UTF-8 out of PATH "
                       "(or rename it), then plan again")
        check_words("a campaign value", [self.python, self.kit_root, self.path, self.source,
                                         self.arch, self.kit_version, self.kit_commit or "",
                                         *self.build_args,
                                         *self.bench.contexts, *self.bench.presets])
        if not isinstance(self.slurm, SlurmOptions):
            raise ConfigError("the campaign's slurm options are malformed",
                              "plan the campaign again")
        check_scratch(self.scratch, self.root)
        check_source(self.source, self.root)
        for what, prog in (("--python", self.python), ("the kit's checkout", self.kit_root)):
            if isinstance(prog, str) and prog.startswith("/"):
                check_program_outside(what, prog, self.root)
        for t in self.trees:
            check_tree_name(t.name, "--trees")
            if t.variant is not None and t.variant not in upstream.VARIANTS:
                raise ConfigError(f"the campaign's tree {t.name} has no known variant "
                                  f"({t.variant!r})", "plan the campaign again")
        check_bench_spec(self.bench)
        check_arch(self.arch)
        for j in self.jobs:
            if not re.fullmatch(r"(prepare|verify|bench|merge|build-[A-Za-z_][A-Za-z0-9_]*)",
                                str(j.name)) \
                    or rel_problem(j.script) is not None \
                    or not re.fullmatch(r"scripts/[0-9]{2}-[A-Za-z0-9_-]+\.sbatch", j.script) \
                    or (j.array is not None and (not isinstance(j.array, int)
                                                 or isinstance(j.array, bool) or j.array < 1)):
                raise ConfigError(f"the campaign's job {j.name!r} (script {j.script!r}) is "
                                  "not one kvprefetch plans", "plan the campaign again")
        # the jobs, their order, dependencies and arrays follow from the trees and batch sizes:
        # a hand-edited list was sent as it stood, an `after` of numbers or lists was a
        # TypeError traceback in submit, `array` 10**6 on the bench job had `status` list a
        # million tasks (a hang), and `array` on merge sent it as an array (issue 41, the
        # seventeenth hostile pass)
        if self.jobs != planned_jobs(self.trees, self.bench):
            raise ConfigError("the campaign's jobs (names, scripts, order, dependencies, array "
                              "sizes) are not the ones kvprefetch plans for its trees and batch "
                              "sizes: campaign.json was edited",
                              "restore campaign.json as `kvprefetch slurm plan` wrote it, or "
                              "plan the campaign again into a new folder")

    # ------------------------------------------------------------------ paths
    @property
    def workdir(self) -> Path:
        return Path(self.root) / "work"

    @property
    def tree_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.trees)

    def tree(self, name: str) -> TreeSpec:
        for t in self.trees:
            if t.name == name:
                return t
        raise ConfigError(f"the campaign {self.root} has no tree {name!r} (its trees: "
                          f"{', '.join(self.tree_names)})", "pass one of those names")

    @property
    def cache(self) -> Path:
        return Path(self.root) / "cache"

    @property
    def source_cache(self) -> str:
        """What the build jobs fetch from, read-only: the sdist the prepare job put into the
        cache (--source auto/sdist), or the --source path itself (an sdist or a clone)."""
        if self.source in ("auto", "sdist"):
            return str(self.cache / upstream.SDIST_NAME)
        return self.source

    @property
    def logs(self) -> Path:
        return Path(self.root) / "logs"

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
                  kit_version: str, path: str, source: str, trees: Sequence[TreeSpec],
                  arch: str, build_args: Sequence[str], no_gpu: bool, bench: BenchSpec,
                  slurm: SlurmOptions, scratch: str = SCRATCH_NODE,
                  keep_scratch: bool = False) -> Campaign:
    if not trees or trees[0] != TreeSpec("baseline", None) or len(trees) < 2 \
            or len({t.name for t in trees}) != len(trees):
        raise ConfigError("a campaign builds baseline (stock) first, then at least one other "
                          f"tree, each named once; not {', '.join(t.name for t in trees)}",
                          "pass --trees baseline,patched (or more: launch,paper,control,"
                          "NAME=VARIANT)")
    if source == "git":
        raise ConfigError("a campaign's build jobs fetch from a read-only cache, and "
                          "--source git has none",
                          "clone vLLM once onto a shared filesystem and pass --source PATH, or "
                          "use --source sdist (the hash-pinned sdist, downloaded once)")
    check_scratch(scratch, str(root.resolve()))
    if not bench.batches:
        raise ConfigError("no batch sizes to benchmark", "pass --batch 1,8 (one array task each)")
    return Campaign(str(root.resolve()), python, kit_root, kit_commit, kit_version, path,
                    source, tuple(trees), arch, tuple(build_args), no_gpu, bench, slurm,
                    scratch, keep_scratch, planned_jobs(trees, bench))


def planned_jobs(trees: Sequence[TreeSpec], bench: BenchSpec) -> tuple[Job, ...]:
    """The jobs a campaign of these trees and batch sizes runs, in submission order: they
    follow from the plan's other values, so a campaign.json read back must hold exactly these
    (Campaign.__post_init__)."""
    jobs = [Job("prepare", "scripts/00-prepare.sbatch")]
    builds = tuple(f"build-{t.name}" for t in trees)
    jobs += [Job(b, f"scripts/10-{b}.sbatch", ("prepare",)) for b in builds]
    jobs.append(Job("verify", "scripts/20-verify.sbatch", builds))
    jobs.append(Job("bench", "scripts/30-bench.sbatch", ("verify",), len(bench.batches)))
    jobs.append(Job("merge", "scripts/40-merge.sbatch", ("bench",)))
    return tuple(jobs)


def campaign_from_dict(d: dict[str, Any]) -> Campaign:
    """The campaign a campaign.json holds, every value checked (Campaign.__post_init__); a
    malformed record is a ConfigError, never a traceback."""
    if not isinstance(d, dict) or d.get("schema") != SCHEMA:
        got = d.get("schema") if isinstance(d, dict) else None
        raise ConfigError(f"campaign schema {got!r} is not {SCHEMA}",
                          "plan the campaign again with this kit (`kvprefetch slurm plan`)")
    try:
        return _campaign_from_dict(d)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ConfigError(f"the campaign record is malformed ({type(exc).__name__}: {exc})",
                          "plan the campaign again (`kvprefetch slurm plan`) into a new "
                          "folder") from None


def _campaign_from_dict(d: dict[str, Any]) -> Campaign:
    return Campaign(
        d["root"], d["python"], d["kit_root"], d.get("kit_commit"), d["kit_version"], d["path"],
        d["source"], tuple(TreeSpec(t["name"], t["variant"]) for t in d["trees"]), d["arch"],
        tuple(d["build_args"]), d["no_gpu"],
        BenchSpec(tuple(d["bench"]["batches"]), tuple(d["bench"]["contexts"]),
                  tuple(d["bench"]["presets"]), d["bench"]["stand_in"]),
        SlurmOptions(**d["slurm"]), d["scratch"], d["keep_scratch"],
        tuple(Job(j["name"], j["script"], tuple(j["after"]), j["array"]) for j in d["jobs"]))


JOB_ID = re.compile(r"[0-9]+")
FIX_SUBMITTED = ("restore campaign.json (each submission is {\"id\": \"<digits>\", \"task\": "
                 "null or a task number, ...}, as `kvprefetch slurm submit` wrote it), or plan "
                 "the campaign again into a new folder (`kvprefetch slurm plan`)")


# At most this many submissions in one campaign: `slurm status` asks Slurm (scontrol, then
# sacct) about each one, since a resubmitted job's afterok dependants still wait on the id of
# the submission it replaced; a campaign.json forged with 200,000 of them kept `status` running
# one scontrol after another for hours (issue 41, the twentieth hostile pass). A campaign of
# the most bench tasks (1000) with each task sent again alone once stays well below it.
MAX_SUBMISSIONS = 2500


def check_submitted(submitted: object, record: Path) -> None:
    """The ``submitted`` part of a campaign.json read back: per job name, a list of submissions
    whose ``id`` is a Slurm job id (a digit string, as ``sbatch --parsable`` printed it) and
    whose ``task`` is None or an array task number. The ids become ``--dependency=afterok:ID``
    and scontrol/sacct arguments, so anything else makes the record corrupt."""
    if not isinstance(submitted, dict):
        raise ConfigError(f"{record} is corrupt: 'submitted' is not a mapping", FIX_SUBMITTED)
    count = sum(len(subs) if isinstance(subs, list) else 1 for subs in submitted.values())
    if count > MAX_SUBMISSIONS:
        raise ConfigError(f"{record} is corrupt: it records {count} submissions, and "
                          f"kvprefetch sends at most {MAX_SUBMISSIONS} jobs in one campaign",
                          FIX_SUBMITTED)
    for job, subs in submitted.items():
        if not isinstance(subs, list):
            raise ConfigError(f"{record} is corrupt: the submissions of {job!r} are not a list "
                              f"({type(subs).__name__})", FIX_SUBMITTED)
        for i, sub in enumerate(subs):
            where = f"the submission {job!r}[{i}]"
            if not isinstance(sub, dict):
                raise ConfigError(f"{record} is corrupt: {where} is not a mapping",
                                  FIX_SUBMITTED)
            job_id, task = sub.get("id"), sub.get("task")
            if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
                raise ConfigError(f"{record} is corrupt: {where} has the id {job_id!r}, not a "
                                  "Slurm job id (a string of digits); kvprefetch passes no "
                                  "such id to Slurm", FIX_SUBMITTED)
            if task is not None and (not isinstance(task, int) or isinstance(task, bool)
                                     or task < 0):
                raise ConfigError(f"{record} is corrupt: {where} has the task {task!r}, not "
                                  "an array task number", FIX_SUBMITTED)


def check_sending(sending: object, record: Path) -> None:
    """The ``sending`` part of a campaign.json read back (absent, or the sbatch started and not
    yet answered: ``{"job": NAME, "task": null or a number, "at": TIME}``, written before the
    sbatch and removed once its id is recorded)."""
    if sending is None:
        return
    if not isinstance(sending, dict) or not isinstance(sending.get("job"), str) \
            or not re.fullmatch(r"[A-Za-z0-9_-]{1,100}", sending["job"]) \
            or not isinstance(sending.get("at", ""), str) \
            or not re.fullmatch(r"[0-9T:Z-]{0,40}", sending.get("at", "")):
        raise ConfigError(f"{record} is corrupt: 'sending' is not the record of an sbatch "
                          "(a job name and a time)", FIX_SUBMITTED)
    task = sending.get("task")
    if task is not None and (not isinstance(task, int) or isinstance(task, bool) or task < 0):
        raise ConfigError(f"{record} is corrupt: 'sending' has the task {task!r}, not an "
                          "array task number", FIX_SUBMITTED)


def check_sending_task(sending: dict[str, Any], jobs: object, record: Path) -> None:
    """A ``sending`` of an array task is of a task its job has (the plan's ``array``)."""
    array = next((j.get("array") for j in jobs if isinstance(j, dict)
                  and j.get("name") == sending["job"]), None) if isinstance(jobs, list) else None
    task = sending["task"]
    if isinstance(array, int) and not isinstance(array, bool) and task < array:
        return
    has = "is no array job" if array is None else f"has the array tasks 0..{array - 1}" \
        if isinstance(array, int) else "has no array size"
    name = f"kvp-{record.parent.resolve().name}-{sending['job']}"
    raise ConfigError(f"{record} is corrupt: 'sending' records an sbatch of {sending['job']} "
                      f"task {str(task)[:20]}, and {sending['job']} {has}",
                      f"check `squeue --me --name {name}` for such a job (scancel it), then "
                      "restore campaign.json as `kvprefetch slurm submit` wrote it (without "
                      "that 'sending' entry), or plan the campaign again into a new folder "
                      "(`kvprefetch slurm plan`)")


# "plan the campaign again" was the fix for a campaign.json that cannot be read, and `slurm plan`
# into that folder reads it first: the same error again, and without it the folder is "not
# empty" (issue 41, the twenty-fourth hostile pass)
FIX_UNREADABLE = ("restore {p} as `kvprefetch slurm plan` wrote it, or plan the campaign again "
                  "into a new folder (`kvprefetch slurm plan NEW_FOLDER ...`)")


def load_record(root: Path) -> dict[str, Any]:
    from ..reading import load_json

    p = root / CAMPAIGN_FILE
    try:
        data = load_json(p)
    except FileNotFoundError:
        raise ConfigError(f"{root} is not a campaign (no {CAMPAIGN_FILE})",
                          "plan one with `kvprefetch slurm plan DIR`") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {p}: {exc}", FIX_UNREADABLE.format(p=p)) from None
    if not isinstance(data, dict) or not isinstance(data.get("plan"), dict):
        raise ConfigError(f"{p} is not a kvprefetch campaign", FIX_UNREADABLE.format(p=p))
    data.setdefault("submitted", {})
    check_submitted(data["submitted"], p)
    check_sending(data.get("sending"), p)
    # every submission is of a job the plan holds: a job name of nobody's in `submitted` was
    # listed by `status` as sent, its id asked of Slurm (issue 41, the twenty-second pass left
    # it open); the plan's own jobs are checked where the plan is read (Campaign)
    jobs = data["plan"].get("jobs")
    planned = {j.get("name") for j in jobs if isinstance(j, dict)
               and isinstance(j.get("name"), str)} if isinstance(jobs, list) else set()
    sending = data.get("sending")
    unknown = [job for job in (*data["submitted"], *([sending["job"]] if sending else []))
               if job not in planned]
    if unknown:
        raise ConfigError(f"{p} is corrupt: it records a submission of {unknown[0]!r}, which is "
                          "no job of its plan", FIX_SUBMITTED)
    if sending and sending.get("task") is not None:
        # an unanswered sbatch of a task the job does not have: submit's way out was `resubmit
        # JOB --task N`, which refused that task and sent the user to `resubmit JOB`, which
        # sent them back (issue 41, the twenty-fourth hostile pass)
        check_sending_task(sending, jobs, p)
    plan_root = data["plan"].get("root")
    if plan_root != str(Path(root).resolve()):
        # "plan the campaign again in this folder" was refused by this very check (issue 41,
        # the eleventh hostile pass): the scripts, and any job sent, use the planned path
        raise ConfigError(f"{p} is corrupt or was moved: it plans the campaign {plan_root!r}, "
                          f"not {Path(root).resolve()}; kvprefetch acts on no path from it",
                          (f"move the folder back to {plan_root!r} if it was moved (its scripts "
                           "and any job already sent use that path), or plan a new campaign "
                           "into a new folder (`kvprefetch slurm plan NEW_FOLDER ...`)")
                          if isinstance(plan_root, str) else FIX_UNREADABLE.format(p=p))
    return data


def save_record(root: Path, record: dict[str, Any]) -> None:
    from ..workspace.workdir import write_json_atomic

    write_json_atomic(root / CAMPAIGN_FILE, record, root=root)


def shard_task(path: Path) -> tuple[Path, int] | None:
    """``(CAMPAIGN, N)`` when ``path`` is named as bench task N's result in a campaign folder
    (``CAMPAIGN/results/bench-N.json``, beside a ``campaign.json``), else None."""
    from os.path import isfile  # never raises: a path too long (or odd) is no campaign's
    m, p = re.fullmatch(r"bench-(0|[1-9][0-9]{0,5})\.json", path.name), path.absolute()
    if m is None or p.parent.name != "results" or not isfile(p.parent.parent / CAMPAIGN_FILE):
        return None
    return p.parent.parent, int(m[1])
