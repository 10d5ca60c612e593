"""The bash every job script of a campaign carries, as lines ``scripts.render_script`` puts
into each script: the check that a build's scratch is outside the campaign
(``SCRATCH_OUTSIDE_SH``), the step out of the campaign before the kit runs
(``leave_campaign_sh``), the search paths kept to entries outside it (``KEEP_OUTSIDE_SH``),
the check of Slurm's job ids (``CHECK_JOB_IDS_SH``) and the one way a job writes a file in the
campaign (``WRITE_NEW_SH``). Each is written for an attacker who can write the campaign folder
and nothing else (the threat model in docs/reliability.md); the comment above each says which
attack shaped it. Pure text: nothing here runs."""

from __future__ import annotations

import shlex

from .campaign import JOB_ENV
from .job_env import LOADER_SUBFOLDERS, TOOLKIT_FOLDERS

# A build job's scratch folder must be outside the campaign (values.check_scratch says why) as
# the job's shell expands it: `$PWD/s` (the job starts in the campaign), a relative `$VAR` (a
# relative folder is in the campaign) or a node TMPDIR set to a folder in the campaign passed
# the plan's check of the text and put the scratch in the campaign (issue 41, the fourteenth
# hostile pass). Checked where the job runs, by the folder the kernel resolves, before anything
# is made in it; the job's working folder is the campaign's root here.
_SCRATCH_INSIDE_MSG = (
    'echo "refusing to build in $SCRATCH_BASE: it is in the campaign $CAMPAIGN_REAL, where'
    ' whoever can write the campaign could swap it for a link. To fix: plan the campaign again'
    ' with --scratch node or a folder of yours outside it (and a TMPDIR outside it; a node'
    ' scratch is SLURM_TMPDIR (where set), which sbatch passes on from the shell you submit'
    ' from: unset it there)" >&2;'
    ' exit 2')
