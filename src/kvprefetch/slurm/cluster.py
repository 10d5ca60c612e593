"""Talking to Slurm for a campaign: ``sbatch --parsable`` to submit (ids recorded in
campaign.json), ``scontrol show job`` for the state of jobs the controller still knows (pending,
running, and finished ones for MinJobAge), ``sacct`` for the ones it has forgotten (where
accounting is on), and the exit record each job's script leaves in ``logs/`` where neither
knows the job any more. Every command goes through the kit's runner."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import CommandError, ConfigError, SlurmError
from ..runner import run, which
from .campaign import (
    CAMPAIGN_FILE,
    EXIT_SUFFIX,
    MAX_SUBMISSIONS,
    Campaign,
    Job,
    campaign_from_dict,
    load_record,
    save_record,
)
from .job_env import check_passed
from .scripts import sbatch_argv, scratch_names, submission_order
from .sending import campaign_lock, check_job_folders, check_job_scripts

# ENDED: forgotten by the controller, no accounting and no exit record (recorded_end)
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE", "NEVER", "ENDED")
SCONTROL_FAILED = "scontrol failed"  # the reason of a job the controller did not answer for
FIX_SLURM = "run this on a Slurm login node (sbatch, scontrol on PATH, slurmctld reachable)"


# A question to Slurm (scontrol, sacct) that never answers is stopped, its job UNKNOWN. sbatch
# has no limit: stopped midway, it may have sent a job the campaign would never record.
QUERY_TIMEOUT_S = 60.0


def _slurm(argv: Sequence[str], check: bool = True, timeout: float | None = None,
           env: dict[str, str] | None = None) -> Any:
    if which(argv[0]) is None:
        raise SlurmError(f"{argv[0]} was not found on PATH", FIX_SLURM)
    try:
        # from /, never the folder the user runs the kit in (it may be the campaign): an
        # empty LD_LIBRARY_PATH entry is the working folder to the dynamic loader
        return run(list(argv), echo=False, check=check, cwd="/", timeout=timeout, env=env)
    except CommandError as exc:
        tail = "\n".join(shown(line, 500) for line in exc.tail.strip().splitlines()[-20:])
        raise SlurmError(f"{' '.join(argv)} failed (exit code {exc.returncode}): {tail}",
                         FIX_SLURM) from None


def load(root: Path) -> tuple[Campaign, dict[str, Any]]:
    rec = load_record(root)
    return campaign_from_dict(rec["plan"]), rec


def latest_id(rec: dict[str, Any], job: str) -> str | None:
    subs = rec["submitted"].get(job) or []
    return str(subs[-1]["id"]) if subs else None


def parse_parsable(output: str) -> str:
    """``sbatch --parsable`` prints ``ID`` or ``ID;CLUSTER``, its messages (stderr, which the
    runner joins to stdout) on lines of their own. The id is ASCII digits, as campaign.json's
    check wants them: ``str.isdigit`` also took ``²`` or ``١٢``, which were recorded and then
    made the campaign "corrupt" for every later command (issue 41, the tenth hostile pass).
    The id is the last line that is one: a warning printed after it (a site's sbatch wrapper,
    a message at exit) made a job Slurm had taken "not a job id", its fix to find a login node
    (issue 41, the seventeenth hostile pass)."""
    lines = output.strip().splitlines()
    for line in reversed(lines):
        m = _PARSABLE.fullmatch(line.strip())
        if m is not None:
            return m[1]
    line = lines[-1] if lines else ""
    # its last line, shown (escaped, cut): the whole output, repr'd, was the message, 20 MB
    # of it from an sbatch that printed 20 MB (issue 41, the fifteenth hostile pass)
    raise SlurmError(f"sbatch printed '{shown(line)}', not a job id"
                     + (f" (the last of {len(lines)} lines)" if len(lines) > 1 else ""),
                     FIX_SLURM)


_PARSABLE = re.compile(r"([0-9]+)(?:;[^;\s]+)?")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def refuse_unanswered(root: Path, c: Campaign, rec: dict[str, Any],
                      resubmitting: str | None = None, task: int | None = None) -> None:
    """Refuse (SlurmError) to send anything while an sbatch of this campaign was started and
    its answer never recorded (a submit stopped by Ctrl-C, SIGTERM, SIGKILL or a lost login
    node in that window): Slurm may hold that job, and sending it again would run it twice
    (issue 41, the ninth hostile pass: a SIGTERM during the first sbatch left no trace, and
    the next `submit` sent every job again). The way out is the ``resubmit`` of that very
    job (and array task: ``task``), once the user has looked for it with squeue.

    A ``sending`` that names no job of the campaign is a corrupt record, and one that names an
    array task is answered only by the resubmit of that task (issue 41, the tenth hostile
    pass: a hand-edited job name left submit refusing for ever, its way out an empty list and
    a resubmit of a job that does not exist; ``resubmit JOB --task 4`` replaced the unanswered
    record of task 3, which Slurm may hold, and its fix named the whole array)."""
    sending = rec.get("sending")
    if not sending:
        return
    job = sending["job"]
    name = f"kvp-{Path(c.root).name}-{job}"
    if job not in {j.name for j in c.jobs}:
        raise ConfigError(
            f"{root / CAMPAIGN_FILE} is corrupt: 'sending' names the job {job!r}, which the "
            "campaign does not plan (kvprefetch records only its own jobs there)",
            f"check `squeue --me --name {name}` for such a job (scancel it), then restore "
            "campaign.json as `kvprefetch slurm submit` wrote it (without that 'sending' "
            "entry), or plan the campaign again into a new folder (`kvprefetch slurm plan`)")
    sent_task = sending.get("task")
    if job == resubmitting and sent_task == task:
        return
    at = f" --task {sent_task}" if sent_task is not None else ""
    what = "" if sent_task is None else f" (array task {sent_task})"
    rest = [j.name for j in submission_order(c)
            if j.name not in rec["submitted"] and j.name != job]
    ways = [f"`kvprefetch slurm resubmit {root} {job}{at}`"]
    ways += [f"`kvprefetch slurm resubmit {root} {j}`" for j in rest]
    raise SlurmError(
        f"the sbatch of {job}{what} in {root} was started at {sending.get('at') or '?'} and "
        "stopped before its job id was recorded: Slurm may or may not hold that job, and "
        "kvprefetch sends nothing more until you have looked",
        f"run `squeue --me --name {name}` (and `sacct --name {name}` for one that already "
        "ended); `scancel` the job it lists, then send it and the rest in order: "
        + "; ".join(ways))


def _send(root: Path, rec: dict[str, Any], job: str, task: int | None,
          argv: Sequence[str], env: dict[str, str]) -> str:
    """One sbatch, its intent recorded in campaign.json before it starts ("sending") and
    replaced by its id once it answers; an sbatch that fails (Slurm said no) sent nothing, nor
    did one the runner refused to start (a ``TMPDIR`` that is no folder, a program it cannot
    run: ``ConfigError``, ``OSError``), whose "sending" had the next submit say that the
    sbatch "was started" and Slurm might hold its job (issue 41, the eleventh hostile pass)."""
    if sum(len(subs) for subs in rec["submitted"].values()) >= MAX_SUBMISSIONS:
        raise SlurmError(f"the campaign {root} has sent {MAX_SUBMISSIONS} jobs, the most one "
                         "campaign records (`slurm status` asks Slurm about each)",
                         "plan a new campaign into a new folder (`kvprefetch slurm plan`) for "
                         "the jobs still to run")
    rec["sending"] = {"job": job, "task": task, "at": _now()}
    save_record(root, rec)
    try:
        output = _slurm(argv, env=env).output
    except (SlurmError, ConfigError, OSError):
        rec.pop("sending", None)
        save_record(root, rec)
        raise
    job_id = parse_parsable(output)
    rec["submitted"].setdefault(job, []).append(
        {"id": job_id, "task": task, "argv": list(argv), "at": _now()})
    rec.pop("sending", None)
    save_record(root, rec)
    return job_id


def submit(root: Path, dry_run: bool = False) -> list[dict[str, Any]]:
    """Submit every job of the campaign in order, each with ``afterok`` on the ids of the jobs
    it depends on. A campaign is submitted once; single jobs again with ``resubmit``."""
    if dry_run:
        return _submit(root, dry_run)
    c, _ = load(root)
    with campaign_lock(Path(c.root)):
        return _submit(root, dry_run)


def _submit(root: Path, dry_run: bool) -> list[dict[str, Any]]:
    c, rec = load(root)  # read again under the lock
    check_job_folders(root)
    check_job_scripts(root, submission_order(c))
    # once, before any sbatch, and in a dry run too: that one planned every job with exit 0
    # where the real submit sends none (issue 41, the twenty-first hostile pass)
    env = check_passed(os.environ, root.resolve(), scratch_names(c))
    if not dry_run:
        refuse_unanswered(root, c, rec)
    if rec["submitted"] and not dry_run:
        sent = ", ".join(f"{j}={latest_id(rec, j)}" for j in rec["submitted"])
        missing = [j.name for j in submission_order(c) if j.name not in rec["submitted"]]
        if missing:  # a submit killed or failed part-way (issue 41, sixth pass: the message
            # said only "resubmit a failed job", and the jobs never sent went unnamed)
            raise SlurmError(
                f"the submission of {root} stopped part-way: {sent} were sent, "
                f"{', '.join(missing)} not (or sent by an sbatch whose answer was never "
                "recorded)",
                "check `squeue --me` for a job of this campaign not listed above (scancel it), "
                "then send the rest in order: "
                + "; ".join(f"`kvprefetch slurm resubmit {root} {j}`" for j in missing))
        raise SlurmError(f"the campaign {root} was already submitted (jobs {sent})",
                         "see `kvprefetch slurm status`; resubmit a failed job alone with "
                         "`kvprefetch slurm resubmit`")
    ids: dict[str, str] = {}
    done = []
    for job in submission_order(c):
        argv = sbatch_argv(c, job, [ids[a] for a in job.after])
        if dry_run:
            ids[job.name] = f"<{job.name}>"
            done.append({"job": job.name, "argv": argv})
            continue
        # recorded before and after every job: an error later keeps the ids so far
        job_id = _send(root, rec, job.name, None, argv, env)
        ids[job.name] = job_id
        done.append({"job": job.name, "id": job_id, "argv": argv})
    return done


@dataclass(frozen=True)
class JobState:
    job: str            # campaign job name
    id: str             # Slurm id, ``<array>_<task>`` for array tasks
    state: str          # COMPLETED, RUNNING, PENDING, FAILED, ..., NEVER, ENDED, UNKNOWN
    exit_code: str
    reason: str
    source: str         # scontrol or sacct
    waits_on: tuple[str, ...] = ()  # a pending job's afterok ids, as scontrol shows them

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def to_dict(self) -> dict[str, str]:
        return {"job": self.job, "id": self.id, "state": self.state, "exit_code": self.exit_code,
                "reason": self.reason, "source": self.source}


_FIELD = re.compile(r"(\w+)=(\S*)")


def shown(value: str, limit: int = 200) -> str:
    """A value Slurm printed, as the kit shows it: control characters escaped (an escape
    sequence in a job's state or reason cleared or retitled the user's terminal) and at most
    ``limit`` characters (issue 41, the tenth hostile pass)."""
    out = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in value[:limit])
    return out + ("…" if len(value) > limit else "")


def parse_scontrol(text: str) -> list[dict[str, str]]:
    """``scontrol -o show job`` output: one record per line, ``Key=Value`` fields, values shown
    (``shown``). A line without a ``JobId`` field (``ArrayJobId=5 ...`` alone) is not a job
    record: it was a KeyError traceback (issue 41, the tenth hostile pass)."""
    out = []
    for line in text.splitlines():
        fields = {k: shown(v) for k, v in _FIELD.findall(line)}
        if "JobId" in fields:
            out.append(fields)
    return out


def parse_sacct(text: str) -> list[dict[str, str]]:
    """``sacct -n -P -X -o JobID,State,ExitCode`` output, values shown (``shown``). An empty
    state is UNKNOWN (it was an IndexError traceback: issue 41, the tenth hostile pass)."""
    out = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) >= 3 and parts[0]:
            out.append({"JobID": shown(parts[0]),
                        "State": shown((parts[1].split() or ["UNKNOWN"])[0]),
                        "ExitCode": shown(parts[2])})
    return out


def _record_state(job: str, r: dict[str, str]) -> JobState:
    task = r.get("ArrayTaskId")
    sid = f"{r['ArrayJobId']}_{task}" if r.get("ArrayJobId") and task else r["JobId"]
    state, reason = r.get("JobState", "UNKNOWN"), r.get("Reason", "None")
    if state == "PENDING" and reason == "DependencyNeverSatisfied":
        state = "NEVER"  # will never run: a job it depends on did not succeed
    # `afterok:18(unfulfilled),afterok:19_*(unfulfilled)`: the ids it waits on
    waits = tuple(re.findall(r"afterok:([0-9]+)", r.get("Dependency", "")))
    return JobState(job, sid, state, r.get("ExitCode", "?"), reason, "scontrol", waits)


def job_states(job: str, job_id: str) -> list[JobState]:
    """What Slurm knows of a submission: scontrol while the controller keeps the job, then
    sacct where accounting is on. Empty when neither knows it: the controller has forgotten a
    finished job (after MinJobAge, 300 s by default) and there is no accounting."""
    res = _slurm(["scontrol", "-o", "show", "job", job_id], check=False,
                 timeout=QUERY_TIMEOUT_S)
    if res.returncode == 0:
        records = parse_scontrol(res.output)
        if records:
            return [_record_state(job, r) for r in records]
        # an answer that holds no job record is not the controller forgetting the job (that
        # is "Invalid job id", exit 1): keep asking, never read it as ENDED
        return [JobState(job, job_id, "UNKNOWN", "?", "scontrol printed no job record: "
                         + shown((res.output.strip().splitlines() or ["no output"])[-1]),
                         "none")]
    if which("sacct") is not None:
        acct = run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,State,ExitCode"],
                   echo=False, check=False, cwd="/", timeout=QUERY_TIMEOUT_S)
        rows = parse_sacct(acct.output) if acct.returncode == 0 else []
        if rows:
            return [JobState(job, r["JobID"], r["State"], r["ExitCode"], "", "sacct")
                    for r in rows]
    if "invalid job id" in res.output.lower():
        return []
    # the controller did not answer (down, restarting, unreachable): not an end, keep asking
    return [JobState(job, job_id, "UNKNOWN", "?", SCONTROL_FAILED + ": "
                     + shown((res.output.strip().splitlines() or ["no output"])[-1]), "none")]


def recorded_end(logs: Path, job: str, job_id: str) -> JobState:
    """A forgotten job's end from the exit record its script's EXIT trap wrote
    (``logs/<job>-<id>.exit``). Without one the job is still over (the controller forgets only
    finished jobs) but its outcome is not known: ENDED, which is not a success."""
    from ..reading import read_limited

    path = logs / f"{job}-{job_id}{EXIT_SUFFIX}"
    try:
        text = read_limited(path, 64).decode("ascii", "replace").strip()
    except FileNotFoundError:
        return JobState(job, job_id, "ENDED", "?", "the controller has forgotten it, no "
                        f"accounting, and it left no {path.name} (killed: time limit, "
                        "scancel, node failure?)", "none")
    except (OSError, ValueError) as exc:
        return JobState(job, job_id, "ENDED", "?", f"its exit record is unreadable ({exc})",
                        "none")
    # a shell's exit status is 0 to 255: 256 or a 23-digit number was shown as the job's
    # exit code, FAILED (issue 41, the eighteenth hostile pass)
    if not re.fullmatch(r"[0-9]{1,3}", text) or int(text) > 255:
        return JobState(job, job_id, "ENDED", "?", f"{path.name} holds {text[:20]!r}, not an "
                        "exit status", "exit record")
    return JobState(job, job_id, "COMPLETED" if int(text) == 0 else "FAILED", f"{text}:0",
                    "", "exit record")


Fetch = Callable[[str, str], list[JobState]]


def submission_states(c: Campaign, job: Job, sub: dict[str, Any],
                      fetch: Fetch = job_states) -> list[JobState]:
    """The states of one submission of ``job``: Slurm's, else each task's exit record."""
    job_id = str(sub["id"])
    known = fetch(job.name, job_id)
    if known:
        return known
    if sub.get("task") is not None:
        ids = [f"{job_id}_{sub['task']}"]
    elif job.array:
        ids = [f"{job_id}_{t}" for t in range(job.array)]
    else:
        ids = [job_id]
    return [recorded_end(c.logs, job.name, i) for i in ids]


def status(root: Path, fetch: Fetch = job_states) -> list[JobState]:
    """Per job (per array task), the state of its latest submission: a task resubmitted alone
    replaces that task's row of the first submission."""
    c, rec = load(root)
    if not rec["submitted"]:
        # a first sbatch never answered: "run submit" was a fix submit then refused (issue 41,
        # the eleventh hostile pass: submit SIGKILLed as the real sbatch answered)
        if rec.get("sending"):
            # ... unless a submit is sending it now: its 'sending' record is the same, and
            # status said that sbatch had "stopped before its job id was recorded", its fix to
            # scancel that job and send it again while the live submit was about to record it
            # (issue 41, the twenty-third hostile pass). That submit holds the campaign's lock:
            # status is then the lock's message (wait for it), and reads the record anew.
            with campaign_lock(Path(c.root)):
                c, rec = load(root)
            if rec["submitted"]:
                return status(root, fetch)
        refuse_unanswered(root, c, rec)
        raise SlurmError(f"the campaign {root} has not been submitted",
                         f"run `kvprefetch slurm submit {root}`")
    out: list[JobState] = []
    ended: dict[str, JobState] = {}  # submission id -> a row of it that did not complete
    asked = _once_unreachable(fetch)
    for job in c.jobs:  # in submission order: what a job waits on comes before it
        rows: dict[str, JobState] = {}
        for sub in rec["submitted"].get(job.name, []):
            if sub.get("task") is None:
                # the whole job sent again replaces every row of the earlier one: a pending
                # array is one record, `138_0-1`, which the new tasks' rows (`_0`, `_1`) never
                # replaced, so a campaign done was "not completed: bench 138_0-1" (issue 41,
                # the eleventh hostile pass, on a real Slurm)
                rows = {}
            for st in submission_states(c, job, sub, asked):
                st = _never_if_waiting_on_an_end(st, ended)
                task = st.id.partition("_")[2] if sub.get("task") is None else str(sub["task"])
                rows[task] = st
                if st.terminal and st.state != "COMPLETED":
                    ended.setdefault(str(sub["id"]), st)
        out += rows.values()
    return out


