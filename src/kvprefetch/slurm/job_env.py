"""What a campaign job's environment holds: an allow-list. ``slurm submit`` has sbatch pass on
only the names in ``PASSED`` (``sbatch --export=<names>``; Slurm adds its own ``SLURM_*``), each
checked here first, and every job script starts its programs from those names alone
(``keep_only_sh``: the script runs itself again under ``env -i``), so nothing else the
submitting shell or the node holds reaches the kit, Python, git, pip, nvcc or the compilers.

Why a list of what to pass, not of what to refuse: sbatch's default, ``--export=ALL``, handed
every job the whole submitting shell, and passes 18 to 21 of issue 41's hostile testing each
found more variables that had a job load or run code from the campaign, or write through a
link in it: ``TMPDIR``, ``PATH``, ``LD_LIBRARY_PATH``, ``CUDA_HOME``, then Python's
(``PYTHONHOME``, ``PYTHONPYCACHEPREFIX``, ``PYTHONUSERBASE``, ``PYTHONINSPECT``), the loader's
(``LD_PRELOAD``, ``LD_AUDIT``), the compilers' (``COMPILER_PATH``, ``CPATH``,
``GCC_EXEC_PREFIX``, ``NVCC_CCBIN``), pip's (``PIP_LOG``) and git's (``GIT_TRACE``). A list of
what to refuse is never finished; a list of what a job needs is short, and each name on it is
checked for what it can do."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ..errors import ConfigError

_LOCALE = ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "LC_TIME", "LC_COLLATE",
           "LC_MONETARY", "LC_MESSAGES", "LC_PAPER", "LC_NAME", "LC_ADDRESS", "LC_TELEPHONE",
           "LC_MEASUREMENT", "LC_IDENTIFICATION")
# Folders and files a job's programs read, whose values must not lead into the campaign: the
# kit's private folders (TMPDIR; a job's HOME is its own), the CUDA toolkit (CUDA_HOME,
# CUDA_PATH), the host compiler (CXX), the trust anchors and client certificates of the
# prepare job's download (pip's, requests', OpenSSL's). The job checks the folders again as
# the node sees them (shell.TEMP_OUTSIDE_SH), and CXX as the program it resolves to.
_FOLDERS = ("TMPDIR", "CUDA_HOME", "CUDA_PATH", "SLURM_TMPDIR")
_FILES = ("CXX", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
          "PIP_CERT", "PIP_CLIENT_CERT")
# The names a job gets from the submitting shell when set there, and only these: who runs it
# (USER, LOGNAME), how it speaks (locale, TZ), where the CUDA toolkit, its libraries and the
# host compiler are (the build job), and how the prepare job reaches the package index. Not
# PATH: every script sets its own, the planning shell's less its entries in the campaign
# (values.job_path). Nor HOME: each job makes its own (shell.PRIVATE_HOME_SH).
PASSED = ("USER", "LOGNAME", *_LOCALE, "TZ",
          "TMPDIR", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CXX",
          "http_proxy", "https_proxy", "no_proxy", "all_proxy",
          "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
          "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_DEFAULT_TIMEOUT",
          "PIP_RETRIES", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
          "PIP_CERT", "PIP_CLIENT_CERT")
# What slurmd itself sets for a job, kept as well: the GPUs Slurm gave it (gres), and the node.
# With SLURM_* (Slurm's own, passed on whatever --export says) that is all a job keeps.
FROM_SLURMD = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GPU_DEVICE_ORDINAL",
               "NVIDIA_VISIBLE_DEVICES", "SLURMD_NODENAME")

# A build job's --scratch may name variables (`/scratch/$USER`), which sbatch passes on too.
# They reach only the job's first shell, which reads their values for the scratch and drops
# them (keep_only_sh), so no program sees them; but bash and the loader read a few names as
# that shell starts, before its first line, and a scratch naming one would pass it on: those
# are refused (the loader's LD_* and glibc's tunables, bash's start-up files, options and
# trace prompt, the locale's code and data folders).
_READ_AS_BASH_STARTS = re.compile(
    r"(LD_|GLIBC_|MALLOC_|BASH).*|ENV|SHELLOPTS|PS4|POSIXLY_CORRECT|LOCPATH|GCONV_PATH|NLSPATH")
# bash's own: set by the job's shell itself (the folder it is in), never passed
SHELLS_OWN = ("PWD", "OLDPWD")
SCRATCH_PREFIX = "KVPREFETCH_SCRATCH_"


# sbatch reads a name ALL in --export's list, in any case, as "and the whole environment"
# (sbatch.c's _env_merge_filter): a --scratch '$ALL/k' (or '$all/k') put ALL in the list every
# job is sent with, and the whole submitting shell reached each job's first bash, none of it
# checked (issue 41, the twenty-second hostile pass); NONE and NIL are its other words there.
_SBATCH_EXPORT_WORDS = ("ALL", "NONE", "NIL")


def check_scratch_names(names: Iterable[str]) -> None:
    """Refuse a ``--scratch`` variable that bash or its loader reads as the job starts, or
    that sbatch's ``--export`` reads as a word of its own."""
    names = list(names)
    words = [n for n in names if n.upper() in _SBATCH_EXPORT_WORDS]
    if words:
        raise ConfigError(
            f"--scratch names ${words[0]}, which sbatch's --export list reads as its own word "
            "(ALL: pass the whole environment), not as a variable: every job would get all of "
            "this shell's variables, unchecked",
            "name the scratch folder without it (e.g. /scratch/$USER or node)")
    # the kit's own: the job's first shell reads the scratch's values with its own variables
    # (KVPREFETCH_V, KVPREFETCH_KEEP), and a KVPREFETCH_JOB_PID passed on is what tells it that
    # it has run itself again; `--scratch '$v/k'` (the loop's variable, as it was named) or
    # '$KEEP/k' read that variable, not the user's, and the job refused a relative "v/k" the
    # user never gave (issue 41, the twenty-third hostile pass)
    own = [n for n in names if n.startswith("KVPREFETCH_")]
    if own:
        raise ConfigError(
            f"--scratch names ${own[0]}, one of kvprefetch's own variables (the job sets or "
            "reads it itself), not a folder of yours",
            "name the scratch folder without it (e.g. /scratch/$USER or node)")
    bad = [n for n in names if _READ_AS_BASH_STARTS.fullmatch(n)]
    if bad:
        raise ConfigError(
            f"--scratch names ${bad[0]}, which the job's bash or its loader reads as it starts "
            "(before the script's first line): passed on for the scratch, it would act there",
            "name the scratch folder without it (e.g. /scratch/$USER or node)")


