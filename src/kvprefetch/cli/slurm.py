"""CLI: ``kvprefetch slurm plan|submit|status|resubmit`` for people, and ``prepare``, ``publish``
and ``stand-in`` for the campaign's jobs (thin over kvprefetch.slurm)."""

from __future__ import annotations

import errno
import os
import re
import sys
from pathlib import Path
from typing import Any

import click

from ..console import emit_json, info, say, table
from ..runner import CALLER_PATH
from ..slurm.values import MAX_BATCHES, MAX_CPUS_PER_BUILD, WAIT_TIMEOUT, check_python
from .common import ARCH_TYPE, BoundedNumber, LibraryChecked, dry_run_option, json_option


def _campaign_folder(ctx: click.Context, param: click.Parameter, value: Path) -> Path:
    """A campaign is a folder, or a path where one will be made: click's ``file_okay=False``
    refuses a regular file only, and a device or FIFO there was "slurm failed: /dev/zero/scripts:
    Not a directory / To fix: check the path and its file system" (plan) or "cannot read
    /dev/zero/campaign.json ... plan the campaign again" (issue 41, ninth hostile pass)."""
    try:
        os.stat(value)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # pathlib's resolve() raised RuntimeError: a traceback
            # in plan (issue 41, the twentieth hostile pass)
            raise click.BadParameter(f"{str(value)!r} is a loop of symlinks, no folder; name "
                                     "the campaign's folder, or a new path for one",
                                     ctx=ctx, param=param) from None
    from ..errors import ConfigError
    from ..workspace.confine import kernel_path

    try:  # a link to nothing on the way: its target's folders were made (the 35th pass)
        kernel_path(value)
    except ConfigError as exc:
        raise click.BadParameter(f"{exc.cause}; name the campaign's folder, or a new path "
                                 "for one", ctx=ctx, param=param) from None
    if value.exists() and not value.is_dir():
        raise click.BadParameter(f"{str(value)!r} is not a folder (a device, FIFO or socket); "
                                 "name the campaign's folder, or a new path for one",
                                 ctx=ctx, param=param)
    from ..workspace.foreign import refuse_foreign_link
    from .common import refuse_a_path_through_a_file

    refuse_a_path_through_a_file(ctx, param, value, "campaign")
    refuse_foreign_link(value, f"the campaign folder {value}")  # any link on the way
    if value.is_symlink() and value.is_dir():
        # followed once, here, as a --workdir is (cli.common._real_workdir): a location the user
        # names is trusted, and every command then acts in the real folder. Unresolved, the
        # campaign's own writes (confine, which opens a root's last part O_NOFOLLOW since the
        # nineteenth pass) refused it: `slurm submit LINK` said a folder "became a symlink ...
        # another process is changing the work directory", a race nobody ran, and sent nothing
        # (issue 41, the twentieth hostile pass)
        return value.resolve()
    return value


campaign_arg = click.argument("campaign", type=click.Path(file_okay=False, path_type=Path),
                              callback=_campaign_folder)


class TaskId(click.ParamType):
    """An array task id as Slurm writes one: ASCII digits, no sign, space, ``_`` or leading
    zero. click's int took Python's spellings, so ``--task 0_1`` (Slurm's JOB_TASK form, task
    1 of job 0) or `` 1``, ``+1``, ``01`` read as task 1: ``stand-in`` wrote task 1's shard and
    ``resubmit`` sent task 1 (issue 41, the twentieth hostile pass)."""

    name = "task"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        text = str(value)
        if re.fullmatch(r"[1-9][0-9]{6,}", text):
            # plain digits, only too many of them: "digits only, no sign, space, _ or leading
            # zero" described what was typed (issue 41, the twenty-second hostile pass)
            self.fail(f"{text!r} is past the last array task any campaign has (a campaign "
                      f"benchmarks at most {MAX_BATCHES} batch sizes, tasks 0 to "
                      f"{MAX_BATCHES - 1})", param, ctx)
        if not re.fullmatch(r"0|[1-9][0-9]{0,5}", text):
            self.fail(f"{text!r} is not an array task id (0, 1, 2, ...: digits only, no sign, "
                      "space, _ or leading zero)", param, ctx)
        return int(text)


@click.group()
def slurm() -> None:
    """Run build, verify and bench as a Slurm campaign: sbatch scripts with afterok
    dependencies under one campaign folder, then submit, watch, resubmit, merge."""


def _split(text: str | None) -> tuple[str, ...]:
    return tuple(p.strip() for p in (text or "").split(",") if p.strip())


def _check_batches(text: str) -> None:
    from ..bench.matrix import parse_sizes
    from ..slurm.values import check_batches

    check_batches(parse_sizes(text, bounded=False))  # its bound, 65535, is check_batches' own