SCRATCH_OUTSIDE_SH = (
    'case "$SCRATCH_BASE" in /*) ;; *)',
    ('  echo "refusing to build in $SCRATCH_BASE: a scratch folder must be absolute (a relative'
     ' one is in the campaign). To fix: submit with the variables --scratch names absolute (node:'
     ' SLURM_TMPDIR where set, else TMPDIR), or plan with a folder of yours" >&2; exit 2;; esac'),
    # A control character can come only from a variable's value (the plan refuses one typed):
    # `$(cd ... && pwd -P)` below drops a trailing newline, so `/tmp/$IFS` was checked and made
    # as one folder and used as another, then "something is already there" sent the user to
    # move away what was never there (issue 41, the twenty-first hostile pass)
    'case "$SCRATCH_BASE" in *[[:cntrl:]]*)',
    ('  printf "refusing to build in %q: a variable it names holds a control character (a'
     ' newline, a tab), which no folder kvprefetch builds in may hold. To fix: plan the campaign'
     ' again with --scratch node or a folder whose variables hold plain paths\\n"'
     ' "$SCRATCH_BASE" >&2; exit 2;; esac'),
    # In the campaign by any path: a folder on the way, as the path is spelled (`..` and `.`
    # taken as text) or as the kernel resolves it, that is the campaign's own folder (the same
    # device and inode: the campaign by its name, through a link, or bind-mounted elsewhere).
    # The spelled path counts: `$PWD/scr` with `scr` a link in the campaign to a folder outside
    # resolved outside and passed, and the job then worked through that link by name, which
    # whoever writes the campaign could point elsewhere while it ran; `mkdir -p` made the
    # missing folders of `$PWD/scr/sub` behind the link before any check (issue 41, the
    # fifteenth hostile pass). So the spelled path is checked before anything is made.
    # Every link met on the way is followed too, one hop at a time, and its target's folders
    # checked the same way: a scratch of the user's whose own link points at a link in the
    # campaign (`~/scr` -> `camp/lnk`) resolved outside, no folder of its spelling was the
    # campaign, and the job built wherever `camp/lnk` (whoever writes the campaign) sent it
    # (issue 41, left open by the fifteenth pass). Each folder that holds a link the kernel
    # would follow is the resolved form of some prefix of a path checked here. Past 40 links
    # (the kernel's own limit, ELOOP) the path cannot be made a folder, which mkdir then says.
    # Each path is checked once per call (again only from fewer hops, which can reach
    # further): the walk that first met it checks, or has checked, every folder above it.
    # (A path of n links took 2^n checks, hours for /proc/self/root repeated: the 16th pass.)
    # At most 2000 steps in all, each a fork or two: 40 links of 4096 characters, `l1/../l1/..`,
    # kept a job over 10 minutes before its refusal (the 19th). A real scratch takes a few dozen.
    ('CAMPAIGN_REAL=$(env pwd -P); CAMPAIGN_ID=$(stat -c %d:%i -- .); declare -A SEEN=();'
     ' STEPS=0'),
    "in_campaign() {",
    '  local d=$1 hops=${2:-0} t',
    '  if [ -z "${2:-}" ]; then SEEN=(); STEPS=0; fi',
    '  while :; do',
    '    STEPS=$((STEPS + 1))',
    '    if [ "$STEPS" -gt 2000 ]; then',
    ('      echo "following the links on the way to $SCRATCH_BASE took more than 2000 steps;'
     ' a scratch folder whose path kvprefetch cannot follow to its end is refused" >&2'),
    '      return 0',
    '    fi',
    '    if [ "${SEEN["$d"]:-41}" -le "$hops" ]; then return 1; fi',
    '    SEEN["$d"]=$hops',
    '    if [ "$(stat -L -c %d:%i -- "$d" 2>/dev/null)" = "$CAMPAIGN_ID" ]; then return 0; fi',
    '    if [ -L "$d" ]; then',
    '      if [ "$hops" -ge 40 ]; then return 1; fi',
    '      t=$(readlink -- "$d") || return 0',
    '      case "$t" in /*) ;; *) t=$(dirname -- "$d")/$t;; esac',
    '      if in_campaign "$t" $((hops + 1)); then return 0; fi',
    '    fi',
    '    case "$d" in /|.|//) return 1;; esac; d=$(dirname -- "$d")',
    '  done',
    "}",
    f'if in_campaign "$SCRATCH_BASE"; then {_SCRATCH_INSIDE_MSG}; fi',
    # a file, FIFO or unwritable folder there: mkdir's "File exists" alone said nothing the
    # user could act on (the fourteenth hostile pass)
    ('mkdir -p -- "$SCRATCH_BASE" || { echo "refusing to build in $SCRATCH_BASE: it cannot be'
     ' made a folder (something other than a folder is there, or it is not writable). To fix:'
     ' submit with the variables --scratch names writable folders (node: SLURM_TMPDIR where set,'
     ' else TMPDIR), or plan with --scratch a folder of yours" >&2; exit 2; }'),
    'SCRATCH_REAL=$(cd -P -- "$SCRATCH_BASE" && env pwd -P)',
    f'if in_campaign "$SCRATCH_REAL"; then {_SCRATCH_INSIDE_MSG}; fi',
    # from here on by the resolved path, whose folders were all outside the campaign when
    # checked: nothing on it is a name whoever writes the campaign can change
    'SCRATCH_BASE=$SCRATCH_REAL',
)


# Before the job runs the kit, it leaves the campaign folder for the root folder: `python -m`
# puts its working folder first on sys.path, before PYTHONPATH and the standard library, so a
# `kvprefetch/` (or `json.py`, ...) that whoever can write the campaign put there was imported
# in place of the kit and ran as the user in every job (issue 41, the seventeenth hostile pass).
# Every path the kit is given here is absolute.
# Not `/`: a campaign planned in `/` itself (`/kvprefetch`, `/click`, or bind-mounted there, as
# a container does) is a folder of it, and the job's `python -m kvprefetch` imported the
# campaign's `__init__.py` in place of the kit, in every job (issue 41, the twenty-fourth
# hostile pass, in a mount namespace with the campaign at /kvprefetch). The kit's own folder
# is the one PYTHONPATH already puts first: running there shows Python nothing more.
def leave_campaign_sh(kit_root: str) -> str:
    """The line that leaves the campaign for the kit's folder before the kit runs."""
    return f"cd -- {shlex.quote(kit_root)}  # python -m imports from its working folder first"