def _once_unreachable(fetch: Fetch) -> Fetch:
    """``fetch``, until the controller does not answer once: then the other jobs of this round
    are UNKNOWN without asking. Each scontrol tries for its MessageTimeout's retries (18 s on a
    real Slurm here) before it gives up, one job after another: a status of six jobs took 108 s
    with the controller stopped, and ``status --wait --timeout 5`` as long (issue 41, the
    eleventh hostile pass)."""
    failed: list[JobState] = []

    def asked(job: str, job_id: str) -> list[JobState]:
        if failed:
            return [JobState(job, job_id, "UNKNOWN", "?", "not asked: the controller did not "
                             f"answer for {failed[0].job} ({failed[0].reason})", "none")]
        got = fetch(job, job_id)
        failed.extend(s for s in got if s.state == "UNKNOWN"
                      and s.reason.startswith(SCONTROL_FAILED))
        return got

    return asked


def _never_if_waiting_on_an_end(st: JobState, ended: dict[str, JobState]) -> JobState:
    """A job pending on a job that will never complete (afterok) never runs either, yet Slurm
    marks only the first one's dependants DependencyNeverSatisfied: the next stage stayed
    PENDING (Dependency) for ever, and ``status --wait`` waited out its whole timeout (an hour
    by default) to say "wait longer" (issue 41, the eleventh hostile pass: on a real Slurm, a
    build cancelled or failed left bench and merge pending)."""
    if st.state != "PENDING":
        return st
    for dep in st.waits_on:
        if dep in ended:
            e = ended[dep]
            return replace(st, state="NEVER",
                           reason=f"waits (afterok) on {e.job} {e.id}, which is {e.state}")
    return st


