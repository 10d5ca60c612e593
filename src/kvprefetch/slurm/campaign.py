"""A Slurm campaign: the frozen plan (``Campaign``), its options checked against what sbatch and
a shell accept, and its record (``campaign.json``: the plan, then the job ids of every
submission). The scripts it is written as, and the order they are submitted in, are
``scripts.py``'s. Pure: nothing here runs Slurm (``cluster.py`` does).

    <campaign>/
      campaign.json            the frozen plan, then the job ids of every submission
      scripts/NN-<job>.sbatch  one self-contained script per job
      logs/<job>-<jobid>.out   Slurm's output of each job (arrays: <job>-<array>_<task>.out);
                               a failed build's own logs in logs/build-<tree>-<jobid>/
      logs/<job>-<jobid>.exit  the job's exit status, written last by the script's EXIT trap
      cache/                   the read-only source cache: the hash-checked sdist (prepare)
      work/                    the published outputs only: build/<tree>/<key>/ (manifest.json,
                               the library) and envs/<tree>/, then verify/ (a kit work dir)
      results/                 verify.json, bench-<task>.json (one per array task)
      report/                  merged.json, merged.md
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import upstream
from ..errors import ConfigError

SCHEMA = 2
CAMPAIGN_FILE = "campaign.json"
EXIT_SUFFIX = ".exit"  # logs/<job>-<id>.exit: the job's exit status, written by its EXIT trap
# --scratch: where a build job makes its own work directory. ``node``: the node-local folder
# the cluster gives the job (``$SLURM_TMPDIR`` where the site sets it, as the Alliance's
# clusters do; else ``$TMPDIR``, which job_container/tmpfs sites make per job; else /tmp).
# ``campaign``: ``<campaign>/scratch``, for nodes without usable local disk.
SCRATCH_NODE = "node"
SCRATCH_CAMPAIGN = "campaign"
NODE_SCRATCH_SH = "${SLURM_TMPDIR:-${TMPDIR:-/tmp}}"
_SCRATCH_FORBIDDEN = ('"', "`", "\\", "$(", "\n")


# What Slurm accepts for each value that reaches a script (and nothing a shell or sbatch's own
# #SBATCH parser would read as more than one word): names are [A-Za-z0-9_.-], --time is one of
# sbatch's formats, --gres a comma-separated list of name[:type][:count].
_WORD = r"[A-Za-z0-9_.-]+"
_SLURM_VALUES = {
    "partition": re.compile(rf"{_WORD}(,{_WORD})*"),
    "account": re.compile(_WORD),
    "time": re.compile(r"(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d{1,2}(:\d{1,2}){0,2}"
                       r"|UNLIMITED|INFINITE|unlimited|infinite)"),
    "gres": re.compile(rf"{_WORD}(:{_WORD}){{0,2}}(,{_WORD}(:{_WORD}){{0,2}})*"),
}
# The campaign folder appears in #SBATCH --output/--job-name and in shell words: no whitespace,
# quotes, $, `, \, % (a Slurm filename pattern) or control characters.
_CAMPAIGN_PATH = re.compile(r"/[A-Za-z0-9_./+,:@=-]*")


# sbatch --time's formats (sbatch(1)): minutes, minutes:seconds, hours:minutes:seconds,
# days-hours, days-hours:minutes, days-hours:minutes:seconds. A field after the leading one is
# a clock field: minutes and seconds below 60, hours below 24 (1-99:99:99 passed the regex
# and failed only at sbatch; issue 41, fourth pass). Slurm keeps a time limit as 32-bit
# minutes, 0xfffffffe and 0xffffffff being its NO_VAL and INFINITE: a longer limit is no limit
# it can hold (INFINITE/UNLIMITED says so).
_TIME_FIELDS = re.compile(r"(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
                          r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)", re.ASCII)
MAX_SLURM_MINUTES = 0xFFFFFFFE - 1


def slurm_time_minutes(value: str) -> int | None:
    """The minutes of an sbatch ``--time`` (rounded up; None for INFINITE/UNLIMITED), or a
    ConfigError naming ``--time`` for anything else."""
    if value.lower() in ("infinite", "unlimited"):
        return None
    m = _TIME_FIELDS.fullmatch(value)
    if m is not None:
        g = {k: int(v) for k, v in m.groupdict().items() if v is not None}
        if "days" in g:   # days-hours[:minutes[:seconds]]
            clock = [(g["dh"], 24), (g.get("dm", 0), 60), (g.get("ds", 0), 60)]
            seconds = ((g["days"] * 24 + g["dh"]) * 60 + g.get("dm", 0)) * 60 + g.get("ds", 0)
        elif "c" in g:    # hours:minutes:seconds
            clock = [(g["b"], 60), (g["c"], 60)]
            seconds = (g["a"] * 60 + g["b"]) * 60 + g["c"]
        else:             # minutes[:seconds]
            clock = [(g.get("b", 0), 60)]
            seconds = g["a"] * 60 + g.get("b", 0)
        minutes = -(-seconds // 60)
        if all(v < limit for v, limit in clock) and minutes <= MAX_SLURM_MINUTES:
            return minutes
    raise ConfigError(f"--time {value!r} is not a time sbatch accepts: minutes, minutes:seconds, "
                      "hours:minutes:seconds, days-hours, days-hours:minutes or "
                      "days-hours:minutes:seconds (minutes and seconds below 60 and hours below "
                      "24 after the first field, at most 2^32-3 minutes in all), or INFINITE",
                      "pass e.g. --time 2:00:00 or 1-12:00")


def check_slurm_value(name: str, value: str | None) -> str | None:
    """``value`` if Slurm accepts it for ``--name`` (and it holds nothing a shell would run)."""
    if value is None:
        return None
    if name == "time" and isinstance(value, str):
        slurm_time_minutes(value)
        return value
    if not isinstance(value, str) or not _SLURM_VALUES[name].fullmatch(value):
        raise ConfigError(f"--{name} {value!r} is not a value sbatch accepts for --{name} "
                          "(letters, digits, _ . - and the option's own separators only; no "
                          "spaces, quotes, $ or control characters)",
                          {"time": "pass e.g. --time 2:00:00 or 1-12:00",
                           "gres": "pass e.g. --gres gpu:1 or gpu:h100:2"}.get(
                              name, f"pass the {name} name as `sinfo`/`sacctmgr` shows it"))
    return value


def check_campaign_path(root: str) -> str:
    if not _CAMPAIGN_PATH.fullmatch(root) or "/../" in root + "/":
        raise ConfigError(f"the campaign folder {root!r} has characters that cannot go into an "
                          "sbatch script safely (spaces, quotes, $, `, \\, %, control "
                          "characters)",
                          "plan into a folder whose path uses only letters, digits and _ . - / "
                          "+ , : @ =")
    return root


def check_words(what: str, values: Sequence[str]) -> None:
    """No control character (a newline ends a shell line) in values that become shell words."""
    from ..workspace.confine import has_control

    for v in values:
        if not isinstance(v, str) or has_control(v):
            raise ConfigError(f"{what} {v!r} holds a control character (or is not text)",
                              f"pass {what} without newlines or other control characters")


# --cpus-per-build is sbatch's --cpus-per-task for a build job and its MAX_JOBS (parallel nvcc
# and compiler processes, each wanting 1-2 GiB): one job runs on one node, and no node Slurm
# schedules has more than 1024 CPUs (two 192-core, 2-way SMT sockets are 768); 10^23 was
# accepted and failed only at sbatch (issue 41, fourth pass).
MAX_CPUS_PER_BUILD = 1024


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


def check_scratch(scratch: str) -> str:
    """``node``, ``campaign``, or an absolute folder, which may name environment variables the
    job's shell expands (``/scratch/$USER``); nothing else a shell would run."""
    from ..workspace.confine import has_control

    if scratch in (SCRATCH_NODE, SCRATCH_CAMPAIGN):
        return scratch
    if not isinstance(scratch, str) or not scratch.startswith(("/", "$")) \
            or any(c in scratch for c in _SCRATCH_FORBIDDEN) or has_control(scratch):
        raise ConfigError(f"--scratch {scratch!r} is not node, campaign or an absolute folder",
                          "pass node (the job's $SLURM_TMPDIR/$TMPDIR), campaign, or a path "
                          "such as /scratch/$USER (no quotes, backslashes or $(...))")
    return scratch


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