# The search paths a job inherits or is given, kept to their entries that are absolute and
# lie outside the campaign as the node sees them, before the job runs any program: the job
# runs in the campaign folder (and write_new in its logs/), so an empty or relative entry is
# that folder, and an entry reaching it through a link or `//` (which `slurm plan`'s string
# check did not see) is in it too. A careless `LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/cuda/lib64`
# (an empty first entry), inherited through sbatch's --export=ALL (before job_env's
# allow-list; LD_LIBRARY_PATH is still passed), had `mv` load a libacl.so.1 planted in logs/
# and `PATH=//campaign/bin:...` or a link to the campaign had a planted `hostname` run, each
# as the user (issue 41, the eighteenth hostile pass). Builtins only:
# nothing may be looked up before the paths are kept.
# A folder on the way is compared with the campaign by device and inode too (`-ef`, bash's
# own test): a TMPDIR in a bind mount of the campaign elsewhere (a second mount point, a
# container's view) resolved to a path outside it, passed, and a watcher swapping the build
# job's private folders there for links had the whole sdist unpacked outside (issue 41, the
# twentieth hostile pass; the nineteenth's own attack through another name). A folder that
# resolves into /proc is a per-process view (`/proc/self/cwd` is whatever folder the program
# runs in, the campaign and its logs/ for the job's `stat`, `dd` and `mv`), so an entry
# spelled through it reaches the campaign as the job runs: `LD_LIBRARY_PATH=/proc/self/cwd`
# had `mv` load a libacl.so.1 planted in logs/ (the same pass).
# An entry kept is pinned to the folder it names now, by a path with no link on it: one through
# the user's link to a link in the campaign (`~/l` -> `<campaign>/lnk` -> a folder outside)
# resolved outside and passed, and the campaign's writer then pointed `lnk` at its own bin/:
# the job's `dirname`, `mktemp`, `dd` and `mv` ran from there (the same pass; the fifteenth
# pass's attack on the scratch, on the search paths).
MAX_PARTS = 256
KEEP_OUTSIDE_SH = (
    "too_deep() {  # $1 has more than MAX_PARTS parts (folders on its way)",
    r'  local parts=${1//[!\/]/}',
    f'  [ "${{#parts}}" -gt {MAX_PARTS} ]',
    "}",
    "reaches_campaign() {  # $1 or a folder on its way resolves into the campaign folder",
    # Each resolved folder is compared once (`checked`), a part that is no folder costs no
    # subshell (`-d` first), and a path of more than MAX_PARTS parts counts as reaching the
    # campaign (callers that can say why check it first: too_deep): a TMPDIR of 2,035 real
    # folders (4 kB, under PATH_MAX) resolved each of its 2,035 prefixes (bash's `cd -P`, a
    # third of a second each at that depth) and compared every folder above each again, and
    # the job spent over 10 minutes here before its first program (issue 41, the
    # twenty-third hostile pass). A real path has a few dozen parts.
    '  local p=$1 r',
    '  local -A checked=()',
    '  if too_deep "$p"; then return 0; fi',
    '  while :; do',
    '    if [ -d "$p" ] && r=$(cd -P -- "$p" 2>/dev/null && pwd -P); then',
    '      while [ "${r#//}" != "$r" ]; do r=${r#/}; done',
    '      case "$r/" in "$CAMPAIGN_AT"/*|/proc/*) return 0;; esac',
    '      local whole=$r',
    '      while [ -n "$r" ] && [ -z "${checked["$r"]-}" ]; do',
    '        checked["$r"]=1',
    '        if [ "$r" -ef "$CAMPAIGN_AT" ]; then return 0; fi',
    '        r=${r%/*}',
    '      done',
    # spelled as it resolves (no link, `.` or `..` on its way): each shorter prefix is one of
    # the folders just compared
    '      if [ "$whole" = "$p" ]; then return 1; fi',
    '    fi',
    "    case \"$p\" in /|//|'') return 1;; esac",
    '    p=${p%/*}; p=${p:-/}',
    '  done',
    '}',
    # RESOLVED: $1 by a path with no link on it, the deepest folder on its way that exists
    # (resolved) plus the rest; 1 when the rest's first part is already something (a link to
    # nothing, a file), which a writer of the folder it points into could make a folder later
    "pin_folder() {",
    '  local p=$1 rest= r f',
    '  until [ -d "$p" ] && r=$(cd -P -- "$p" 2>/dev/null && pwd -P && echo .); do',
    '    rest=/${p##*/}$rest; p=${p%/*}; p=${p:-/}',
    '  done',
    "  r=${r%$'\\n.'}; r=${r%/}; f=${rest#/}; f=${f%%/*}",
    '  RESOLVED=$r$rest; RESOLVED=${RESOLVED:-/}',
    '  if [ -n "$rest" ] && { [ -e "$r/$f" ] || [ -L "$r/$f" ]; }; then return 1; fi',
    '}',
    # glibc's loader looks for a library in subfolders of each LD_LIBRARY_PATH entry before
    # the entry itself (job_env.LOADER_SUBFOLDERS: `glibc-hwcaps/x86-64-v3`, `tls`, `x86_64`,
    # ...): with the campaign at `~/lib/x86_64`, `LD_LIBRARY_PATH=~/lib` was kept, and every
    # program of the job loaded what the campaign's writer planted there (issue 41, the
    # twenty-fourth hostile pass). Each of those that is a folder is checked as the entry is;
    # a link to nothing there yet drops the entry as well (whoever it leads to could make it).
    "loader_reaches_campaign() {  # a subfolder of library folder $1 the loader searches",
    '  local s p',
    f'  for s in {" ".join(LOADER_SUBFOLDERS)} "$HOSTTYPE"; do',
    '    for p in "$1/$s" "$1/$s"/* "$1/$s"/*/*; do',
    '      if [ -d "$p" ] && reaches_campaign "$p"; then return 0; fi',
    '      if [ -L "$p" ] && [ ! -e "$p" ]; then return 0; fi',
    '    done',
    '  done',
    '  return 1',
    '}',
    "keep_outside() {  # the variable named $1, less its entries in or reaching the campaign",
    '  local rest e kept= cut=:',
    '  rest=${!1-}',
    # glibc's loader splits LD_LIBRARY_PATH on ';' as well as ':' (dl-load.c, ":;"), and
    # reads an empty or relative entry from the folder each program runs in: split on ':'
    # alone, `/usr/lib;.` (or `/usr/lib;`) was one absolute entry, kept, and the job's `mv`
    # loaded a libacl.so.1 planted in the campaign (issue 41, the twenty-second hostile pass;
    # submit's check reads such entries from `/`, where the job's bash starts, rightly)
    "  if [ \"$1\" = LD_LIBRARY_PATH ]; then cut=':;$'; rest=${rest//;/:}; fi",
    '  rest=$rest:',
    '  while [ -n "$rest" ]; do',
    '    e=${rest%%:*}; rest=${rest#*:}',
    '    case "$e" in /*) ;; *) continue;; esac',
    '    if too_deep "$e"; then continue; fi  # no real folder: all cost, no use',
    # The loader expands $ORIGIN (the folder of each program), $LIB and $PLATFORM in an
    # entry: no one folder this shell can check. `/$ORIGIN/../../camp/lib` passed submit's
    # check (which knows bash's folder) and this one (a folder named `$ORIGIN` is none), and
    # the kit's interpreter, in a folder beside the campaign, loaded a libuuid.so.1 planted
    # there (issue 41, the twenty-second hostile pass). LD_LIBRARY_PATH keeps none ($ in cut).
    '    case "$e" in *["$cut"]*) continue;; esac',
    '    if reaches_campaign "$e" || ! pin_folder "$e"; then continue; fi',
    '    if [ "$1" = LD_LIBRARY_PATH ] && loader_reaches_campaign "$RESOLVED"; then continue; fi',
    '    case "$RESOLVED" in *["$cut"]*) continue;; esac',
    '    kept=${kept:+$kept:}$RESOLVED',
    '  done',
    '  printf -v "$1" %s "$kept"',
    '}',
)