def _check_contexts(text: str) -> None:
    from ..slurm.values import check_contexts

    check_contexts(_split(text))


def _check_presets(text: str) -> None:
    from ..slurm.values import check_presets

    check_presets(_split(text))


def _check_time(text: str) -> None:
    from ..slurm.values import check_slurm_value

    check_slurm_value("time", text)


# the campaign's own checks (slurm/campaign.py), which a campaign.json read back passes too
BATCHES_TYPE = LibraryChecked("sizes", _check_batches)
CONTEXTS_TYPE = LibraryChecked("sizes", _check_contexts)
PRESETS_TYPE = LibraryChecked("presets", _check_presets)
TIME_TYPE = LibraryChecked("time", _check_time)


@slurm.command()
@campaign_arg
@click.option("--source", default="auto", show_default=True,
              help="Where the build jobs fetch from, read-only: auto or sdist (the hash-pinned "
                   "sdist, downloaded once by the prepare job into CAMPAIGN/cache), or the PATH "
                   "of a vllm-0.10.2.tar.gz or clone on a filesystem every node mounts.")
@click.option("--trees", "trees_text", default="baseline,patched", show_default=True,
              help="The trees, one build job each: baseline (stock, always built), and "
                   "variants by name (patched = prefetch, launch, paper, control) or as "
                   "NAME=VARIANT.")
@click.option("--scratch", default="node", show_default=True,
              help="Where each build job works: node (the job's $SLURM_TMPDIR, else $TMPDIR, "
                   "else /tmp), or an absolute folder of yours outside the campaign ($VARs are "
                   "expanded by the job). Only finished outputs are published into CAMPAIGN/work.")
@click.option("--keep-scratch", is_flag=True,
              help="Leave each build job's scratch folder in place (default: removed at exit; "
                   "a failed build's logs are copied to CAMPAIGN/logs first).")
@click.option("--arch", type=ARCH_TYPE, default="9.0a", show_default=True,
              help="build --arch (TORCH_CUDA_ARCH_LIST syntax, e.g. 9.0a or '8.0;9.0a').")
@click.option("--head-sizes", default=None, help="build --head-sizes (default: all).")
@click.option("--block-sizes", default=None, help="build --block-sizes (default: all).")
@click.option("--kv-dtypes", default=None, help="build --kv-dtypes (default: all).")
@click.option("--no-gpu", is_flag=True, help="verify-kernel --no-gpu (and no --gres for it).")
@click.option("--batch", "batches", type=BATCHES_TYPE, default="1,8,32,64,128",
              show_default=True,
              help="Batch sizes (1 to 65535, the kernel's grid limit); the bench job is an "
                   "array with one task per batch size.")
@click.option("--context", "contexts", type=CONTEXTS_TYPE, default=None,
              help="bench kernel --context for every task, e.g. 512,1k,16k (default: its "
                   "matrix's).")
@click.option("--preset", "presets", type=PRESETS_TYPE, default=None,
              help="bench kernel --preset (comma-separated, of bench kernel --list-presets).")
@click.option("--stand-in", is_flag=True,
              help="Bench tasks run `kvprefetch slurm stand-in` (CPU only, nothing timed) "
                   "instead of `bench kernel`: for clusters and CI without GPUs.")
@click.option("--partition", default=None, help="sbatch --partition for every job.")
@click.option("--account", default=None, help="sbatch --account for every job.")
@click.option("--time", "time_limit", type=TIME_TYPE, default=None,
              help="sbatch --time for every job: minutes, minutes:seconds, "
                   "hours:minutes:seconds, days-hours, days-hours:minutes, "
                   "days-hours:minutes:seconds or INFINITE.")
@click.option("--gres", default=None, help="sbatch --gres for the GPU jobs, e.g. gpu:1.")
@click.option("--cpus-per-build", type=click.IntRange(min=1, max=MAX_CPUS_PER_BUILD),
              default=None,
              help="sbatch --cpus-per-task and build --jobs for each build job (at most "
                   f"{MAX_CPUS_PER_BUILD}, more than any node has).")
@click.option("--python", "python", default=None, metavar="PYTHON",
              help="Interpreter the jobs run (default: this one, by absolute path).")