def check_batches(batches: Sequence[object]) -> None:
    """Each bench task's batch size (the kernel's num_seqs): a whole number from 1 to the
    kernel's gridDim.y limit (bench/limits.py: vLLM launches one block row per sequence, so a
    larger batch is a launch that cannot be made; vLLM's largest CUDA-graph capture size, 8192,
    is below it). 10^23 was accepted and failed only in the job (issue 41, fourth pass)."""
    from ..bench.limits import MAX_GRID_YZ

    for b in batches:
        if not (isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= MAX_GRID_YZ):
            raise ConfigError(f"--batch {b!r} is not a batch size from 1 to {MAX_GRID_YZ} (the "
                              "kernel's gridDim.y limit: one block row per sequence)",
                              "pass e.g. --batch 1,8,32,64,128")


def check_contexts(contexts: Sequence[str]) -> None:
    """Each ``bench kernel --context`` of the tasks, as bench kernel parses it (512, 1k)."""
    from ..bench.matrix import parse_size

    check_words("--context", contexts)
    for c in contexts:
        if not isinstance(c, str):
            raise ConfigError(f"--context {c!r} is not text", "plan the campaign again")
        try:
            parse_size(c)
        except ConfigError as exc:
            raise ConfigError(f"--context {c!r} is not a context length: {exc.cause}",
                              "pass e.g. --context 512,1k,16k (k = 1024)") from None