# The folders a job keeps of the environment submit passed (job_env.PASSED), refused when one
# is in or reaches the campaign as the node sees it: the kit makes its private folders in
# TMPDIR (ownership.private_dir: the sdist's unpack, git apply, nvcc's and gcc's temporaries),
# and the programs it runs write into them by path, so whoever can write the campaign could
# rename one and put a link to a folder outside in its place. A build job whose scratch was the
# node's $SLURM_TMPDIR, submitted with TMPDIR=<campaign>/tmp, had tarfile unpack the whole vLLM
# sdist (3,063 files) into the folder such a link named (issue 41, the nineteenth hostile
# pass). CUDA_HOME and CUDA_PATH name the toolkit whose nvcc the build runs
# (CUDA_HOME=<campaign>/cuda had the build run a planted nvcc: the twentieth pass).
# Each value checked is then pinned, for the job and the kit, to the folder it names now by a
# path with no link on it (the way the build job's scratch is used): a TMPDIR through the
# user's link to a folder not made yet in the campaign (`~/t` -> `<campaign>/tmp`) resolved to
# nothing at the check, its folders outside passed, the campaign's writer made `tmp/` after
# it, and the build job's private folders went there: the sdist was unpacked outside through a
# swapped one, as above (issue 41, the twentieth hostile pass). A value that names no folder
# now is pinned to the deepest folder on its way that is one, plus the rest, which must not
# exist yet (then only the user can make it, in their own folder); a rest whose first part is
# already something (a dangling link, a file) is refused.
# The host compiler the build names by CXX is checked after: a program, resolved to its own
# path. (Before the jobs kept only what job_env passes, this list grew by a few names a pass.)
_TEMP_MSG = (
    'echo "refusing to run: $v=${!v} is in the campaign $CAMPAIGN_AT (by its name, through a'
    ' link or a bind mount of it), or names a folder through /proc, and the programs kvprefetch'
    ' runs write their temporary files there by path, or read settings or run code from there'
    ' (the CUDA toolkit, Python packages), where whoever can write the campaign could put'
    ' a link or their own programs. To fix: submit the campaign with $v set to a folder outside'
    ' it (e.g. export TMPDIR=/tmp), or unset it" >&2; exit 2')
