"""What a Slurm campaign's values may be: each option that reaches an sbatch script or a job's
shell checked against what sbatch and a shell accept (names, ``--time``, ``--gres``, the
campaign folder, ``--scratch``) and against what the kit itself accepts (batch sizes, contexts,
presets, ``--arch``). Refused values are ConfigErrors naming the option; the checks run when a
campaign is planned and again when its ``campaign.json`` is read back. Pure."""

from __future__ import annotations

import os
import posixpath
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from ..bench.plan import Bound
from ..errors import ConfigError
from ..oserrors import other_bytes_on_disk

SCRATCH_NODE = "node"
# `--scratch campaign` (CAMPAIGN/scratch) was refused from the thirteenth hostile pass on: see
# check_scratch
_SCRATCH_GONE = "campaign"
_SCRATCH_FORBIDDEN = ('"', "`", "\\", "$(", "\n")
# The scratch goes into the build script inside double quotes, where `$` is the one character
# bash still acts on once `"`, backquotes and backslashes are refused: so `$` may only start a
# plain `$NAME` or `${NAME}`. Any other expansion is code: `${x:=${z:-$}(cmd)}${x@P}` passed
# the `$(` check (the `$(` is built at run time, and `@P` expands it as a prompt, which runs
# it), and the build job ran cmd; `${` alone, or `${x:-'}`, made a script bash cannot parse,
# every line after it read in the wrong quoting (issue 41, the nineteenth hostile pass).
# `$_` alone is bash's last argument, never a variable of the user's: the job's scratch was
# `]/x` (issue 41, the twenty-fifth hostile pass).
_NAME = r"(?:[A-Za-z][A-Za-z0-9_]*|_[A-Za-z0-9_]+)"
SCRATCH_VARIABLE = re.compile(rf"\$(?:{_NAME}|\{{{_NAME}\}})")


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
    # a field of more than 18 digits is past any limit (and int() of one past Python's limit on
    # digits, 4,300 or the user's PYTHONINTMAXSTRDIGITS, was a ValueError traceback: issue 41,
    # the thirty-seventh hostile pass)
    if m is not None and all(len(v.lstrip("0")) <= 18 for v in m.groups() if v is not None):
        g = {k: int(v.lstrip("0") or "0") for k, v in m.groupdict().items() if v is not None}
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
        # a letter outside ASCII (`é`) was refused naming none of the kinds listed, with "use
        # only letters" (the twenty-eighth hostile pass): the first character refused is named
        odd = next((c for c in root if not _CAMPAIGN_PATH.fullmatch("/" + c)), None)
        raise ConfigError(f"the campaign folder {root!r} has characters that cannot go into an "
                          "sbatch script safely (spaces, quotes, $, `, \\, %, control "
                          "characters, letters outside ASCII"
                          + (f"; here {odd!a}" if odd else ", or a /../") + ")",
                          "plan into a folder whose path uses only ASCII letters, digits and _ . "
                          "- / + , : @ =")
    return root


def check_words(what: str, values: Sequence[str]) -> None:
    """No control character (a newline ends a shell line) in values that become shell words."""
    from ..workspace.confine import has_control

    for v in values:
        if not isinstance(v, str) or has_control(v):
            raise ConfigError(f"{what} {v!r} holds a control character (or is not text)",
                              f"pass {what} without newlines or other control characters")
        check_utf8(what, v)


def check_utf8(what: str, value: str, fix: str | None = None) -> None:
    """A value bound for a script is UTF-8 text: a path's byte that is not (Python's
    ``surrogateescape``) cannot be written into one. ``--scratch``, ``--source`` or ``--python``
    naming such a path was a ``UnicodeEncodeError`` traceback half-way through ``slurm plan``
    (issue 41, the twenty-third hostile pass)."""
    # the name's bytes as this locale gives them to the system, which a job script (UTF-8)
    # must hold: under Shift_JIS, GBK, Big5 or latin-1 a path was decoded to text that passed
    # the check below and went into the script as UTF-8, other bytes, so the build job made
    # and built in a folder of another name than the --scratch given (and ran another
    # --python, looked in other PATH folders; issue 41, the twenty-seventh hostile pass).
    # Asked first: a name already in UTF-8 that such a locale cannot decode (`中`, e4 b8 ad,
    # under GBK or Big5) was told to be renamed "to a UTF-8 name" (the twenty-eighth pass)
    if other_bytes_on_disk(value):
        raise ConfigError(f"{what} {value!r} is, under this locale's encoding "
                          f"({sys.getfilesystemencoding()}), other bytes than its UTF-8 text: a "
                          "job script (UTF-8) would name another path",
                          "run kvprefetch under a UTF-8 locale (e.g. `LC_ALL=C.UTF-8`), or use "
                          "a path of ASCII characters, then plan again")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{what} {value!r} is not UTF-8 text: a job script cannot hold it",
                          fix or f"rename the folder or file {what} names to a UTF-8 name (or "
                          "link a UTF-8 name to it), then plan again") from None