def check_presets(presets: Sequence[str]) -> None:
    """Each ``bench kernel --preset`` of the tasks, one of the kit's model presets."""
    from ..bench.matrix import PRESETS

    check_words("--preset", presets)
    for p in presets:
        if p not in PRESETS:
            raise ConfigError(f"--preset {p!r} is not a model preset (known: "
                              f"{', '.join(PRESETS)})",
                              "pass known presets, comma-separated; "
                              "`kvprefetch bench kernel --list-presets` lists them")


def check_arch(arch: str) -> None:
    """``--arch`` as ``build --arch`` parses it (torch's TORCH_CUDA_ARCH_LIST)."""
    from ..machine.toolchain import parse_arch_list

    check_words("--arch", [arch])
    parse_arch_list(arch)


def check_bench_spec(bench: BenchSpec) -> None:
    check_batches(bench.batches)
    check_contexts(bench.contexts)
    check_presets(bench.presets)


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
        check_words("a campaign value", [self.python, self.kit_root, self.path, self.source,
                                         self.arch, self.kit_version, *self.build_args,
                                         *self.bench.contexts, *self.bench.presets])
        if not isinstance(self.slurm, SlurmOptions):
            raise ConfigError("the campaign's slurm options are malformed",
                              "plan the campaign again")
        check_scratch(self.scratch)
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
                    or (j.array is not None and (not isinstance(j.array, int) or j.array < 1)):
                raise ConfigError(f"the campaign's job {j.name!r} (script {j.script!r}) is "
                                  "not one kvprefetch plans", "plan the campaign again")

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
    check_scratch(scratch)
    if not bench.batches:
        raise ConfigError("no batch sizes to benchmark", "pass --batch 1,8 (one array task each)")
    jobs = [Job("prepare", "scripts/00-prepare.sbatch")]
    builds = tuple(f"build-{t.name}" for t in trees)
    jobs += [Job(b, f"scripts/10-{b}.sbatch", ("prepare",)) for b in builds]
    jobs.append(Job("verify", "scripts/20-verify.sbatch", builds))
    jobs.append(Job("bench", "scripts/30-bench.sbatch", ("verify",), len(bench.batches)))
    jobs.append(Job("merge", "scripts/40-merge.sbatch", ("bench",)))
    return Campaign(str(root.resolve()), python, kit_root, kit_commit, kit_version, path,
                    source, tuple(trees), arch, tuple(build_args), no_gpu, bench, slurm,
                    scratch, keep_scratch, tuple(jobs))


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


_JOB_ID = re.compile(r"[0-9]+")
FIX_SUBMITTED = ("restore campaign.json (each submission is {\"id\": \"<digits>\", \"task\": "
                 "null or a task number, ...}, as `kvprefetch slurm submit` wrote it), or plan "
                 "the campaign again into a new folder (`kvprefetch slurm plan`)")


def check_submitted(submitted: object, record: Path) -> None:
    """The ``submitted`` part of a campaign.json read back: per job name, a list of submissions
    whose ``id`` is a Slurm job id (a digit string, as ``sbatch --parsable`` printed it) and
    whose ``task`` is None or an array task number. The ids become ``--dependency=afterok:ID``
    and scontrol/sacct arguments, so anything else makes the record corrupt."""
    if not isinstance(submitted, dict):
        raise ConfigError(f"{record} is corrupt: 'submitted' is not a mapping", FIX_SUBMITTED)
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
            if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
                raise ConfigError(f"{record} is corrupt: {where} has the id {job_id!r}, not a "
                                  "Slurm job id (a string of digits); kvprefetch passes no "
                                  "such id to Slurm", FIX_SUBMITTED)
            if task is not None and (not isinstance(task, int) or isinstance(task, bool)
                                     or task < 0):
                raise ConfigError(f"{record} is corrupt: {where} has the task {task!r}, not "
                                  "an array task number", FIX_SUBMITTED)


def load_record(root: Path) -> dict[str, Any]:
    from ..reading import read_limited

    p = root / CAMPAIGN_FILE
    try:
        data = json.loads(read_limited(p).decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{root} is not a campaign (no {CAMPAIGN_FILE})",
                          "plan one with `kvprefetch slurm plan DIR`") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise ConfigError(f"cannot read {p}: {exc}", "plan the campaign again") from None
    if not isinstance(data, dict) or not isinstance(data.get("plan"), dict):
        raise ConfigError(f"{p} is not a kvprefetch campaign", "plan the campaign again")
    data.setdefault("submitted", {})
    check_submitted(data["submitted"], p)
    plan_root = data["plan"].get("root")
    if plan_root != str(Path(root).resolve()):
        raise ConfigError(f"{p} is corrupt or was moved: it plans the campaign {plan_root!r}, "
                          f"not {Path(root).resolve()}; kvprefetch acts on no path from it",
                          "plan the campaign again in this folder (`kvprefetch slurm plan`)")
    return data


def save_record(root: Path, record: dict[str, Any]) -> None:
    from ..workspace.workdir import write_json_atomic

    write_json_atomic(root / CAMPAIGN_FILE, record, root=root)