# A relative value is refused: each program reads it from the folder it runs in, `/` for the
# kit (leave_campaign_sh), so a path from `/` into the campaign (`dev/shm/camp/pyc`) was not
# seen by the check of absolute values (issue 41, the twenty-first hostile pass).
_RELATIVE_MSG = (
    'echo "refusing to run: $v=${!v} is a relative path, which each program reads from the'
    ' folder it runs in (the kit runs in its own, the job in the campaign), so it can name a folder'
    ' in the campaign. To fix: submit the campaign with $v set to an absolute folder outside'
    ' it (e.g. export TMPDIR=/tmp), or unset it" >&2; exit 2')
_ZONE_FOLDER = "/usr/share/zoneinfo"  # glibc's, as job_env._ZONE_FOLDER (TZDIR is not passed)
_FILE_MSG = (
    'echo "refusing to run: $v=${!v} names a file in the campaign $CAMPAIGN_AT (by its name,'
    ' through a link or a bind mount of it, as this node sees it), or through /proc, which the'
    ' job\'s programs read (TZ: every Python as it starts), where whoever can write the campaign'
    ' could put a file of their own or a FIFO that blocks them. To fix: submit the campaign with'
    ' $v set to a file outside it (e.g. export TZ=UTC), or unset it" >&2; exit 2')