@click.option("--submit", "do_submit", is_flag=True, help="Submit the campaign right away.")
@dry_run_option
@json_option
def plan(campaign: Path, source: str, trees_text: str, scratch: str, keep_scratch: bool,
         arch: str, head_sizes: str | None,
         block_sizes: str | None, kv_dtypes: str | None, no_gpu: bool, batches: str,
         contexts: str | None, presets: str | None, stand_in: bool, partition: str | None,
         account: str | None, time_limit: str | None, gres: str | None,
         cpus_per_build: int | None, python: str | None, do_submit: bool, dry_run: bool,
         as_json: bool) -> None:
    """Write CAMPAIGN/campaign.json (the frozen plan) and one sbatch script per job: prepare
    (the source cache), build-<tree> for each tree, verify, bench (array), merge."""
    from ..bench.matrix import parse_sizes
    from ..errors import ConfigError
    from ..kernels.selection import parse_selection
    from ..kitinfo import kit_info
    from ..slurm.campaign import (
        BenchSpec,
        SlurmOptions,
        make_campaign,
        parse_trees,
    )
    from ..slurm.folder import new_campaign_folder, write_campaign
    from ..slurm.scripts import render_script

    parse_selection(head_sizes, block_sizes, kv_dtypes)  # refuse a bad selection now, not in a job
    build_args: list[str] = []
    for opt, value in (("--head-sizes", head_sizes), ("--block-sizes", block_sizes),
                       ("--kv-dtypes", kv_dtypes)):
        if value:
            build_args += [opt, value]
    trees = parse_trees(trees_text)
    if source not in ("auto", "git", "sdist"):
        # an empty one is no path: Path('') is the working folder, which was planned
        if not source or not Path(source).exists():
            raise ConfigError(f"--source {source!r} does not exist",
                              "pass auto, git, sdist or an existing path on a shared filesystem")
        source = str(Path(source).resolve())
    py = check_python(python or sys.executable)
    kit = kit_info()
    c = make_campaign(
        campaign, python=py, kit_root=kit.root, kit_commit=kit.commit, kit_version=kit.version,
        path=CALLER_PATH[0] or os.environ.get("PATH", os.defpath), source=source,
        trees=trees, arch=arch, build_args=build_args, no_gpu=no_gpu,
        bench=BenchSpec(parse_sizes(batches), _split(contexts), _split(presets), stand_in),
        slurm=SlurmOptions(partition, account, time_limit, gres, cpus_per_build),
        scratch=scratch, keep_scratch=keep_scratch)
    from ..slurm.values import path_left_out

    left_out = path_left_out(c.path, c.root)
    if left_out:  # the jobs run in the campaign folder, which others may be able to write
        say("notice: the jobs' PATH leaves out "
            + ", ".join(repr(e) for e in left_out)
            + " of yours: each job runs in the campaign folder, and a PATH entry that is not "
              "absolute, or is in the campaign, would find programs there first")
    if dry_run:
        new_campaign_folder(c, before_lock=True, dry_run=True)  # what the plan refuses
        if as_json:
            emit_json({"plan": c.to_dict(),
                       "scripts": {j.script: render_script(c, j) for j in c.jobs}})
        else:
            for j in c.jobs:
                say(f"==> {j.script} (after: {', '.join(j.after) or '-'})")
                click.echo(render_script(c, j))
        return
    from ..slurm.sending import campaign_lock

    # a plan again over a campaign being submitted must not save a record read before its ids;
    # and two first plans of one folder at once each wrote its scripts and record over the
    # other's, both "planned", the record of one with a script of the other (issue 41, the
    # thirty-sixth hostile pass: a bench job of 6 tasks for a plan of 2 batches): the lock
    # goes in the folder, made and checked first
    new_campaign_folder(c, before_lock=True)
    with campaign_lock(Path(c.root)):
        written = write_campaign(c)
    if kit.dirty:
        info(f"notice: the kit at {kit.root} has uncommitted changes; the jobs run them, but "
             f"campaign.json can only record commit {kit.commit}")
    submitted = None
    if do_submit:
        from ..slurm.cluster import submit as do

        submitted = do(Path(c.root))
    if as_json:
        emit_json({"campaign": c.root, "written": [str(p) for p in written],
                   "submitted": submitted})
        return
    table(["job", "script", "after", "array"],
          [[j.name, j.script, ",".join(j.after) or "-", j.array or "-"] for j in c.jobs],
          title=f"campaign {c.root}")
    if submitted:
        _show_submitted(submitted)
    else:
        info(f"submit with `kvprefetch slurm submit {c.root}`")


def _show_submitted(rows: list[dict]) -> None:
    from ..runner import quote

    for r in rows:
        say(f"{r['job']}: {r.get('id', '(dry run)')}  {quote(r['argv'])}")


@slurm.command()
@campaign_arg
@dry_run_option
@json_option
def submit(campaign: Path, dry_run: bool, as_json: bool) -> None:
    """Submit every job with sbatch --parsable, afterok on its prerequisites; record the ids."""
    from ..slurm.cluster import submit as do

    rows = do(campaign, dry_run=dry_run)
    if as_json:
        emit_json(rows)
    else:
        _show_submitted(rows)


