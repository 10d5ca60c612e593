"""A job's log: Slurm's own output of every job is ``/dev/null``, and the job's shell writes what
it prints into ``logs/<job>-<id>.out`` itself, as a new file in the campaign's own ``logs/``.

Slurm opens a job's ``--output`` by path, as the user, following links, when the job starts.
The kit first stopped links planted at the next job ids' names (a new folder per submission,
the eleventh hostile pass), but that folder could still be swapped for a link between submit
and the job's start, and Slurm then wrote the job's output outside the campaign (issue 41, the
twenty-fifth hostile pass, shown on a real Slurm and left open until now). The job's shell
instead enters ``logs/`` with ``cd -P`` and checks it is the campaign's by the folder the
kernel resolves (as ``shell.WRITE_NEW_SH`` does), then has ``dd`` make a new file there
(``conv=excl oflag=nofollow``): never through a link, never over a file, and a swap of the path
after the check moves nothing outside (the working folder holds on to the folder). A name
taken (a requeued job's earlier log, or anything planted) is kept, and the next one
(``.1.out`` ... ``.9.out``) is used.

What the job prints before its log is open (its checks of ``PATH`` and of Slurm's job ids,
which run before any program is started) goes nowhere: a job refused there has no log, as a
job whose campaign was moved had none before (Slurm could not open its output). Pure text:
nothing here runs."""

from __future__ import annotations

import shlex

# Slurm's --output (and so its --error) for every job, in the script and on sbatch's command line
# (which overrides a submitting shell's SBATCH_OUTPUT)
SLURM_OUTPUT = "/dev/null"

# the signals that end a bash script by default (Slurm's --signal, scancel -s, a terminal's
# Ctrl-C, a closed terminal, a broken pipe, a CPU limit): the job records each as 128+n (its
# EXIT trap saw the status of the last command, "0" for a job stopped by SIGINT, SIGHUP or
# SIGPIPE; and SIGUSR1, SIGUSR2 or SIGALRM killed the log's writer, then the job, by SIGPIPE,
# before its record: issue 41, the thirty-first hostile pass), and the log's writer ignores them
ENDING_SIGNALS = "HUP INT PIPE ALRM USR1 USR2 TERM XCPU XFSZ VTALRM PROF"
# the first one ends the job and the rest are ignored from then on; one that comes as the job
# ends on its own (EXITING, set by the EXIT trap's first command) is only ignored: either way
# it cut the EXIT trap short, and the job left no exit record (issue 41, the thirty-second pass).
# The first one ends the job itself (``at_exit``, which the script defines before this trap
# runs: the exit record, a build job's scratch) and leaves no EXIT trap: one that came as the
# EXIT trap began, before its first command set EXITING, exited from inside it, and left no
# record (1 job in 12 of a TERM storm under load, in the fresh-machine run of pass 35's landing)
TRAP_ENDING_SH = ("for s in " + ENDING_SIGNALS + "; do"
                  f' trap "trap \'\' {ENDING_SIGNALS} QUIT; [ -n \\"\\${{EXITING-}}\\" ] ||'
                  ' { EXITING=$((128 + $(kill -l "$s"))); trap - EXIT;'
                  ' at_exit \\$EXITING; exit \\$EXITING; }" "$s"; done')

_SPARE_NAMES = " ".join(["''"] + [f".{n}" for n in range(1, 10)])


def open_log_sh(job_name: str) -> tuple[str, ...]:
    """The lines that send the job's output and errors, as one stream in the order printed, to
    ``logs/<job>-$JOB_ID.out`` (run in the campaign's folder, after ``CAMPAIGN_AT``, ``JOB_ID``
    and the ``EXIT`` trap are set: a refusal here records its end). A copy goes on to where the
    job's errors went before (Slurm's ``/dev/null``; a terminal, or a caller's pipe, for a script
    run by hand). The writer ignores the stop signals, so a cancelled job's cleanup is logged
    too (``close_log`` ends it)."""
    name = shlex.quote(f"{job_name}-")
    return (
        "LOG_WANT=${CAMPAIGN_AT%/}/logs",
        ('( cd -P -- logs && [ "$(env pwd -P)" = "$LOG_WANT" ] ) 2>/dev/null || {'
         ' echo "refusing to run: $CAMPAIGN_AT/logs is not the campaign\'s own logs folder'
         ' (a link, or moved since the job started: another process is changing the'
         ' campaign). To fix: find what else writes the campaign, then send the job again"'
         " >&2; exit 2; }"),
        "exec 3>&2",
        f"exec > >(trap '' {ENDING_SIGNALS} QUIT",
        "  tee -a -p /dev/fd/3 2>/dev/null | {",
        '  if cd -P -- logs 2>/dev/null && [ "$(env pwd -P)" = "$LOG_WANT" ]; then',
        f"    for n in {_SPARE_NAMES}; do",
        f'      f={name}"$JOB_ID$n.out"',
        # bs: each piece read is written at once (with the default ibs and obs, dd gathers
        # 512-byte blocks, and a job's last lines waited in it while the job ran on)
        '      dd of="$f" bs=64K conv=excl oflag=nofollow status=none 2>/dev/null && exit 0',
        # a name taken by anything (a requeued job's log, a link): the next one
        '      if [ ! -e "$f" ] && [ ! -L "$f" ]; then break; fi',
        "    done",
        "  fi",
        # no log could be made (a race with whoever changes the campaign, a full disk): the job
        # goes on, its output dropped, rather than killed by a broken pipe before its exit record
        "  exec cat > /dev/null; }) 2>&1 3>&-",
        "LOG_PID=$!",
    )


# the end of the job's output: the writer gets its end of input and has written everything once
# it exits; a program the job left running holds the pipe open, so the wait is 5 s at most
CLOSE_LOG_SH = (
    "close_log() {",
    '  if [ -z "${LOG_PID:-}" ]; then return 0; fi',
    "  exec >&- 2>&-",
    "  local i",
    '  for i in $(seq 50); do kill -0 "$LOG_PID" 2>/dev/null || return 0; sleep 0.1; done',
    "}",
)