TEMP_OUTSIDE_SH = (
    "for v in TMPDIR CUDA_HOME CUDA_PATH; do",
    '  case "${!v:-}" in',
    f'  ""|/*) ;; *) {_RELATIVE_MSG};;',
    '  esac',
    '  case "${!v:-}" in /*)',
    '    if too_deep "${!v}"; then',
    ('      echo "refusing to run: $v names a folder more than'
     f' {MAX_PARTS} folders deep, more than kvprefetch follows to check it is outside the'
     ' campaign. To fix: submit the campaign with $v set to a folder by a shorter path, or'
     ' unset it" >&2; exit 2'),
    '    fi',
    f'    if reaches_campaign "${{!v}}"; then {_TEMP_MSG}; fi',
    '    if ! pin_folder "${!v}"; then',
    ('      echo "refusing to run: $v=${!v} names no folder now, and a part of it on its way is'
     ' already something else (a link to nothing, or a file), which could be made a folder in'
     ' the campaign after this check. To fix: set $v to a folder that exists, outside the'
     ' campaign (e.g. export $v=/tmp), or unset it" >&2; exit 2'),
    '    fi',
    # a toolkit that holds the campaign where programs read (job_env._check_held says why)
    '    held=; below=' + shlex.quote(" ".join(TOOLKIT_FOLDERS)),
    '    if [ "$v" != TMPDIR ]; then',
    '      case "$CAMPAIGN_AT/" in "${RESOLVED%/}"/*) held=1;; esac',
    '      for f in $below; do',
    '        if [ -d "$RESOLVED/$f" ] && reaches_campaign "$RESOLVED/$f"; then held=1; fi',
    '        if [ -d "$RESOLVED/$f" ] && r=$(cd -P -- "$RESOLVED/$f" 2>/dev/null && pwd -P); then',
    '          case "$CAMPAIGN_AT/" in "${r%/}"/*) held=1;; esac',
    '        fi',
    '        if [ -L "$RESOLVED/$f" ] && { ! f=$(readlink -f -- "$RESOLVED/$f") \\',
    '            || reaches_campaign "$f"; }; then held=1; fi',
    '      done',
    '      if [ -n "$held" ]; then',
    ('        echo "refusing to run: $v=${!v} holds the campaign $CAMPAIGN_AT where the job\'s'
     ' programs read or run from (in or below one of $below, or anywhere in the toolkit):'
     ' whoever can write the campaign could put their own there. To fix: submit the'
     ' campaign with $v set to a folder that holds the campaign in none of those, or unset it" >&2;'
     ' exit 2'),
    '      fi',
    '    fi',
    '    printf -v "$v" %s "$RESOLVED"; export "${v?}";;',
    '  esac',
    "done",
    # The files the job's programs read by a passed value's path, checked as the folders above
    # are: every Python of the job reads TZ's zone file as it starts (glibc's tzset: the value
    # less a leading ':', a relative one under the zone folder), the prepare job's download
    # the certificates. Submit checked them on its own machine only, so a TZ in a bind mount
    # of the campaign that only the node has (a container's view, a second mount point)
    # passed, and a FIFO the campaign's writer put at the zone's name had the merge job's
    # Python block before its first instruction until Slurm's time limit (issue 41, the
    # twenty-fourth hostile pass; the twenty-second found the FIFO, and fixed it at submit).
    # A relative certificate is refused, as a relative folder is above.
    "file_reaches_campaign() {  # the file $1 (absolute), by its folders or its link's target",
    '  local f',
    '  if reaches_campaign "$1"; then return 0; fi',
    '  if [ -L "$1" ]; then',
    '    f=$(readlink -f -- "$1") || return 0',
    '    reaches_campaign "$f"; return',
    '  fi',
    '  return 1',
    '}',
    "for v in TZ SSL_CERT_FILE SSL_CERT_DIR REQUESTS_CA_BUNDLE CURL_CA_BUNDLE PIP_CERT \\",
    "    PIP_CLIENT_CERT; do",
    '  rest=${!v-}',
    '  if [ "$v" = TZ ]; then',
    '    rest=${rest#:}',
    f'    case "$rest" in ""|/*) ;; *) rest={_ZONE_FOLDER}/$rest;; esac',
    '  fi',
    # OpenSSL reads SSL_CERT_DIR as a ':'-separated list of folders, the others as one path
    '  if [ "$v" = SSL_CERT_DIR ]; then rest=$rest:; fi',
    '  while [ -n "$rest" ]; do',
    '    if [ "$v" = SSL_CERT_DIR ]; then e=${rest%%:*}; rest=${rest#*:}; else e=$rest; rest=; fi',
    f'    case "$e" in "") continue;; /*) ;; *) {_RELATIVE_MSG};; esac',
    '    if too_deep "$e"; then',
    ('      echo "refusing to run: $v names a file more than'
     f' {MAX_PARTS} folders deep, more than kvprefetch follows to check it is outside the'
     ' campaign. To fix: submit the campaign with $v set to a file by a shorter path, or'
     ' unset it" >&2; exit 2'),
    '    fi',
    f'    if file_reaches_campaign "$e"; then {_FILE_MSG}; fi',
    '  done',
    'done',
    # the build's host compiler: a shell fragment the build's ninja runs, so plain words only
    # (job_env.CXX_VALUE, checked by submit: `g++ -B$KVPREFETCH_CAMPAIGN` ran a planted cc1plus)
    r'case "${CXX:-}" in *[!A-Za-z0-9_.,+=:@%/\ -]*)',
    ('  echo "refusing to run: CXX holds more than a compiler and its plain options (a $, a'
     ' quote, a redirection or a second command), which the build\'s shell would expand, in the'
     ' campaign too. To fix: submit the campaign with CXX set to a compiler and plain options'
     ' (e.g. export CXX=g++), or unset it" >&2; exit 2;;'),
    'esac',
    # the build's host compiler, a program: by its own path (readlink -f, PATH kept by now)
    'if [ -n "${CXX:-}" ] && [ "${CXX#*/}" != "$CXX" ]; then',
    '  if ! prog=$(readlink -f -- "$CXX") || reaches_campaign "$CXX" \\',
    '      || reaches_campaign "$prog"; then',
    ('    echo "refusing to run: CXX names a program in the campaign $CAMPAIGN_AT (or one'
     ' kvprefetch cannot follow to its own path), which the build would run as its host'
     ' compiler. To fix: submit the campaign with CXX set to a compiler outside it (e.g. export'
     ' CXX=g++), or unset it" >&2; exit 2'),
    '  fi',
    '  CXX=$prog; export CXX',
    'fi',
)