def wait(root: Path, timeout_s: float, poll_s: float = 2.0,
         fetch: Fetch = job_states) -> list[JobState]:
    """Poll until every job is in a final state; a SlurmError after ``timeout_s``."""
    t0 = time.monotonic()
    while True:
        states = status(root, fetch)
        if all(s.terminal for s in states):
            return states
        if time.monotonic() - t0 > timeout_s:
            raise SlurmError(f"after {timeout_s:.0f} s these jobs are still not done: "
                             + ", ".join(f"{s.job} {s.id} {s.state} ({s.reason})"
                                         for s in states if not s.terminal),
                             "wait longer (--timeout) or look at `squeue` and the job logs")
        time.sleep(poll_s)


def resubmit(root: Path, job_name: str, task: int | None = None,
             dry_run: bool = False) -> dict[str, Any]:
    """Submit one job again, alone (one array task with ``task``). It depends (afterok) only on
    those of its prerequisites whose latest submission has not completed yet."""
    if dry_run:
        return _resubmit(root, job_name, task, dry_run)
    c, _ = load(root)
    with campaign_lock(Path(c.root)):
        return _resubmit(root, job_name, task, dry_run)


def _resubmit(root: Path, job_name: str, task: int | None, dry_run: bool) -> dict[str, Any]:
    c, rec = load(root)  # read again under the lock
    check_job_folders(root)
    job = c.job(job_name)
    check_job_scripts(root, [job])
    env = check_passed(os.environ, root.resolve(), scratch_names(c))  # the dry run as _submit's
    if not dry_run:
        refuse_unanswered(root, c, rec, resubmitting=job_name, task=task)
    if task is not None and job.array is None:
        # was "pass --task 0..0 for an array job", which sends the user back to the --task 0
        # just refused (issue 41, the twenty-first hostile pass)
        raise SlurmError(f"job {job_name} is not an array job, so it has no task {task}",
                         f"resubmit it without --task (kvprefetch slurm resubmit {root} "
                         f"{job_name})")
    if task is not None and job.array is not None and not 0 <= task < job.array:
        raise SlurmError(f"job {job_name} has no array task {task}",
                         f"pass --task 0..{job.array - 1} for an array job, or no --task")
    deps: list[str] = []
    for a in job.after:
        aid = latest_id(rec, a)
        if aid is None:
            raise SlurmError(f"{job_name} depends on {a}, which was never submitted",
                             f"run `kvprefetch slurm submit {root}` first")
        if dry_run or not all(s.state == "COMPLETED" for s in
                              submission_states(c, c.job(a), rec["submitted"][a][-1])):
            deps.append(aid)
    argv = sbatch_argv(c, job, deps, task)
    if dry_run:
        return {"job": job_name, "task": task, "argv": argv}
    job_id = _send(root, rec, job_name, task, argv, env)
    return {"job": job_name, "task": task, "id": job_id, "argv": argv}