# --cpus-per-build is sbatch's --cpus-per-task for a build job and its MAX_JOBS (parallel nvcc
# and compiler processes, each wanting 1-2 GiB): one job runs on one node, and no node Slurm
# schedules has more than 1024 CPUs (two 192-core, 2-way SMT sockets are 768); 10^23 was
# accepted and failed only at sbatch (issue 41, fourth pass).
MAX_CPUS_PER_BUILD = 1024


def check_scratch(scratch: str, root: str) -> str:
    """``node``, or an absolute folder outside the campaign ``root``, which may name environment
    variables the job's shell expands (``/scratch/$USER``); nothing else a shell would run.

    Never a folder in the campaign: a build job works in its scratch by path (``fetch
    --workdir``, the kit's builds, its exit ``rm -rf``), so whoever can write the campaign could
    swap the scratch's parent for a link after the job made its folder, and the job then built a
    whole work directory (81 MB) outside and removed it through the link (issue 41, the twelfth
    hostile pass). A node's scratch or the user's own folder is the user's to point anywhere, as
    every ``--workdir`` is; ``--scratch campaign`` went for that reason."""
    from ..workspace.confine import has_control

    if scratch == SCRATCH_NODE:
        return scratch
    fix = ("pass node (the job's $SLURM_TMPDIR/$TMPDIR), or a folder of yours outside the "
           "campaign such as /scratch/$USER (no quotes, backslashes or $(...))")
    if scratch == _SCRATCH_GONE:
        raise ConfigError("--scratch campaign is no longer offered: a build job's scratch in the "
                          "campaign could be swapped for a link by whoever can write the "
                          "campaign, and the job would build outside it and remove through the "
                          "link", fix + "; a campaign planned with it is planned again into a "
                          "new folder")
    if not isinstance(scratch, str) or not scratch.startswith(("/", "$")) \
            or any(c in scratch for c in _SCRATCH_FORBIDDEN) or has_control(scratch):
        raise ConfigError(f"--scratch {scratch!r} is not node or an absolute folder", fix)
    check_utf8("--scratch", scratch)
    if "$" in SCRATCH_VARIABLE.sub("", scratch):
        raise ConfigError(f"--scratch {scratch!r} uses $ for more than naming a variable "
                          "($NAME or ${NAME}): the build job's shell would run the rest "
                          "(defaults, substitutions, prompt expansion)", fix)
    # as the kernel reads it: `/x/../camp/s`, `//camp/s` and `/camp/./s` named the campaign and
    # passed a check of the text as typed (issue 41, the fourteenth hostile pass); a folder whose
    # value only the job's shell knows ($PWD, a relative $VAR) is checked by the job
    # (shell.SCRATCH_OUTSIDE_SH)
    from .job_env import check_scratch_names  # sbatch passes each name on to the job

    check_scratch_names(scratch_variables(scratch))
    inside = re.sub("/+", "/", posixpath.normpath(scratch)).rstrip("/") + "/"
    if inside.startswith(str(root).rstrip("/") + "/"):
        raise ConfigError(f"--scratch {scratch} is inside the campaign {root}: a build job's "
                          "scratch there could be swapped for a link by whoever can write the "
                          "campaign", fix)
    return scratch


