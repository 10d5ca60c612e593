"""A campaign's self-contained ``sbatch`` scripts (one per job, written with campaign.json by
``folder.write_campaign``), the ``sbatch`` command line of each submission and the order and
``afterok`` dependencies they are submitted with. Pure: nothing here writes a file or runs
Slurm (``folder.py`` and ``cluster.py`` do).

Jobs, each after the previous stage succeeded (``--dependency=afterok``):
``prepare`` (the source cache), ``build-<tree>`` (one per tree: fetch, apply its variant,
kernels-only build, publish), ``verify``, ``bench`` (an array, one batch size per task),
``merge`` (``report --merge``).

Scratch and locks (publish.py): a build job never works in the campaign. It fetches from the
read-only cache into its own scratch work directory (node-local ``$SLURM_TMPDIR``/``$TMPDIR`` by
default), builds there with the kit's ordinary, node-local locks, and then publishes its
finished outputs into ``work/``: copied under a temporary name in the destination's own folder,
then renamed, which is atomic on one filesystem (NFS and Lustre included). Each tree publishes
to its own paths, and the one shared file, the ownership record of ``work/``, is written by
``prepare`` before any build starts. So no lock has to hold across nodes: flock over NFS does
not everywhere, and none is taken.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from ..errors import ConfigError
from .campaign import (
    EXIT_SUFFIX,
    JOB_ENV,
    NODE_SCRATCH_SH,
    Campaign,
    Job,
    TreeSpec,
)
from .job_env import SCRATCH_PREFIX, SHELLS_OWN, export_option, keep_only_sh, scratch_name
from .joblog import CLOSE_LOG_SH, ENDING_SIGNALS, SLURM_OUTPUT, TRAP_ENDING_SH, open_log_sh
from .shell import (
    CHECK_JOB_IDS_SH,
    KEEP_OUTSIDE_SH,
    PRIVATE_HOME_SH,
    SCRATCH_OUTSIDE_SH,
    TEMP_OUTSIDE_SH,
    WRITE_NEW_SH,
    leave_campaign_sh,
)
from .values import (
    SCRATCH_NODE,
    SCRATCH_VARIABLE,
    check_campaign_path,
    job_path,
    scratch_variables,
)


def _q(argv: Sequence[str | Path]) -> str:
    return " ".join(shlex.quote(str(a)) for a in argv)


def kit_argv(c: Campaign, *args: str | Path) -> list[str]:
    return [c.python, "-m", "kvprefetch", *map(str, args)]


def scratch_names(c: Campaign) -> list[str]:
    """The environment variables the campaign's ``--scratch`` names (none for ``node``)."""
    return scratch_variables(c.scratch) if c.scratch != SCRATCH_NODE else []


def scratch_base_sh(c: Campaign) -> str:
    """The shell word for the folder under which a build job makes its scratch directory: each
    variable it names read from where the job keeps it (job_env.scratch_name)."""
    if c.scratch == SCRATCH_NODE:
        return f'"{NODE_SCRATCH_SH}"'
    # check_scratch: only $NAME/${NAME} expansion can happen inside the quotes
    return '"' + SCRATCH_VARIABLE.sub(
        lambda m: "${" + scratch_name(m.group(0).strip("${}")) + "}", c.scratch) + '"'