def sbatch_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment ``slurm submit`` runs sbatch in: the shell's, less every ``SBATCH_*``,
    which sbatch reads as options: ``SBATCH_ERROR``/``SBATCH_INPUT`` name files the job's
    stderr and stdin go to (a path in the campaign, through a link planted there, would have
    Slurm write or read where the link leads), ``SBATCH_CONTAINER`` a bundle the job runs in,
    ``SBATCH_OPEN_MODE``, ``SBATCH_CHDIR`` and the rest change what the plan asked for (issue
    41, the twenty-third hostile pass); the plan is the whole request. And less SLURM_UMASK,
    which sbatch sends in place of its own umask (the kit's, less world-write): 0000 had Slurm
    write each job's log 0666 and run the job under it (the twenty-fifth). PIP_INDEX_URL is
    the index this shell's pip names: a job's own HOME holds no pip settings."""
    from ..sources.download import configured_index_url

    env = {k: v for k, v in environ.items() if not k.startswith("SBATCH_") and k != "SLURM_UMASK"}
    return env | {"PIP_INDEX_URL": configured_index_url(env)}


def export_names(scratch_names: Sequence[str]) -> list[str]:
    """The names sbatch passes on to a campaign job: ``PASSED`` and the scratch's variables."""
    return list(dict.fromkeys(
        [*PASSED, *(n for n in scratch_names if n not in PASSED and n not in SHELLS_OWN)]))


def export_option(scratch_names: Sequence[str]) -> str:
    """sbatch's ``--export=`` of a campaign job (sbatch passes a name only when it is set, and
    Slurm's ``SLURM_*`` always)."""
    return "--export=" + ",".join(export_names(scratch_names))


def scratch_name(name: str) -> str:
    """The variable under which a job keeps the value of ``name`` that its --scratch names."""
    return name if name in SHELLS_OWN else SCRATCH_PREFIX + name


def keep_only_sh(scratch_names: Sequence[str]) -> tuple[str, ...]:
    """The script's first lines: run the script again, under ``env -i``, with ``SLURM_*``,
    ``PASSED``, ``FROM_SLURMD`` and the scratch's variables (as ``scratch_name``) alone. Bash
    itself and its loader have read their start-up variables by then; submit checked those
    (check_passed), and sbatch passed no others."""
    kept = "|".join(("SLURM_*", *PASSED, *FROM_SLURMD))
    keep_scratch = [n for n in dict.fromkeys(scratch_names) if n not in SHELLS_OWN]
    lines = [
        # The script runs itself again by its own name ($0), so it must be run as a file:
        # read from standard input (`bash < script`, `cat script | bash`) or sourced, $0 is
        # the shell's name, and `bash -- bash` ran a file named bash from the folder it was
        # started in, a campaign's included (issue 41, the twenty-second hostile pass); a
        # sourced one would have replaced the user's own shell
        'if [ "${BASH_SOURCE[0]-}" != "$0" ]; then',
        ('  echo "refusing to run: this kvprefetch job script was read from standard input or'
         ' sourced ($0 is not the script), and it must run itself again by its own file name.'
         ' To fix: run it as a file: kvprefetch slurm submit (sbatch), or bash <script>" >&2'),
        "  return 2 2>/dev/null || exit 2",
        "fi",
        'if [ "${KVPREFETCH_JOB_PID-}" != "$$" ]; then',
        "  KVPREFETCH_KEEP=()",
        "  for KVPREFETCH_V in $(compgen -e); do",
        (f"    case $KVPREFETCH_V in {kept})"
         ' KVPREFETCH_KEEP+=("$KVPREFETCH_V=${!KVPREFETCH_V}");; esac'),
        "  done",
    ]
    if keep_scratch:
        lines += [
            f"  for KVPREFETCH_V in {' '.join(keep_scratch)}; do",
            ('    if [ -n "${!KVPREFETCH_V+x}" ]; then'
             f' KVPREFETCH_KEEP+=("{SCRATCH_PREFIX}$KVPREFETCH_V=${{!KVPREFETCH_V}}"); fi'),
            "  done",
        ]
    # What is kept goes to env as its arguments, which share the kernel's limit (ARG_MAX, 2 MiB
    # on Linux) with the environment the exec passes on: with that whole environment passed
    # as well, one of over about 1 MiB (half the limit) had every job end "Argument list too
    # long", exit 2, where it ran before the allow-list (issue 41, the twenty-second hostile
    # pass). The variables and functions are kept, but no longer exported, so the exec
    # passes none of them but what is kept.
    # (set -f: a function's name may be a pattern, `*`, which would name the files in / here)
    lines += [
        "  set -f",
        '  for KVPREFETCH_V in $(compgen -e); do export -n -- "$KVPREFETCH_V"; done',
        ('  for KVPREFETCH_V in $(compgen -A function); do export -n -f -- "$KVPREFETCH_V";'
         ' done'),
        "  set +f",
    ]
    return (*lines,
            "  shopt -s execfail",
            ('  exec /usr/bin/env -i "${KVPREFETCH_KEEP[@]}" "KVPREFETCH_JOB_PID=$$" /bin/bash --'
             ' "$0" "$@"'),
            ('  echo "refusing to run: /usr/bin/env -i could not run this script again with only'
             ' the environment a kvprefetch job keeps (bash said why above). To fix: run the job'
             ' on a node with /usr/bin/env and /bin/bash, with fewer or smaller variables'
             ' kept (SLURM_*, job_env.PASSED) if the list was too long" >&2; exit 2'),
            "fi",
            "unset KVPREFETCH_JOB_PID KVPREFETCH_KEEP KVPREFETCH_V")


def passed(environ: Mapping[str, str], scratch_names: Sequence[str]) -> dict[str, str]:
    """What sbatch passes on of ``environ`` for a job (Slurm's ``SLURM_*`` aside)."""
    return {n: environ[n] for n in export_names(scratch_names) if n in environ}


def check_passed(environ: Mapping[str, str], campaign: Path,
                 scratch_names: Sequence[str] = ()) -> dict[str, str]:
    """Refuse to send a job whose environment (what sbatch passes of ``environ``) leads into
    the campaign ``campaign`` (a resolved path): a library or file its bash loads as it starts,
    a folder or file its programs read. Run by submit and resubmit, dry runs too, before any
    sbatch; returns the environment sbatch runs in (``sbatch_environ``)."""
    env = passed(environ, scratch_names)
    env |= {k: v for k, v in environ.items() if k == "SLURM_TMPDIR"}  # sbatch passes SLURM_*
    check_start_env(env, campaign)
    _check_cxx(env)
    _check_paths(env, campaign)
    _check_held(env, campaign)
    _check_locale(env)
    return sbatch_environ(environ)


# CXX is a shell fragment (make's and the build's ninja rule read it so: `ccache g++`), run by
# the shell ninja starts, with the kit's environment: `g++ -B$KVPREFETCH_CAMPAIGN` (or
# `$OLDPWD`: the job left the campaign for /) named no path, passed submit's check and the job's
# (which follow a CXX holding a `/`), and gcc ran a `cc1plus` planted in the campaign (issue 41,
# the twenty-third hostile pass); `cd -&&...` reaches it with no `$`. So a CXX is a program and
# plain words: no expansion, quoting, redirection or second command.
CXX_VALUE = re.compile(r"[A-Za-z0-9_.,+=:@%/ -]+")


def _check_cxx(env: Mapping[str, str]) -> None:
    if env.get("CXX") and not CXX_VALUE.fullmatch(env["CXX"]):
        raise ConfigError(
            f"CXX={env['CXX']!r} in this shell is more than a compiler and its plain options "
            "(it holds a $, a quote, a redirection or a second command): the build runs it "
            "through a shell, which would expand it there, in the campaign too",
            "set CXX to a compiler and plain options (e.g. g++, or ccache g++), or unset it, "
            "then submit again")


# glibc reads TZ as a file too (tzset, at every Python's start): the value less a leading ':',
# a relative one under the zone folder (TZDIR is not passed), `..` and all. A zone file in the
# campaign is the campaign's writer's to replace: a FIFO there had every job's interpreter
# block in its first instruction until Slurm's time limit (issue 41, the twenty-second hostile
# pass: TZ=:<campaign>/zone, the merge job, killed by `timeout` after 15 s, exit 143).
_ZONE_FOLDER = "/usr/share/zoneinfo"


def _tz_file(value: str) -> str:
    """The file glibc reads for ``TZ=value``."""
    value = value.removeprefix(":")
    return value if value.startswith("/") else os.path.join(_ZONE_FOLDER, value)


def _paths(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """``(name, path)`` of each folder or file a passed value names. OpenSSL reads
    SSL_CERT_DIR as a ':'-separated list of folders: taken whole, `/etc/ssl/certs:<campaign>`
    named no folder and passed (issue 41, the twenty-second hostile pass)."""
    found = []
    for n in (*_FOLDERS, *_FILES):
        v = env.get(n)
        if v and (n != "CXX" or "/" in v):
            found += [(n, e) for e in (v.split(":") if n == "SSL_CERT_DIR" else [v]) if e]
    if env.get("TZ"):
        found.append(("TZ", _tz_file(env["TZ"])))
    return found


def reaches_campaign(entry: str, campaign: Path) -> bool:
    """Whether ``entry`` (a relative one read from ``/``, where every job starts: ``sbatch
    --chdir=/``) is in the campaign, by path, through links, or by identity (a bind mount), or
    is reached through a link that lies in the campaign: the folder it names now may be
    outside, but whoever writes the campaign can point that link elsewhere before the job
    runs. ``LD_LIBRARY_PATH=~/l`` with ``~/l`` the user's link to ``<campaign>/lnk``, itself a
    link to /usr/lib, resolved outside and passed; the campaign's writer then pointed ``lnk``
    at its own folder, and every job's bash loaded a ``libtinfo.so.6`` planted there before
    its first line (issue 41, the twenty-third hostile pass; the twentieth pass's attack on
    PATH, which the job pins, on what the job's bash reads as it starts)."""
    from ..workspace.mounts import within  # the one "at or below" check

    path = os.path.join("/", entry)
    return any(within(Path(f), campaign) for f in link_folders(path)) \
        or within(Path(os.path.realpath(path)), campaign)


def link_folders(path: str) -> list[str]:
    """The folder (resolved, no link on it) of each link met while resolving ``path`` one part
    at a time, as the kernel does (at most 40 links, its own limit, ELOOP)."""
    found: list[str] = []
    done, todo = "/", [p for p in reversed(path.split("/")) if p]
    while todo:
        part = todo.pop()
        if part == ".":
            continue
        if part == "..":
            done = os.path.dirname(done)
            continue
        nxt = os.path.join(done, part)
        if not os.path.islink(nxt):
            done = nxt
            continue
        found.append(done)
        try:
            target = os.readlink(nxt)
        except OSError:
            break
        if len(found) > 40:
            break
        if target.startswith("/"):
            done = "/"
        todo.extend(p for p in reversed(target.split("/")) if p)
    return found


def _check_paths(env: Mapping[str, str], campaign: Path) -> None:
    found = list(dict.fromkeys(n for n, e in _paths(env) if reaches_campaign(e, campaign)))
    if found:
        named = ", ".join(f"{n}={env[n]!r}" for n in found)
        raise ConfigError(
            f"{named} in this shell is in the campaign {campaign} (or "
            "reached through a link in it): sbatch passes it on, and the "
            "job's programs would read (or run) what whoever can write the campaign puts there",
            f"point {' '.join(found)} outside the campaign (or unset it) in this shell, then "
            "submit again")


# What the job's programs read or run in or below a passed toolkit folder: CUDA_HOME=~/cu with
# the campaign at ~/cu/bin ran its nvcc (issue 41, the twenty-fourth hostile pass).
TOOLKIT_FOLDERS = ("bin", "nvvm", "include", "targets", "lib64", "lib")


def _check_held(env: Mapping[str, str], campaign: Path) -> None:
    from ..workspace.mounts import within

    for n in (n for n in ("CUDA_HOME", "CUDA_PATH") if env.get(n)):
        v, top = env[n], os.path.join("/", env[n])
        if within(campaign, Path(os.path.realpath(top))) or any(
                reaches_campaign(f, campaign) or within(campaign, Path(os.path.realpath(f)))
                for f in (os.path.join(top, f) for f in TOOLKIT_FOLDERS)):
            raise ConfigError(
                f"{n}={v!r} in this shell holds the campaign {campaign} where the job's programs"
                f" read or run from (in or below one of {', '.join(TOOLKIT_FOLDERS)}, or anywhere"
                " in the toolkit): whoever can write the campaign could put their own there",
                f"point {n} at a folder that holds the campaign in none of those (or unset {n}),"
                " then submit again")


# A locale is a name (`en_US.UTF-8`); glibc also reads one given as a path, from that folder
_LOCALE_VALUE = re.compile(r"[A-Za-z0-9_.@:+=-]*")


def _check_locale(env: Mapping[str, str]) -> None:
    bad = [n for n in _LOCALE if n in env and not _LOCALE_VALUE.fullmatch(env[n])]
    if bad:
        raise ConfigError(
            f"{bad[0]}={env[bad[0]]!r} in this shell is not a locale's name (glibc reads a "
            "locale given as a path from that folder, in every program of the job)",
            f"set {bad[0]} to a locale name such as C.UTF-8 (or unset it), then submit again")


# What the job's bash and its dynamic loader read before the script's first line runs, from
# the environment sbatch passes on: no line of the script can undo them. Of these only
# LD_LIBRARY_PATH is passed (a scratch cannot name the others: check_scratch_names); each is
# checked all the same, in what is passed. LD_PRELOAD also splits on spaces (ld.so(8)). An
# entry in the campaign had bash load a library or run a file there, whoever can write the
# campaign planted it (issue 41, the twentieth hostile pass: bash loaded a planted
# libtinfo.so.6 from an LD_LIBRARY_PATH entry into the campaign).
# glibc's loader splits LD_LIBRARY_PATH on ';' as well as ':' (dl-load.c, ":;"): split on ':'
# alone, "/opt/x;<campaign>/lib" passed the check and bash loaded libtinfo from the campaign
# (issue 41, the twenty-first hostile pass). Bash expands BASH_ENV's and ENV's parameters before
# it reads the file, so ``$CAMP/rc`` names the campaign through a variable of the same shell.
START_ENV = {"LD_PRELOAD": r"[: ]", "LD_AUDIT": ":", "LD_LIBRARY_PATH": "[:;]",
             "BASH_ENV": None, "ENV": None}
_EXPANDED = ("BASH_ENV", "ENV")
_PARAMETER = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def _expanded(value: str, environ: Mapping[str, str]) -> str:
    """``value`` with each ``$NAME``/``${NAME}`` replaced as the job's bash would, from the
    environment sbatch passes on (unset: empty)."""
    return _PARAMETER.sub(lambda m: environ.get(m.group(1) or m.group(2), ""), value)


# The loader's dynamic string tokens (ld.so(8)): it expands $ORIGIN, $LIB and $PLATFORM (also
# braced) in LD_LIBRARY_PATH, LD_PRELOAD and LD_AUDIT before it opens anything, so
# "/opt/x/$LIB/../../../<campaign>/lib" searched the campaign while the check, reading $LIB as one
# folder's name, resolved it two folders higher (issue 41, the twenty-first hostile pass). Each
# entry holding one is checked under every value the token takes on the machines a job runs on.
_DST = re.compile(r"\$(?:\{(ORIGIN|LIB|PLATFORM)\}|(ORIGIN|LIB|PLATFORM)(?![A-Za-z0-9_]))")


def _dst_values() -> dict[str, list[str]]:
    import sysconfig

    machine = os.uname().machine
    multiarch = sysconfig.get_config_var("MULTIARCH") or f"{machine}-linux-gnu"
    return {"ORIGIN": ["/bin", "/usr/bin", os.path.dirname(os.path.realpath("/bin/bash"))],
            "LIB": ["lib", "lib64", "lib32", "libx32", f"lib/{multiarch}", f"lib64/{multiarch}"],
            "PLATFORM": [machine, "haswell", "xeon_phi"]}


def _loader_expansions(entry: str) -> list[str]:
    """``entry`` with each of the loader's tokens replaced by each value it may take."""
    if not _DST.search(entry):
        return [entry]
    values = _dst_values()
    out = [entry]
    while any(_DST.search(e) for e in out) and len(out) < 4096:
        nxt = []
        for e in out:
            m = _DST.search(e)
            if m is None:
                nxt.append(e)
                continue
            for v in values[m.group(1) or m.group(2)]:
                nxt.append(e[:m.start()] + v + e[m.end():])
        out = nxt
    return out


# glibc's loader looks for a library in subfolders of each LD_LIBRARY_PATH entry first:
# `glibc-hwcaps/<level>`, and up to 2.36 `tls/`, the platform's (`x86_64/`, `haswell/`) and
# combinations (`tls/x86_64/x86_64/`). With the campaign at `~/lib/x86_64` (or such a subfolder
# a link into it), `LD_LIBRARY_PATH=~/lib` passed submit and the job, and the merge job's bash
# loaded a `libtinfo.so.6` planted in the campaign (issue 41, the twenty-fourth hostile pass).
# The first parts of those subfolders (and the machine's name); what lies under them, two more
# levels at most, is checked as found.
LOADER_SUBFOLDERS = ("glibc-hwcaps", "tls", "x86_64", "haswell", "xeon_phi", "avx512_1",
                     "i686", "aarch64")


def loader_subfolders(entry: str) -> list[str]:
    """What is under library folder ``entry`` now, where the loader looks (two levels deep)."""
    base = os.path.join("/", entry)
    found: list[str] = []
    for first in dict.fromkeys((*LOADER_SUBFOLDERS, os.uname().machine)):
        level = [os.path.join(base, first)]
        for _ in range(3):
            level = [p for p in level if os.path.lexists(p)]
            found += level
            nxt: list[str] = []
            for p in level:
                if os.path.isdir(p):  # through a link too: the loader follows it
                    with contextlib.suppress(OSError):
                        nxt += sorted(os.path.join(p, n) for n in os.listdir(p))
            level = nxt[:256]
    return found


def start_env_in(environ: Mapping[str, str], campaign: Path) -> list[tuple[str, str]]:
    """``(name, entry)`` of each ``START_ENV`` entry that is in the campaign ``campaign`` (a
    resolved path), by path, through links, or by device and inode (a bind mount). A relative
    entry is read from ``/``, where every job starts (``sbatch --chdir=/``)."""
    todo = []
    checks = 0  # counted before any is checked: a refusal comes at once
    for name, split in START_ENV.items():
        value = environ.get(name, "")
        if name in _EXPANDED:
            value = _expanded(value, environ)
        for entry in (re.split(split, value) if split else [value]):
            if not entry:
                continue
            spelled = [entry] if name in _EXPANDED else list(
                dict.fromkeys(_loader_expansions(entry)))
            if name == "LD_LIBRARY_PATH":
                spelled = [*spelled, *(s for e in spelled for s in loader_subfolders(e))]
            checks += len(spelled)
            if checks > MAX_SPELLINGS:
                _too_many_spellings(name)
            todo.append((name, entry, spelled))
    return [(name, entry) for name, entry, spelled in todo
            if any(reaches_campaign(e, campaign) for e in spelled)]


# Each spelling is a check of a path (links followed, the mount table read): about a
# millisecond. Entries of five loader tokens each (`/$LIB/$LIB/$LIB/$LIB/$LIB/x`, 4,096 spellings
# apiece) had a dry run of submit take 38 s for 5 entries (145 characters), minutes for more
# (issue 41, the twenty-third hostile pass). A real value takes a few dozen.
MAX_SPELLINGS = 20_000


def _too_many_spellings(name: str) -> None:
    raise ConfigError(
        f"{name} in this shell holds more than {MAX_SPELLINGS} folders to check once the "
        "loader's $ORIGIN, $LIB and $PLATFORM are spelled out (many entries, or entries with "
        "several of those tokens)",
        f"shorten {name} (fewer entries, at most one loader token each), or unset it, then "
        "submit again")


def check_start_env(environ: Mapping[str, str], campaign: Path) -> None:
    """Refuse to send a job whose bash would load code from the campaign at its start
    (``environ``: what sbatch passes on)."""
    found = start_env_in(environ, campaign)
    if found:
        named = ", ".join(f"{name}={entry!r}" for name, entry in found[:5])
        raise ConfigError(
            f"{named} in this shell is in the campaign {campaign} (or "
            "reached through a link in it, or a library folder with the campaign in a "
            "subfolder the loader searches: glibc-hwcaps/*, tls, x86_64, ...): sbatch passes "
            "it on, and the job's bash would load it before the script's first line (no line "
            "of the script can leave it out), running whatever is there as you",
            f"unset {' '.join(sorted({n for n, _ in found}))} (or point it outside the "
            "campaign) in this shell, then submit again")