def check_source(source: str, root: str) -> str:
    """``auto``, ``sdist``, or an absolute path outside the campaign ``root``: the build jobs
    fetch vLLM from it, and a clone in the campaign is one whoever can write the campaign may
    change after the prepare job's check (a clone is checked by its pristine files, not all of
    its files). ``slurm plan`` took one, and only a job found it wrong (issue 41, the
    twenty-first and twenty-second passes left it open); a campaign.json naming one is refused
    too."""
    if source in ("auto", "sdist"):
        return source
    fix = ("put the sdist or clone outside the campaign, on a filesystem every node mounts, and "
           "plan again (or pass --source sdist)")
    if not isinstance(source, str) or not source.startswith("/"):
        raise ConfigError(f"--source {source!r} is not auto, sdist or an absolute path", fix)
    if _in_campaign(source, root):
        raise ConfigError(f"--source {source} is in the campaign {root}: the build jobs would "
                          "fetch vLLM from a folder whoever can write the campaign may change",
                          fix)
    if os.path.exists(source) and not (os.path.isfile(source) or os.path.isdir(source)):
        # /dev/null, a FIFO or a socket was planned, and the prepare job said it "is not there
        # (as the jobs see the filesystem)" (issue 41, the thirty-first hostile pass)
        from ..workspace.confine import what_is

        raise ConfigError(f"--source {source} is {what_is(Path(source))}, neither a vLLM "
                          "sdist file nor a folder", "plan the campaign with the sdist's "
                          "path or a clone's folder (on a filesystem every node mounts), or "
                          "--source sdist")
    return source


def _in_campaign(path: str, root: str) -> bool:
    """Whether the absolute ``path`` is the campaign ``root`` or in it: as typed (normalised),
    through links, or by identity (a bind mount: ``mounts.within``), or reached through a
    link that lies in the campaign (``job_env``'s rule for passed values): ``--python ~/py/...``
    with ``~/py`` the user's link to ``<campaign>/venv``, itself a link to the environment,
    resolved outside and was sent; the campaign's writer then pointed ``venv`` at its own
    folder, and every job ran its ``bin/python`` (issue 41, the twenty-seventh hostile pass)."""
    from ..workspace.mounts import within
    from .job_env import reaches_campaign

    real = os.path.realpath(path)
    return any(where == root or where.startswith(root.rstrip("/") + "/")
               for where in (posixpath.normpath(path), real)) or within(Path(real), Path(root)) \
        or reaches_campaign(path, Path(root))


def check_python(py: str) -> str:
    """``py`` when it names the same interpreter on a node as here: an absolute path to an
    executable file, reached through no link or folder in ``/proc`` (nor ``/dev/fd``,
    ``/dev/stdin``, which lead there). A name there means this process, or a pid, here and
    another on the node: ``--python /proc/self/exe`` passed (it is the kit's Python here) and
    every job ran its own bash as its "python", which said only "kvprefetch: Is a directory"
    (issue 41, the thirty-first hostile pass)."""
    from .job_env import link_folders

    # a file: a folder passes os.access(X_OK), and --python /tmp was planned, every job then
    # failing on the node with "Is a directory" (issue 41, the twenty-second hostile pass)
    if not os.path.isabs(py) or not os.path.isfile(py) or not os.access(py, os.X_OK):
        raise ConfigError(f"--python {py} is not an absolute path to an executable",
                          "pass the absolute path of the interpreter the jobs should run")
    if any(f == "/proc" or f.startswith("/proc/") or _in_procfs(f)
           for f in (posixpath.normpath(py), *link_folders(py))):
        raise ConfigError(f"--python {py} is reached through /proc (or a mount of it), where a "
                          "name means this "
                          "process (or a process id) here and another program in the job (its "
                          "own shell for /proc/self/exe)",
                          "pass the interpreter's own path (what `python -c 'import sys; "
                          "print(sys.executable)'` prints), then plan again")
    return py


def _in_procfs(folder: str) -> bool:
    """Whether ``folder`` is in a proc file system mounted elsewhere than ``/proc`` (a bind
    mount of it, or a second ``mount -t proc``): its ``self`` names this process. ``--python
    /mnt/proc/self/exe``, with ``/mnt/proc`` a bind mount of ``/proc``, passed the check by
    name and every job ran its own bash (issue 41, the thirty-second hostile pass)."""
    here = str(os.getpid())
    while True:
        try:
            if os.readlink(os.path.join(folder, "self")) == here:
                return True
        except (OSError, ValueError):
            pass
        up = os.path.dirname(folder)
        if up == folder:
            return False
        folder = up