def _build_commands(c: Campaign, tree: TreeSpec) -> list[str]:
    """fetch (from the read-only cache), apply, build in the job's own scratch work directory,
    then publish the outputs into the campaign; on failure, the build's logs are kept."""
    scratch = '"$SCRATCH"'
    publish = _q(kit_argv(c, "slurm", "publish", c.root, "--tree", tree.name, "--scratch")) \
        + " " + scratch
    name = f"kvprefetch-{Path(c.root).name}-build-{tree.name}"
    lines = [
        *_scratch_variables_sh(c, tree),
        f"SCRATCH_BASE={scratch_base_sh(c)}",
        *SCRATCH_OUTSIDE_SH,  # in the campaign folder: `$PWD`, `.` and relative paths are it
        leave_campaign_sh(c.kit_root),
        # name: the campaign folder's (check_campaign_path) and a tree's, nothing a shell expands
        f'SCRATCH="$SCRATCH_BASE/{name}-${{SLURM_JOB_ID:-$$}}"',
        # this job's own: a new job id is a new folder; anything already there (a link planted
        # at the next id's name) is named, not "mkdir: File exists" alone (issue 41, the
        # eleventh pass left it open)
        # (a folder it cannot make in is named as that: on a scratch folder not writable, read
        # only or full, "something is already there / move it away" sent the user to move
        # nothing; issue 41, the twenty-fifth hostile pass)
        ('mkdir -- "$SCRATCH" || { if [ -e "$SCRATCH" ] || [ -L "$SCRATCH" ]; then'
         ' echo "refusing to build in $SCRATCH: something is already'
         ' there, and each build job makes its own new folder. To fix: move $SCRATCH away'
         ' (kvprefetch leaves what it did not make), then run'
         f' kvprefetch slurm resubmit {c.root} build-{tree.name}" >&2; else'
         ' echo "refusing to build in $SCRATCH: it cannot be made in $SCRATCH_BASE (mkdir said'
         ' why above: not writable, a read-only file system, or full). To fix: free or make'
         ' writable $SCRATCH_BASE, or plan the campaign again with --scratch naming a writable'
         ' folder of yours (for node: submit with TMPDIR or SLURM_TMPDIR set to one), then run'
         f' kvprefetch slurm resubmit {c.root} build-{tree.name}" >&2; fi; exit 1; }}'),
        "at_exit() {",
        "  local rc=$1",
        f'  if [ "$rc" -ne 0 ]; then {publish} --logs-only || true; fi',
        ('  echo "scratch kept: $SCRATCH"' if c.keep_scratch else '  rm -rf -- "$SCRATCH"'),
        '  record_exit "$rc"  # last: the record means the job is over, scratch included',
        "}",
        'echo "scratch: $SCRATCH"',
    ]
    # only the job's own tree: the scratch work directory builds nothing else
    lines.append(_q(kit_argv(c, "fetch", "--workdir")) + f" {scratch} "
                 + _q(["--source", c.source_cache, "--only", tree.name]))
    if tree.variant is not None:
        lines.append(_q(kit_argv(c, "apply", "--workdir")) + f" {scratch} "
                     + _q(["--variant", tree.variant, "--tree", tree.name]))
    jobs = ["--jobs", str(c.slurm.cpus_per_build)] if c.slurm.cpus_per_build else []
    lines.append(_q(kit_argv(c, "build", "--workdir")) + f" {scratch} "
                 + _q(["--kernels-only", "--trees", tree.name, "--arch", c.arch, *jobs,
                       *c.build_args]))
    lines.append(publish)
    return lines


def _scratch_variables_sh(c: Campaign, tree: TreeSpec) -> list[str]:
    """Refuse, with a fix, a ``--scratch`` naming a variable the job's environment leaves unset
    or empty: under ``set -u`` the build job ended with bash's "SLURM_TMPDIR: unbound
    variable" alone (a ``--scratch '$SLURM_TMPDIR/k'`` on a cluster without it), and an empty
    one would build in the folder above (issue 41, the twentieth hostile pass). The names are
    identifiers (check_scratch), safe as shell words."""
    names = scratch_names(c)
    if not names:
        return []
    return [
        f"for v in {' '.join(names)}; do",
        f"  case $v in {'|'.join(SHELLS_OWN)}) k=$v;; *) k={SCRATCH_PREFIX}$v;; esac",
        '  if [ -z "${!k:-}" ]; then',
        ('    echo "refusing to build: the campaign\'s --scratch names \\$$v, which is not set'
         ' (or is empty) in this job\'s environment. To fix: set $v when you submit (sbatch'
         ' passes it on), or plan the campaign again with --scratch node or a'
         f' folder that names no such variable; then kvprefetch slurm resubmit {c.root}'
         f' build-{tree.name}" >&2; exit 2'),
        "  fi",
        "done",
    ]


def job_commands(c: Campaign, job: Job) -> list[str]:
    """The body of a job's script, one shell line each (arguments quoted; the only shell
    features used are ``$SLURM_ARRAY_TASK_ID``, an array of batch sizes, and in the build jobs
    the scratch folder and its exit trap)."""
    wd = str(c.workdir)
    if job.name == "prepare":
        return [leave_campaign_sh(c.kit_root), _q(kit_argv(c, "slurm", "prepare", c.root))]
    if job.name.startswith("build-"):
        return _build_commands(c, c.tree(job.name[len("build-"):]))
    if job.name == "verify":
        argv = kit_argv(c, "verify-kernel", "--workdir", wd, "--trees", ",".join(c.tree_names),
                        "--json", *(["--no-gpu"] if c.no_gpu else []))
        # never `>`: a link planted at results/verify.json would be written through
        # write_new runs it: a command killed while it printed leaves the earlier report
        return [leave_campaign_sh(c.kit_root),
                "write_new " + shlex.quote(str(c.results / "verify.json")) + " " + _q(argv)]
    if job.name == "bench":
        task = '"$SLURM_ARRAY_TASK_ID"'
        lines = [leave_campaign_sh(c.kit_root),
                 "BATCHES=(" + " ".join(str(b) for b in c.bench.batches) + ")",
                 *_bench_task_sh(c)]
        if c.bench.stand_in:  # the task checked as bench's: not click's "correct the command"
            return [*lines, _q(kit_argv(c, "slurm", "stand-in", c.root, "--task")) + " " + task]
        extra: list[str] = []
        for ctx in c.bench.contexts:
            extra += ["--context", ctx]
        for p in c.bench.presets:
            extra += ["--preset", p]
        trees = [x for t in c.tree_names for x in ("--tree", t)]
        lines.append(_q(kit_argv(c, "bench", "kernel", "--workdir", wd, *trees, *extra,
                                 "--out", c.results, "--formats", "json"))
                     + ' --batch "${BATCHES[$SLURM_ARRAY_TASK_ID]}"'
                     + ' --name "bench-$SLURM_ARRAY_TASK_ID"')
        return lines
    if job.name == "merge":
        shards = [c.shard(i) for i in range(job.array or len(c.bench.batches))]
        return [leave_campaign_sh(c.kit_root), _q(kit_argv(c, "report", "--merge", *shards, "--out",
                                               c.report_dir, "--formats", "md"))]
    raise ConfigError(f"unknown job {job.name!r}", "plan the campaign again")