# Each job's HOME is a new folder of its own (0700, in the TMPDIR checked above, or /tmp for one
# not made yet, as Python's tempfile), removed as the job ends (record_exit; not after a
# SIGKILL): git, pip, ccache, Python's user site read settings or code there, and the user's
# HOME, passed, was checked folder by folder, a list that grew each pass (issue 41: a campaign at
# `~/.config/git` or `~/.ccache` ran git's fsmonitor, ccache's prefix_command). Pip: sbatch_environ.
PRIVATE_HOME_SH = (
    'HOME_IN=${TMPDIR:-/tmp}; if [ ! -d "$HOME_IN" ]; then HOME_IN=/tmp; fi',
    'PRIVATE_HOME=$(mktemp -d -- "$HOME_IN/kvprefetch-home.XXXXXXXXXX") || {',
    ('  echo "refusing to run: the job\'s own HOME could not be made in $HOME_IN (mktemp said'
     ' why above: not writable, a read-only file system, or full). To fix: free or make'
     ' writable $HOME_IN, or submit with TMPDIR set to a writable folder outside the'
     ' campaign" >&2; exit 2; }'),
    'HOME=$PRIVATE_HOME; export HOME',
)

# The ids the job reads from its environment name its exit record and scratch folder and index
# the bench array (bash evaluates an array index as arithmetic, which runs any `$(...)` in it):
# digits (and `_`, an array task's label) only, as `slurm publish` checks its --job (issue 41, the
# fifth hostile pass: a SLURM_JOB_ID `/../../x` put the exit record outside the campaign, a
# SLURM_ARRAY_TASK_ID `BATCHES[$(cmd)0]` ran cmd).
CHECK_JOB_IDS_SH = (
    'for id in "$JOB_ID" "${SLURM_JOB_ID:-0}" "${SLURM_ARRAY_TASK_ID:-0}"; do',
    '  case "$id" in',
    ("    ''|_*|*_|*[!0-9_]*) echo \"refusing to run: the job id '$id' from Slurm's environment"
    ' is not digits. To fix: submit it with sbatch (kvprefetch slurm submit)" >&2; exit 2;;'),
    "  esac",
    # a Slurm job id is at most 10 digits (32 bits), each part of an array task's `A_T` too: a
    # 250-digit SLURM_JOB_ID made the scratch's mkdir fail with "File name too long", which the
    # job then called "something is already there", and no exit record could be written
    # (issue 41, the twentieth hostile pass; 11 to 21 digits passed here, then publish refused)
    '  idh=${id%_*} idt=${id#*_}; if [ "${#idh}" -gt 10 ] || [ "${#idt}" -gt 10 ]; then',
    ("    echo \"refusing to run: the job id '$id' from Slurm's environment is longer than any"
     " Slurm job id (10 digits, an array task's A_T 21). To fix: submit it with sbatch (kvprefetch"
     ' slurm submit)" >&2; exit 2'),
    "  fi",
    "done",
)

