"""A campaign's folder as ``slurm plan`` makes and writes it: a new one must be the user's own
(not another user's), empty, or hold only what a ``slurm plan`` stopped before its record left
(the same plan again completes it; a plan of other options is told whose scripts are there);
``write_campaign`` then writes campaign.json and every job's script (``scripts.render_script``),
replacing a script only where it is what the kit wrote there."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .campaign import (
    CAMPAIGN_FILE,
    FIX_UNREADABLE,
    JOB_ENV,
    Campaign,
    campaign_from_dict,
    load_record,
    save_record,
)
from .scripts import render_script
from .sending import LOCK_FILE

# the folders write_campaign makes in a campaign, beside campaign.json
CAMPAIGN_FOLDERS = ("scripts", "logs", "results", "report", "cache")


def new_campaign_folder(c: Campaign, *, before_lock: bool = False,
                        dry_run: bool = False) -> None:
    """The folder of a campaign not planned yet (no campaign.json), made: the user's
    (``make_own_folder``) and empty, but for what this plan's own lock and a killed run of it
    leave (``_left_by_a_killed_plan``). ``plan`` calls it ``before_lock`` it takes the
    campaign's lock, which goes in that folder (a folder that holds that lock already is
    another plan's, perhaps at work: the lock says so, not "not empty"), and
    ``write_campaign`` again under the lock. A ``dry_run`` makes nothing and refuses what the
    plan would: ``slurm plan --dry-run`` showed the scripts for a folder the plan then refused,
    another user's or not empty (issue 41, left open by the thirty-fifth hostile pass)."""
    from ..workspace.foreign import make_own_folder, refuse_foreign
    from ..workspace.locks import refusal

    root = Path(c.root)
    if (root / CAMPAIGN_FILE).exists():
        return
    if dry_run:
        refuse_foreign(root, f"the campaign folder {root}")
        if not root.is_dir():
            return
    else:
        make_own_folder(root, f"the campaign folder {root}")
    lock = root / LOCK_FILE
    refused = refusal(lock, "campaign") if dry_run else None
    if refused is not None:  # what the plan's lock refuses, refused by its dry run too
        raise refused
    if before_lock and not dry_run and os.path.lexists(lock):
        # a dry run takes no lock, so the lock excuses nothing: a folder holding one beside
        # files of the user's passed `plan --dry-run`, which the plan then refused as not
        # empty (issue 41, the thirty-seventh hostile pass)
        return
    if any(p.name != LOCK_FILE for p in root.iterdir()) and not _left_by_a_killed_plan(root, c):
        if _shaped_as_a_killed_plan(root):
            # it said only "not empty / plan into a new or empty folder" to a plan rerun with
            # other options after a Ctrl-C (issue 41, left open by the thirty-seventh pass)
            raise ConfigError(f"{root} is not empty and holds no kvprefetch campaign "
                              f"({CAMPAIGN_FILE}): it holds the job scripts of a `slurm plan` "
                              f"stopped before it wrote {CAMPAIGN_FILE}, planned with other "
                              "options than these (or edited since); kvprefetch does not "
                              "write over them",
                              "rerun that plan with its own options (it completes the "
                              "campaign), or plan into a new or empty folder (look in "
                              f"{root}/scripts first: remove {root} if it holds nothing of "
                              "yours)")
        raise ConfigError(f"{root} is not empty and holds no kvprefetch campaign "
                          f"({CAMPAIGN_FILE}); kvprefetch does not write into it",
                          "plan into a new or empty folder")


def script_bytes(f: Path) -> bytes | None:
    """What a job script in a campaign folder holds, or None where it is no regular file of at
    most 1 MiB (a user's 2 MiB ``scripts/00-prepare.sbatch`` was a ValueError traceback in
    ``slurm plan``, in a new folder and in a planned campaign alike; issue 41, found by the lead
    in the thirty-eighth pass)."""
    from ..reading import read_limited
    from ..workspace.confine import is_plain_file

    try:
        return read_limited(f, 1 << 20) if is_plain_file(f) else None
    except (OSError, ValueError):
        return None


def _shaped_as_a_killed_plan(root: Path) -> bool:
    """Whether ``root`` holds nothing but what some plan's ``write_campaign`` makes before its
    record: the campaign's folders, empty but for job scripts in ``scripts/``, each exporting
    this folder as its campaign (as ``render_script`` writes it; a user's own scripts do not),
    or a temporary of one, and at least one such script (a plan of other options than the one
    now asked)."""
    from ..workspace.ownership import pid_alive

    mark = f"\nexport {JOB_ENV}={shlex.quote(str(root))}\n".encode()
    scripts = 0
    for d in root.iterdir():
        if d.name == LOCK_FILE:
            continue
        if d.name not in CAMPAIGN_FOLDERS or d.is_symlink() or not d.is_dir():
            return False
        for f in d.iterdir():
            tmp = re.fullmatch(r"\.[0-9]{2}-[A-Za-z0-9_-]+\.sbatch\.tmp-[0-9a-f]{6}-([0-9]{1,10})",
                               f.name)
            if d.name == "scripts" and tmp is not None and not pid_alive(int(tmp[1])):
                continue  # the one it was writing when stopped (a live pid's: a plan at work)
            if d.name != "scripts" or not re.fullmatch(r"[0-9]{2}-[A-Za-z0-9_-]+\.sbatch",
                                                       f.name) \
                    or mark not in (script_bytes(f) or b""):
                return False
            scripts += 1
    return scripts > 0