def _bench_task_sh(c: Campaign) -> list[str]:
    """The bench task's index into ``BATCHES``, checked: a task id past the array's end (the
    script sent by hand with another ``--array``) failed in bash with "BATCHES[...]: unbound
    variable", and one with a leading zero (``08``, read as octal) with "value too great for
    base", neither saying what to do (issue 41, the fifteenth hostile pass)."""
    return [
        ('if [[ ! "${SLURM_ARRAY_TASK_ID:-}" =~ ^(0|[1-9][0-9]{0,5})$ ]]'
         ' || [ "$SLURM_ARRAY_TASK_ID" -ge "${#BATCHES[@]}" ]; then'),
        ('  echo "refusing to run: the array task id \'${SLURM_ARRAY_TASK_ID:-}\' is not one of'
         ' this campaign\'s bench tasks, 0 to $((${#BATCHES[@]} - 1)) (one per batch size). To'
         ' fix: send the bench job with kvprefetch slurm submit, or one task with kvprefetch'
         f' slurm resubmit {c.root} bench --task N" >&2; exit 2'),
        "fi",
    ]


def render_script(c: Campaign, job: Job) -> str:
    gpu = (job.name == "bench" and not c.bench.stand_in) or (job.name == "verify" and not c.no_gpu)
    cpus = c.slurm.cpus_per_build if job.name.startswith("build-") else None
    check_campaign_path(c.root)  # the folder goes into #SBATCH lines, unquoted
    # --chdir=/ and --export as submit passes them, for an sbatch by hand too: run from the
    # campaign folder (`sbatch scripts/00-prepare.sbatch`), Slurm started the job there, and
    # with a careless LD_LIBRARY_PATH=:/usr/local/cuda/lib64 (an empty entry: the folder it
    # runs in, passed by the directive's list) its bash loaded a libtinfo.so.6 planted in the
    # campaign before the first line (issue 41, the twenty-second hostile pass; the
    # eighteenth's attack on submit, by hand)
    # --output: the job writes its own log (joblog.py), never Slurm, which follows links
    directives = [f"--job-name=kvp-{Path(c.root).name}-{job.name}", f"--output={SLURM_OUTPUT}",
                  "--chdir=/", export_option(scratch_names(c))]
    if job.array:
        directives.append(f"--array=0-{job.array - 1}")
    directives += c.slurm.directives(gpu, cpus)
    lines = ["#!/bin/bash"] + [f"#SBATCH {d}" for d in directives] + [
        (f"# kvprefetch campaign job {job.name!r}; {_SCRIPT_MARK} "
         f"(kit {c.kit_version} @ {c.kit_commit or 'no git commit'})."),
        "# Self-contained: the interpreter, the kit and PATH are pinned below, and the job",
        "# keeps only the environment kvprefetch passes (kvprefetch.slurm.job_env).",
        *keep_only_sh(scratch_names(c) if job.name.startswith("build-") else []),
        "set -euo pipefail",
        # The kit's rule for its umask (cli.no_world_writable), for the job's own bash too:
        # Slurm gives a job the umask sbatch read, or SLURM_UMASK as the submitting shell set
        # it (sbatch keeps one already set), and under 0000 the build job's bash made its
        # scratch, work directory included, 0777 outside the campaign, and every exit record
        # 0666 (issue 41, the twenty-fifth hostile pass)
        'umask "$(printf %04o $(( (8#$(umask) & ~8#700) | 8#002 )))"',
        f"export PYTHONPATH={shlex.quote(c.kit_root)}",
        f"export PATH={shlex.quote(job_path(c.path, c.root))}",
        *KEEP_OUTSIDE_SH,
        # a campaign moved or renamed since the plan: bash's own "cd: No such file or
        # directory" alone said nothing of what to do (issue 41, the twentieth hostile pass)
        (f"CAMPAIGN_AT=$(cd -P -- {shlex.quote(c.root)} 2>/dev/null && pwd -P)"
         " || { echo \"refusing to"
         f" run: the campaign folder {c.root} this script was planned for is not there"
         " (moved or renamed since kvprefetch slurm plan wrote it?). To fix: move it back, or"
         " plan the campaign again where it is now with kvprefetch slurm plan\" >&2; exit 2; }"),
        'while [ "${CAMPAIGN_AT#//}" != "$CAMPAIGN_AT" ]; do CAMPAIGN_AT=${CAMPAIGN_AT#/}; done',
        'keep_outside PATH; PATH=${PATH:-/usr/bin:/bin}',
        'if [ -n "${LD_LIBRARY_PATH+x}" ]; then keep_outside LD_LIBRARY_PATH; fi',
        f"export {JOB_ENV}={shlex.quote(c.root)}",  # its --workdir links are refused
        f"cd {shlex.quote(c.root)}",
        # the job's own record of how it ended, beside its log (same id): `slurm status`
        # reads it for a job the controller has forgotten (MinJobAge) where accounting is off
        # (a task id missing beside the array's: `5_`, refused below, not bash's "unbound")
        "JOB_ID=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID:-}}",
        "JOB_ID=${JOB_ID:-${SLURM_JOB_ID:-$$}}",
        *CHECK_JOB_IDS_SH,
        f'EXIT_RECORD={shlex.quote(str(c.logs))}/{job.name}-"$JOB_ID"{EXIT_SUFFIX}',
        *WRITE_NEW_SH,
        *CLOSE_LOG_SH,
        # the job's end is recorded whatever signal comes now: a TERM of the job's group during
        # this trap killed its write_new, and a job whose work had completed left no exit record
        # (issue 41, the thirty-second hostile pass); NO_STOP: write_new's own stop trap too
        "record_exit() {",
        f"  trap '' {ENDING_SIGNALS} QUIT; local NO_STOP=",
        '  if [ -n "${PRIVATE_HOME:-}" ]; then rm -rf -- "$PRIVATE_HOME" || true; fi',
        '  printf \'%s\\n\' "$1" | write_new "$EXIT_RECORD" || true',
        "  close_log",
        "}",
        # scancel and a time limit send SIGTERM to every process of the job: the EXIT trap
        # recorded the status of the command that was running, "0" from one that exits 0 on
        # SIGTERM, and the cancelled job read back as COMPLETED (issue 41, the eleventh pass)
        TRAP_ENDING_SH,  # and the other ending signals (joblog.ENDING_SIGNALS)
        # what the job does as it ends (a build job adds its scratch's removal): from the EXIT
        # trap, or from the first ending signal's trap, which leaves no EXIT trap (joblog)
        'at_exit() { record_exit "$1"; }',
        "trap 'EXITING=$?; at_exit $EXITING' EXIT",  # EXITING: TRAP_ENDING_SH
        *open_log_sh(job.name),  # after the trap: a refused job records its end
        *TEMP_OUTSIDE_SH,  # after the trap: a refused job records its end
        *PRIVATE_HOME_SH,  # in the TMPDIR just checked
        'echo "kvprefetch job ' + job.name + ' on $(hostname) at $(date -u +%FT%TZ)"',
    ]
    return "\n".join(lines + job_commands(c, job)) + "\n"


_SCRIPT_MARK = "written by `kvprefetch slurm plan`"


def sbatch_argv(c: Campaign, job: Job, dependency_ids: Sequence[str],
                task: int | None = None) -> list[str]:
    """``sbatch --parsable --chdir=/ --export=... --output=/dev/null [--dependency=afterok:ID:ID]
    [--array=TASK] SCRIPT``: the job writes its own log (``joblog.py``); the option overrides a
    submitting shell's ``SBATCH_OUTPUT``."""
    # --chdir=/: Slurm starts a job in the folder sbatch ran in, the campaign for a user who
    # submits from it, and bash (the job's shell) loads its libraries before the script's
    # first line: an inherited LD_LIBRARY_PATH with an empty entry (`:/cuda/lib64`) had it
    # load a libtinfo.so.6 planted in the campaign, run as the user (issue 41, the
    # eighteenth hostile pass). Every path the script and this command name is absolute.
    # --export: what the job gets of this shell's environment (job_env.PASSED, checked by
    # submit), not all of it (sbatch's default); it overrides SBATCH_EXPORT and the script's own
    argv = ["sbatch", "--parsable", "--chdir=/", export_option(scratch_names(c)),
            f"--output={SLURM_OUTPUT}"]
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