def check_program_outside(what: str, path: str, root: str) -> str:
    """``path`` (the jobs' ``--python``, or the kit's checkout on their ``PYTHONPATH``) is not in
    the campaign ``root`` (by its name, through links, or a bind mount of it): every job runs
    it, and whoever can write the campaign could replace it. ``--source`` in the campaign was
    refused, and ``--python CAMPAIGN/cache/py`` (or a link to one there) was planned and sent,
    every job running that interpreter (issue 41, the twenty-fourth hostile pass)."""
    if _in_campaign(path, root):
        raise ConfigError(f"{what} {path} is in the campaign {root} (or reached through a link "
                          "in it): every job would run it, "
                          "from a folder whoever can write the campaign may change",
                          "pass a --python outside the campaign folder (e.g. the environment's "
                          "own), then plan again" if what == "--python" else
                          "run kvprefetch from a checkout outside the campaign folder, then "
                          "plan again")
    return path


def scratch_variables(scratch: str) -> list[str]:
    """The names of the environment variables a ``--scratch`` expands (``$NAME``,
    ``${NAME}``), in order, each once."""
    names = [m.group(0).strip("${}") for m in SCRATCH_VARIABLE.finditer(scratch)]
    return list(dict.fromkeys(names))


MAX_BATCHES = 1000


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
    # after the type checks: set() of a list in the record would be a TypeError
    if len(batches) > MAX_BATCHES or len(set(batches)) != len(batches):
        # one array task each, and `slurm status` lists each: a campaign.json forged with its
        # batch list and the bench job's array both 100,000 long (the job list the plan gives,
        # so the seventeenth pass's check took it) had status run for 111 s, a million for
        # about 20 minutes (issue 41, the eighteenth hostile pass); the plan drops duplicates
        raise ConfigError(f"{len(batches)} batch sizes ({len(set(batches))} different): a "
                          f"campaign benchmarks at most {MAX_BATCHES} batch sizes, each once "
                          "(one Slurm array task each; Slurm's default MaxArraySize is 1001)",
                          "pass fewer batch sizes, e.g. --batch 1,8,32,64,128; a campaign.json "
                          "with more was edited: plan the campaign again")


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


def check_task_shapes(contexts: Sequence[str], presets: Sequence[str]) -> None:
    """Each bench task times its batch size at every preset and context: more shapes than a
    bench run plans (``matrix.MAX_SHAPES``) would have every task refuse on the cluster, after
    its wait in the queue, so the plan refuses them (issue 41, the twentieth hostile pass). After
    ``check_contexts`` and ``check_presets``: the values are sizes and presets."""
    from ..bench.matrix import DEFAULT_CONTEXTS, DEFAULT_PRESETS, check_shape_count, parse_size

    sizes = {parse_size(c) for c in contexts} or set(DEFAULT_CONTEXTS)
    check_shape_count(len(sizes) * len(presets or DEFAULT_PRESETS),
                      "each bench task's presets and contexts")


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


# ``slurm status --wait --timeout``: seconds, 0 (ask once) to a year. NaN passed every
# comparison, so the wait never gave up; infinity the same (issue 41, the tenth hostile pass).
WAIT_TIMEOUT = Bound("--timeout", 0, 366 * 86400)


def path_left_out(path: str, campaign: str) -> list[str]:
    """The entries of the planning shell's ``path`` that the jobs leave out (``job_path``)."""
    root = _normal(campaign)
    return [e for e in path.split(":")
            if not e.startswith("/") or (_normal(e) + "/").startswith(root + "/")]


def _normal(path: str) -> str:
    """``path`` normalized, its leading slashes one: normpath keeps two (POSIX leaves ``//``
    to the system), so ``//campaign/bin`` passed the check while naming the campaign's bin/
    on Linux (issue 41, the eighteenth hostile pass)."""
    return posixpath.normpath("/" + path.lstrip("/"))


def job_path(path: str, campaign: str) -> str:
    """The PATH the jobs run with: the planning shell's, less its entries that are not absolute
    (empty, ``.``, ``bin``) or are in the campaign. Each job runs in the campaign folder, so
    such an entry had every program a job looks up (``hostname``, ``dd``, ``mktemp``, git,
    nvcc) found first in the campaign, where whoever can write it could put their own, run
    as the user (issue 41, the seventeenth hostile pass: a careless ``PATH=$PATH:`` has an
    empty entry, the current folder)."""
    dropped = set(path_left_out(path, campaign))
    kept = [e for e in path.split(":") if e not in dropped]
    return ":".join(kept) or "/usr/bin:/bin"