# How a job's shell writes a file in the campaign folder (its exit record, verify's report),
# never through a link that whoever can write the folder planted there (issue 41, the fourth
# hostile pass: `> FILE` followed a link at the record's temporary or at results/verify.json and
# wrote outside, `mv -f` into a link to a folder moved the record there): stdin goes to a new
# file, which is renamed over FILE (`mv -T`: a link at FILE, even to a folder, is replaced, never
# followed); a folder holding FILE that is a link is refused. Both act in the folder the
# subshell has entered (`cd -P`): the working directory holds on to that folder, so a swap of
# its path for a link after the check moves nothing outside (issue 41, the eleventh hostile
# pass: under a swap loop of results/, the paths by name wrote 49 temporaries into the folder
# the link named).
# The check that the subshell is in the folder asks the kernel (getcwd, the external `pwd`):
# bash's own `pwd -P` resolves again, by name, the path `cd -P` recorded, and `cd -P` resolved
# that path by name before its chdir, so a swap between the two, and back before the check,
# left the subshell in the folder outside with the check passed (a fresh CI rehearsal found a
# verify.json written outside under the eleventh pass's swap loop; 40,000 writes here wrote one).
# The temporary is made, opened and written by one `dd`, with O_CREAT|O_EXCL|O_NOFOLLOW
# (`conv=excl oflag=nofollow`): that open never follows a link, never opens a FIFO, device or
# file already at the name (EEXIST), so what it writes is a new file of this subshell's, with
# the mode the umask gives. Its name comes from `mktemp -u` (random, made by nothing until `dd`
# makes it), so no watcher can see it before it is this subshell's file. `mktemp` made the file
# and bash opened it again by name (`<>`, O_CREAT without O_NOFOLLOW), then checked it by name:
# a watcher (inotify) that saw the new name and put a link there had `<>` create a file
# through a dangling link outside the campaign (22 runs of 30), or, swapping the link for a
# hard link to the same file between the check's two `stat`s, pass the check and have the
# report written over a file outside, exit 0 (12 runs of 30; issue 41, the fifteenth hostile
# pass). Earlier: noclobber's `>` at a guessable name opened a FIFO there and waited for good
# (the twelfth pass); a link put at the name was written through (the fourteenth).
# A SIGTERM to the job (scancel, the time limit) while verify's report was being written left
# results/verify.json.tmp-* for good (the subshell's TERM was the default action): the
# temporary is removed when the subshell ends before its rename (issue 41, the twelfth hostile
# pass), and so is anything put at its name, which only this subshell knew.
WRITE_NEW_SH = (
    "write_new() {",
    '  local dir name from=$PWD want',
    '  dir=$(dirname -- "$1"); name=$(basename -- "$1")',
    '  if [ -L "$dir" ]; then echo "refusing to write $1: $dir is a symlink" >&2; return 1; fi',
    # The folder it must be in: the campaign's part as the job resolved it at its start
    # (CAMPAIGN_AT), the rest as spelled. Compared with the spelled path itself, a campaign
    # reached through a link of the node's (`/home` a link to `/gpfs/home`, or the folder
    # moved and linked back) was a folder "that became a symlink (another process is changing
    # the campaign)", and no job wrote its exit record (issue 41, the twenty-fourth hostile
    # pass: wrong-way message).
    f'  case "$dir" in "${JOB_ENV}"/*)',
    f'    want=${{CAMPAIGN_AT%/}}/${{dir#"${JOB_ENV}"/}};; *) want=$dir;; esac',
    '  ( cd -P -- "$dir" || exit 1',
    '    if [ "$(env pwd -P)" != "$want" ]; then',
    ('      echo "refusing to write $1: $dir became a symlink (another process is changing'
     ' the campaign)" >&2; exit 1'),
    "    fi",
    '    tmp=; trap \'rm -f -- ${tmp:+"$tmp"}\' EXIT; trap "${NO_STOP-exit 143}" TERM INT HUP',
    '    tmp=$(mktemp -u -- "$name.tmp-XXXXXXXXXX") || exit 1',
    # `write_new FILE CMD...` runs CMD (in the folder write_new was called from) into the
    # temporary and learns its status, which `CMD | write_new FILE` never could: a verify-kernel
    # killed while it printed its report (the OOM killer, a kill of its own) had the half it
    # printed replace the earlier run's report (issue 41, the sixteenth hostile pass)
    '    st=(0 0)',
    '    if [ $# -gt 1 ]; then',
    ('      (cd -- "$from" && exec "${@:2}") | dd of="$tmp" conv=excl oflag=nofollow status=none'
     ' || st=("${PIPESTATUS[@]}")'),
    '    else dd of="$tmp" conv=excl oflag=nofollow status=none || st=(0 $?); fi',
    '    if [ "${st[1]}" -ne 0 ]; then',
    ('      echo "refusing to write $1: its temporary $tmp could not be made and written as a'
     ' new file of its own (something not a new file of its own was put at its name by another'
     ' process changing the campaign, or the disk is full: dd says which above). To fix: free'
     ' some space, or find what else writes the campaign, then send the job again" >&2; exit 1'),
    "    fi",
    # ended by a signal, or the kit's own exit after a stop (128 + the signal): what it
    # printed may be cut short, so nothing is replaced; the job's status is the command's
    '    if [ "${st[0]}" -ge 128 ]; then',
    ('      echo "nothing written to $1: the command that prints it was stopped or killed'
     ' (status ${st[0]}), so what it printed may be cut short; $1 is left as it was. To fix:'
     ' send the job again" >&2; exit "${st[0]}"'),
    "    fi",
    # nothing came (verify-kernel stopped by an error before its report): the report of an
    # earlier run, a plain file, stays; an empty file was put in its place (issue 41, the
    # fifteenth hostile pass). Anything else there (a link) is still replaced. The status is
    # the command's (0 when it writes to the pipe: the pipeline's is then the command's own).
    '    if [ ! -s "$tmp" ] && [ -f "$name" ] && [ ! -L "$name" ]; then',
    ('      echo "nothing written to $1: its input was empty, so it is left as it was" >&2;'
     ' exit "${st[0]}"'),
    "    fi",
    '    mv -fT -- "$tmp" "$name"; trap - EXIT; exit "${st[0]}" )',
    "}",
)