def _left_by_a_killed_plan(root: Path, c: Campaign) -> bool:
    """Whether ``root`` holds only what this plan's own ``write_campaign`` makes before it
    writes campaign.json (its folders, empty but for scripts/, which holds only this plan's
    scripts, byte for byte, and the temporary of a script it was writing when killed, named
    with a pid no process has now): a ``slurm plan`` killed there left it, and the same plan
    again completes it, removing that temporary (issue 41, the fifth hostile pass: the rerun
    said "not empty, plan into a new folder", so a Ctrl-C at the wrong moment cost the user the
    folder)."""
    from ..workspace.confine import is_plain_file, remove_path
    from ..workspace.ownership import pid_alive

    scripts = {job.script: render_script(c, job).encode() for job in c.jobs}
    temporaries = []
    for d in root.iterdir():
        if d.name == LOCK_FILE and is_plain_file(d):  # this plan's own (cli/slurm.py's plan)
            continue
        if d.name not in CAMPAIGN_FOLDERS or d.is_symlink() or not d.is_dir():
            return False
        for f in d.iterdir():
            want = scripts.get(f"{d.name}/{f.name}")
            if want is not None and script_bytes(f) == want:
                continue
            # confine.open_new's name for the temporary of scripts/NAME
            tmp = re.fullmatch(r"\.(.+)\.tmp-[0-9a-f]{6}-([0-9]{1,10})", f.name)
            if tmp is None or f"{d.name}/{tmp[1]}" not in scripts or not is_plain_file(f) \
                    or pid_alive(int(tmp[2])):
                return False
            temporaries.append(f)
    for f in temporaries:
        remove_path(root, f)
    return True


def write_campaign(c: Campaign) -> list[Path]:
    """Write campaign.json (keeping the ids of earlier submissions when the plan is unchanged)
    and every job's script. Refuses to replace the plan of a campaign already submitted."""
    root = Path(c.root)
    record_path = root / CAMPAIGN_FILE
    submitted: dict[str, Any] = {}
    sending = None
    previous: Campaign | None = None
    if record_path.exists():
        try:
            old = load_record(root)
            previous = campaign_from_dict(old["plan"])
        except ConfigError as exc:
            if exc.fix and "new folder" in exc.fix:  # a way out that works (moved, edited)
                raise
            # its fix was "plan the campaign again", which this plan just did: the plan it
            # replaces must be read first (its ids, its scripts), so the same error came back
            # (issue 41, the twenty-fourth hostile pass)
            raise ConfigError(f"{exc.cause} (in {record_path}, the campaign this plan would "
                              "replace)", FIX_UNREADABLE.format(p=record_path)) from None
        sending = old.get("sending")
        if (old["submitted"] or sending) and old["plan"] != json.loads(json.dumps(c.to_dict())):
            raise ConfigError(f"{root} holds a campaign already submitted with another plan",
                              "plan into a new folder, or resubmit single jobs with "
                              "`kvprefetch slurm resubmit`")
        submitted = old["submitted"]
    from ..workspace.confine import ensure_dir, write_file

    new_campaign_folder(c)
    for d in CAMPAIGN_FOLDERS:
        ensure_dir(root / d, root=root)
    written = []
    for job in c.jobs:
        p = root / job.script
        # a script is replaced only when it is exactly what the kit wrote there (this plan's
        # or the previous one's): a user's script, or a user's edit of one, is left alone
        ours = {render_script(c, job).encode()}
        if previous is not None:
            ours |= {render_script(previous, j).encode() for j in previous.jobs
                     if j.script == job.script}
        if os.path.lexists(p) and script_bytes(p) not in ours:
            raise ConfigError(f"{p} exists and was not written by `kvprefetch slurm plan`; "
                              "it is left as it is",
                              f"move {p} away, or plan into a new folder")
        write_file(p, render_script(c, job), root=root, mode=0o755)
        written.append(p)
    # an sbatch started and never answered stays recorded (`submit` refuses until it is seen to)
    save_record(root, {"plan": c.to_dict(), "submitted": submitted}
                | ({"sending": sending} if sending else {}))
    return [record_path, *written]