@slurm.command()
@campaign_arg
@click.option("--wait", is_flag=True,
              help="Poll until every job has finished; exit 10 if any did not complete.")
@click.option("--timeout", type=BoundedNumber(WAIT_TIMEOUT), default=3600.0, show_default=True,
              help="With --wait: give up after this many seconds.")
@json_option
def status(campaign: Path, wait: bool, timeout: float, as_json: bool) -> None:
    """Each job's (and array task's) latest state, from scontrol, or sacct for jobs the
    controller has forgotten."""
    from ..errors import SlurmError
    from ..slurm.cluster import status as get
    from ..slurm.cluster import wait as wait_for

    states = wait_for(campaign, timeout) if wait else get(campaign)
    if as_json:
        emit_json([s.to_dict() for s in states])
    else:
        table(["job", "id", "state", "exit", "reason", "from"],
              [[s.job, s.id, s.state, s.exit_code, s.reason, s.source] for s in states],
              title=f"campaign {campaign}")
    bad = [s for s in states if s.terminal and s.state != "COMPLETED"]
    if wait and bad:
        raise SlurmError("not completed: " + ", ".join(f"{s.job} {s.id} {s.state}" for s in bad),
                         f"read {campaign}/logs/, fix the cause, and `kvprefetch slurm resubmit "
                         f"{campaign} JOB [--task N]`")


@slurm.command()
@campaign_arg
@click.argument("job")
@click.option("--task", type=TaskId(), default=None, help="Only this array task (bench).")
@dry_run_option
@json_option
def resubmit(campaign: Path, job: str, task: int | None, dry_run: bool, as_json: bool) -> None:
    """Submit one JOB (or one array task of it) again, alone; afterok only on prerequisites
    that have not completed."""
    from ..slurm.cluster import resubmit as do

    row = do(campaign, job, task, dry_run=dry_run)
    if as_json:
        emit_json(row)
    else:
        _show_submitted([row])


@slurm.command("stand-in")
@campaign_arg
@click.option("--task", type=TaskId(), required=True,
              help="The array task (shard) to write.")
def stand_in(campaign: Path, task: int) -> None:
    """CPU-only stand-in bench shard: results/bench-TASK.json of kind kernel with every shape
    skipped (nothing timed), the builds' libraries re-hashed against their manifests."""
    from ..slurm.cluster import load
    from ..slurm.standin import write_shard

    c, _ = load(campaign)
    info(f"wrote {write_shard(c, task)}")


@slurm.command()
@campaign_arg
@json_option
def prepare(campaign: Path, as_json: bool) -> None:
    """(The prepare job.) The read-only source cache the build jobs fetch from, checked, and
    CAMPAIGN/work's ownership record written before any build starts."""
    from ..slurm.cluster import load
    from ..slurm.prepare import prepare as do

    c, _ = load(campaign)
    res = do(c)
    if as_json:
        emit_json(res)
        return
    how = "downloaded and checked" if res.downloaded else "checked"
    info(f"source cache: {res.source} ({how}, read-only to the build jobs)")
    info("recorded build folders of: " + (", ".join(res.recorded) or "none (already recorded)"))


@slurm.command()
@campaign_arg
@click.option("--tree", "tree_name", required=True, help="The tree this build job built.")
@click.option("--scratch", "scratch", required=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="The build job's scratch work directory.")
@click.option("--logs-only", is_flag=True,
              help="Publish nothing; copy the build's logs to CAMPAIGN/logs/build-TREE-JOBID/ "
                   "(the build failed).")
@json_option
def publish(campaign: Path, tree_name: str, scratch: Path, logs_only: bool,
            as_json: bool) -> None:
    """(The build jobs' last step.) Publish a finished build from the job's scratch into
    CAMPAIGN/work: a copy under a temporary name, then an atomic rename, no lock."""
    import socket

    from ..slurm.cluster import load
    from ..slurm.publish import check_job_label, keep_logs, publish_build

    c, _ = load(campaign)
    tree = c.tree(tree_name).name
    # it names folders: a job id only (SLURM_JOB_ID='../..' escaped the logs folder)
    label = check_job_label(os.environ.get("SLURM_JOB_ID") or str(os.getpid()))
    if logs_only:
        kept = keep_logs(scratch, tree, c.logs / f"build-{tree}-{label}", root=Path(c.root))
        info(f"build logs of {tree} kept in {kept}" if kept else
             f"no build logs of {tree} in {scratch} (it failed before building)")
        return
    res = publish_build(scratch, c.workdir, tree, label=label,
                        host=socket.gethostname(), logs=c.logs)
    if as_json:
        emit_json(res.to_dict())
    else:
        info(f"published {tree}: {res.build_dir} and {res.env_dir} "
             f"(library sha256 {res.so_sha256[:16]}…)")
