"""Operating-system failures (full disk, read-only file system, permissions) as the kit's
errors: one line naming the path and the cause, then "To fix", in the family of the command
that hit it. ``shutil.Error`` (copytree's list of every failed file) is reduced to its first
entry instead of being printed whole."""

from __future__ import annotations

import errno
import fcntl  # at start-up, as resource below
import os
import resource  # at start-up: an import at EMFILE fails (issue 41, the 34th hostile pass)
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import KvprefetchError

# Where the failed path came from is not known here (a --workdir, an -o/--out, a README, a
# campaign folder): the fix names the folder and the options that choose one, never only
# --workdir (issue 41, sixth pass: `export-header -o` and `report --out` on a read-only file
# system were told to "pass a writable --workdir", an option report does not have).
_ELSEWHERE = "the --workdir, -o/--out or campaign folder that named it"
_FIX = {
    # `df -h` alone showed free space where a file system had run out of inodes (issue 41,
    # the twenty-sixth hostile pass: a tmpfs of 600 inodes)
    errno.ENOSPC: "free space on that file system (`df -h {where}`; `df -i {where}` if it is "
                  "out of inodes), or write to a larger one "
                  f"({_ELSEWHERE}), then rerun: partial files of this run were removed",
    errno.EDQUOT: f"free space within your quota, or write elsewhere ({_ELSEWHERE}), then rerun",
    errno.EROFS: "{where} is on a file system mounted read-only: remount it read-write, or "
                 f"write to a writable folder ({_ELSEWHERE}), then rerun",
    errno.EACCES: f"make {{where}} writable for this user (or write to a folder you own: "
                  f"{_ELSEWHERE}), then rerun",
    errno.EPERM: f"make {{where}} writable for this user (or write to a folder you own: "
                 f"{_ELSEWHERE}), then rerun",
    # a file of elsewhere bind-mounted at a record's name (state/patched.json) made apply say
    # ".patched.json.tmp-PID -> patched.json: Device or resource busy / check the path and its
    # file system" (issue 41, the twenty-second hostile pass): a mount point is never replaced
    errno.EBUSY: "a file or folder of elsewhere is mounted at that name, or the system holds "
                 "it busy (`findmnt` lists the mounts): unmount it (`umount PATH`), then rerun; "
                 "kvprefetch never replaces or deletes a mount point",
    # a folder of elsewhere bind-mounted inside a tree (trees/patched/csrc/attention) made
    # apply, whose staged files are renamed in, say "Invalid cross-device link / check the
    # path and its file system" (issue 41, the twenty-second hostile pass)
    errno.EXDEV: "the two paths are on different mounts (a folder of elsewhere mounted "
                 "inside the work directory?), and a file moves only within one: `findmnt` "
                 "lists the mounts; unmount the one in the way (`umount PATH`), then rerun",
    # a path past PATH_MAX said only "check the path and its file system" (issue 41, the
    # eleventh hostile pass)
    errno.ENAMETOOLONG: "use a shorter path: Linux takes at most 4095 bytes in a whole path "
                        f"and 255 in one name of it ({_ELSEWHERE}), then rerun",
}


def _too_many_open() -> str:
    """The fix for EMFILE: the removal and mount checks of ``clean`` hold one descriptor per
    level of a folder (no link is ever followed), so a kit-made folder 600 levels deep under
    ``ulimit -n 128`` said "Too many open files / To fix: check the path and its file system",
    which no check of a path fixes (issue 41, the twenty-second hostile pass)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limit = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
    return (f"this process reached its limit of open files (now {limit}, `ulimit -n`), which "
            "a walk of a folder nested more deeply than that also takes: raise the limit "
            "(`ulimit -n 65536`, or as far as `ulimit -Hn` allows), then rerun")


def _too_large() -> str:
    """The fix for EFBIG: a file grew past this process's file-size limit (``ulimit -f``),
    which "check the path and its file system" did not name (issue 41, ninth hostile pass)."""
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    limit = ("unlimited" if soft == resource.RLIM_INFINITY
             else f"{soft} bytes, {soft // 1024} blocks of `ulimit -f`")
    return (f"a file outgrew the file-size limit of this process (now {limit}) or the largest "
            "file its file system holds: raise the limit (`ulimit -f unlimited`) or write to "
            f"another file system ({_ELSEWHERE}), then rerun; partial files of this run were "
            "removed")


# What a program says when it met a limit this process passed on to it (its resource limits
# are inherited): cc1plus killed by SIGXFSZ, cicc's "out of memory", the loader's mmap refused
_FILE_LIMIT_WORDS = ("File size limit exceeded", os.strerror(errno.EFBIG))
_MEMORY_WORDS = ("out of memory", "failed to map segment", os.strerror(errno.ENOMEM),
                 "MemoryError", "bad_alloc")
_USUAL_STACK = 8 << 20  # Linux's default `ulimit -s`
_FEW_FILES = 64  # `ulimit -n` below which a failed child is told of it (the default is 1024)


def _memory_limit() -> tuple[str, int] | None:
    """This process's memory limit as ``ulimit``'s flag and KiB (``-v`` first, then ``-d``),
    None where neither is set."""
    for rlimit, flag in ((resource.RLIMIT_AS, "-v"), (resource.RLIMIT_DATA, "-d")):
        soft = resource.getrlimit(rlimit)[0]
        if soft != resource.RLIM_INFINITY:
            return flag, soft // 1024
    return None


def child_limit_fix(output: str) -> str | None:
    """The fix when a child's ``output`` says it met a resource limit of this process's
    (``ulimit -f``, ``-v``, ``-d``, ``-n``, which it inherits), else None. Under ``ulimit -f``
    doctor's probe said "use a CUDA toolkit >= 12.8", and under ``ulimit -v`` the torch probe
    "install a CUDA build of torch" where torch was installed (issue 41, the twenty-eighth
    hostile pass)."""
    if any(w in output for w in _FILE_LIMIT_WORDS) \
            and resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY:
        return _too_large()
    if any(w in output for w in _MEMORY_WORDS) and (limit := _memory_limit()) is not None:
        flag, kib = limit
        return (f"a program the kit ran ran out of memory under this process's limit "
                f"(`ulimit {flag}`: now {kib} KiB), which it inherits: raise it (`ulimit {flag} "
                "unlimited`), then rerun")
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if files != resource.RLIM_INFINITY and (files < _FEW_FILES
                                            or os.strerror(errno.EMFILE) in output):
        # nvcc (a /bin/sh wrapper) under `ulimit -n 10`: "/bin/sh: 0: 3: Invalid argument", and
        # build sent the user to another toolkit (issue 41, the thirty-fourth hostile pass)
        return _too_many_open()
    if _near_process_limit():  # nvcc under `ulimit -u`: "Failed to preprocess host compiler
        return process_limit()  # properties", and doctor sent the user to another toolkit
    stack = resource.getrlimit(resource.RLIMIT_STACK)[0]
    if "Segmentation fault" in output and stack != resource.RLIM_INFINITY \
            and stack < _USUAL_STACK:  # nvcc under `ulimit -s 96`
        return (f"a program the kit ran crashed, and this process's stack limit, which it "
                f"inherits, is small (`ulimit -s`: now {stack // 1024} KiB): raise it (`ulimit "
                f"-s {_USUAL_STACK // 1024}`), then rerun")
    return None


def _no_temp(reason: str) -> tuple[str, str]:
    """Python's temp folder search found none that takes a small file: "check the path and its
    file system" named no path, and under ``ulimit -f 0`` (every folder refuses a file of 4
    bytes) no check of a folder fixes it (issue 41, the twenty-third hostile pass)."""
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if soft != resource.RLIM_INFINITY and soft < 4096:
        cause = (f"{reason}: this process may write no file larger than {soft} bytes "
                 f"(`ulimit -f` {soft // 1024})")
        return cause, "raise the limit (`ulimit -f unlimited`), then rerun"
    cause = f"{reason} (the system temp folder, TMPDIR, takes no new file)"
    return cause, ("set TMPDIR to a folder of yours with free space that you can write (e.g. "
                   "export TMPDIR=/tmp), then rerun")


_CWD_GONE = (("the current folder no longer exists (it was deleted or moved after the shell "
              "entered it), so no relative path, and no default folder, can be found"),
             "cd into an existing folder (e.g. `cd ~`), then rerun")


def cwd_gone() -> bool:
    """Whether the current folder has been deleted (``os.getcwd`` fails with ENOENT). A command
    run from one said "fetch failed: No such file or directory / To fix: check the path and
    its file system", naming no path (issue 41, the eleventh hostile pass)."""
    try:
        os.getcwd()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


def describe(exc: OSError) -> tuple[str, str]:
    """(cause, fix) for an OSError."""
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list) \
            and exc.args[0]:
        first = exc.args[0][0]
        n = len(exc.args[0])
        src, dst, why = [*first, "", "", ""][:3]
        more = f" (and {n - 1} more files)" if n > 1 else ""
        return (f"copying {src} to {dst} failed: {why}{more}",
                "free space or fix the permissions of the destination, then rerun")
    if exc.errno == errno.ENOENT and not os.path.isabs(str(exc.filename or "")) \
            and cwd_gone():
        return _CWD_GONE
    if exc.errno == errno.ENOENT and str(exc.strerror).startswith("No usable temporary"):
        return _no_temp(str(exc.strerror))
    where = exc.filename or ""
    if exc.filename2:
        where = f"{exc.filename} -> {exc.filename2}"
    reason = exc.strerror or str(exc)
    cause = f"{where}: {reason}" if where else reason
    if exc.errno == errno.EFBIG:
        return cause, _too_large()
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return cause, _too_many_open()
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS) and _in_scratch(exc.filename):
        # the kit's scratch (apply's git folder, doctor's probe): the work directory's
        # fix ("write to a larger one (the --workdir ...)") does not reach it (issue 41, the
        # twenty-fourth hostile pass)
        temp = tempfile.gettempdir()
        return cause, (f"free space in the system temp folder {temp} (`df -h {temp}`; "
                       f"`df -i {temp}` if it is out of inodes), or set TMPDIR to a folder on "
                       "a larger, writable file system, then rerun")
    if exc.errno in (errno.EACCES, errno.EPERM) and exc.filename and not exc.filename2:
        unreadable = _unreadable(str(exc.filename))
        if unreadable:
            return cause, unreadable
    if exc.errno == errno.EPERM:
        marked = _marked([str(n) for n in (exc.filename, exc.filename2) if n])
        if marked:
            return cause, marked
    fix = _FIX.get(exc.errno or 0, "check the path and its file system, then rerun")
    return cause, fix.format(where=os.path.dirname(str(exc.filename or ".")) or ".")


def _in_scratch(filename: object) -> bool:
    """Whether ``filename`` is in a scratch folder of the kit's in the system temp folder
    (``ownership.private_dir``: ``$TMPDIR/kvprefetch-*``), and in no work directory (one may be
    named ``/tmp/kvprefetch-work``: its top holds the work directory's tag file; the base layer
    reads the name, not ``workspace``)."""
    if not isinstance(filename, str) or not os.path.isabs(filename):
        return False
    try:
        temp = os.path.realpath(tempfile.gettempdir())
    except OSError:  # no usable temp folder at all
        return False
    path = os.path.realpath(filename)
    if not path.startswith(os.path.join(temp, "")):
        return False
    top = os.path.relpath(path, temp).split(os.sep)[0]
    return top.startswith("kvprefetch-") \
        and not os.path.lexists(os.path.join(temp, top, ".kvprefetch-workdir"))


_FS_IOC_GETFLAGS = 0x80086601  # _IOR('f', 1, long): what `lsattr` reads
_MARKS = ((0x10, "i", "immutable"), (0x20, "a", "append-only"))  # FS_IMMUTABLE_FL, FS_APPEND_FL


def _marks(path: str) -> tuple[str, str] | None:
    """(letter, word) of the ``chattr`` mark that forbids replacing, renaming or deleting
    ``path`` (a regular file or a folder, opened without following a link and never a FIFO or
    device), else None; None too where the file system keeps no such marks."""
    import stat

    try:
        mode = os.lstat(path).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        buf = bytearray(8)
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, buf)
    except OSError:
        return None
    finally:
        os.close(fd)
    flags = int.from_bytes(buf[:4], sys.byteorder)
    return next(((letter, word) for bit, letter, word in _MARKS if flags & bit), None)


def _marked(names: list[str]) -> str | None:
    """The fix for EPERM where a path named, or the folder holding it, carries an immutable or
    append-only mark (``chattr +i``/``+a``, ext4, xfs, btrfs): no user, root included, may
    replace, rename or delete it. Apply over an immutable tree file was told "make
    trees/.patched.apply/new/... writable", and clean or a record's write under a marked folder
    or record "make . writable", neither of which is the cause (issue 41, the thirty-sixth
    hostile pass, on a loop-mounted ext4)."""
    for name in names:
        for path in (name, os.path.dirname(name)):
            # a bare name is one relative to a folder's descriptor: not this folder's
            found = _marks(path) if os.sep in name and path else None
            if found:
                letter, word = found
                what = "it or what it holds" if os.path.isdir(path) else "it"
                return (f"{path} is marked {word} (`lsattr -d {path}` shows `{letter}`), so no "
                        f"user, root included, may change, rename or delete {what}: remove "
                        f"the mark if it is yours to remove (`chattr -{letter} {path}`, as "
                        f"root), or write elsewhere ({_ELSEWHERE}), then rerun")
    return None


def _unreadable(path: str) -> str | None:
    """The fix when ``path`` itself is what this user may not read (a file of mode 0222 or 0000
    in a tree, a folder of mode 0000): "make <its folder> writable" named a folder that was
    writable already, and the rerun failed the same way (issue 41, the twenty-fourth hostile
    pass, as a user who is not root), or, a file, not writable itself. None when the path reads
    and writes (its folder refused the write)."""
    import stat

    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):
        if os.access(path, os.R_OK | os.X_OK):
            return None
        return (f"make the folder {path} readable and searchable for this user (`chmod u+rx "
                "PATH`), then rerun")
    if stat.S_ISREG(st.st_mode) and not os.access(path, os.R_OK):
        return (f"make the file {path} readable for this user (`chmod u+r PATH`), then rerun")
    if not os.access(path, os.W_OK):  # the file itself: a /dev/null of mode 0644 was told
        # "make /dev writable" (issue 41, the thirty-fifth hostile pass, as a user not root)
        marked = _marked([path]) if os.sep in path else None
        if marked:  # chattr's mark, which binds root too: named with its own fix
            return f"{path} itself is not writable for this user: {marked}"
        return (f"{path} itself is not writable for this user: have its owner make it "
                "writable (`chmod a+w PATH`, or `chattr -i PATH` where `lsattr PATH` shows it "
                "immutable; /dev/null is mode 0666 on a sound system), then rerun")
    return None


# What only writing a local file raises: a download that fails with one of these failed on this
# machine's disk, not on the network (issue 41, the nineteenth hostile pass: a full or
# read-only work directory during the sdist download was told to "check the network and run
# the command again", which fails the same way)
_LOCAL_WRITE = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)


def local_write_failure(exc: BaseException, where: os.PathLike[str] | str
                        ) -> tuple[str, str] | None:
    """``describe``'s (cause, fix) when ``exc`` is a failure to write a local file (full disk,
    quota, read-only file system, file-size limit) into the folder ``where``; None for anything
    else (the network). A write to a descriptor names no file, so ``where`` stands in. This
    process's limit of open files (``ulimit -n``), met opening the connection (a ``URLError``
    whose reason is EMFILE), is this machine's too: it was told to "check the network" (issue
    41, the forty-second hostile pass)."""
    reason = getattr(exc, "reason", None)  # urllib's URLError wraps the socket's OSError
    if isinstance(reason, OSError) and reason.errno in (errno.EMFILE, errno.ENFILE):
        return describe(reason)
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        return describe(exc)
    if not isinstance(exc, OSError) or exc.errno not in _LOCAL_WRITE:
        return None
    if not exc.filename:
        exc = OSError(exc.errno, exc.strerror, os.path.join(where, ""))
    return describe(exc)


@contextmanager
def mapped(family: type[KvprefetchError], doing: str, *, where: os.PathLike[str] | str | None
           = None, full_note: str = "") -> Iterator[None]:
    """Turn an OSError raised inside into ``family`` ("<doing> failed: <path>: <reason>").

    ``where``: the folder a local write failure (full disk, quota, read-only) that names no
    path, or only a name relative to a folder's descriptor, happened in; ``full_note``: added
    to a full disk's or quota's fix. ``clean`` on a full work directory said "No space left on
    device / To fix: free space on that file system (`df -h .`)", the folder the user's shell
    is in, and not that clean itself needs a little space before it frees any (issue 41, the
    twenty-second hostile pass)."""
    try:
        yield
    except OSError as exc:
        cause, fix = describe(exc)
        name = str(exc.filename or "")
        if where is not None and exc.errno in _LOCAL_WRITE and not os.path.isabs(name):
            cause, fix = describe(OSError(exc.errno, exc.strerror, os.path.join(where, "")))
            if exc.filename:
                cause = f"{exc.filename} in {cause}"
        elif where is not None and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS) \
                and _under(name, where):
            # the whole path of what failed stays in the cause, but the fix names the folder
            # the user gave: a copy's temporary folder (`df -h <wd>/pristine/.sdist.tmp-PID/
            # vllm/...`) is removed as the run ends (issue 41, after the thirty-sixth pass
            # named whole paths)
            fix = describe(OSError(exc.errno, exc.strerror, os.path.join(where, "")))[1]
        if full_note and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            fix = f"{fix} ({full_note})"
        raise family(f"{doing} failed: {cause}", fix) from exc


def _under(name: str, folder: os.PathLike[str] | str) -> bool:
    """Whether the absolute path ``name`` lies in ``folder`` or below it (lexically)."""
    top = os.path.abspath(folder)
    return name == top or name.startswith(top.rstrip(os.sep) + os.sep)


def process_limit() -> str:
    """The fix when this user may start no more processes or threads: ``fork`` fails with
    EAGAIN and a thread's start with "can't start new thread" at ``ulimit -u`` (RLIMIT_NPROC,
    which counts every process and thread of the user's, this one's included) or a cgroup's
    ``pids.max``. The fork said "cannot run /usr/bin/gcc: ... (it is not an executable
    program) / pass the path of an executable", and a thread's start was a RuntimeError
    traceback in doctor, fetch and build (issue 41, the twenty-ninth hostile pass)."""
    soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    limit = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
    return (f"this user may start no more processes or threads (`ulimit -u`: now {limit}, "
            "counting every process and thread this user runs; or the container's pids "
            "limit): end some of this user's programs or raise the limit (`ulimit -u "
            "unlimited`, or as far as `ulimit -Hu` allows), then rerun")


def _near_process_limit() -> bool:
    """Whether this user runs within a few tasks of ``ulimit -u`` (which binds no root), so
    that a child's own children or threads may have failed to start."""
    soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if soft == resource.RLIM_INFINITY or os.getuid() == 0:  # the real user's count
        return False
    mine, tasks = f"Uid:\t{os.getuid()}\t", 0
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
                    if any(ln.startswith(mine) for ln in f):
                        tasks += len(os.listdir(f"/proc/{pid}/task"))
            except OSError:  # gone meanwhile, or not ours to read
                continue
    return tasks + _TASKS_MARGIN >= soft


_TASKS_MARGIN = 16  # what a compiler driver starts at once (nvcc: cpp, cicc, ptxas, fatbinary)


def not_forked(exc: OSError, program: str) -> None:
    """Raise the ConfigError for a ``program`` the fork of which failed with ``exc`` of EAGAIN
    (``process_limit``) or EMFILE/ENFILE (``_too_many_open``); return for any other."""
    if exc.errno in (errno.EAGAIN, errno.EMFILE, errno.ENFILE):
        from .errors import ConfigError

        # EMFILE (`ulimit -n 9`): apply said "cannot run /usr/bin/git: Too many open files (it
        # is not an executable program) / To fix: pass the path of an executable" (issue 41,
        # the thirty-fourth hostile pass)
        raise ConfigError(f"cannot start {program}: {exc.strerror or exc}",
                          process_limit() if exc.errno == errno.EAGAIN
                          else _too_many_open()) from None


def no_thread(exc: BaseException) -> tuple[str, str] | None:
    """A thread that could not be started (``threading``'s RuntimeError), as cause and fix
    (``process_limit``); None for any other exception."""
    if type(exc) is not RuntimeError or str(exc) != "can't start new thread":
        return None
    return "the kit could not start a thread of its own (can't start new thread)", \
        process_limit()


def out_of_memory(exc: BaseException) -> tuple[str, str] | None:
    """The kit's own process out of memory, as cause and fix (None for any other exception): a
    ``MemoryError``, or an ``ImportError`` whose library could not be mapped ("failed to map
    segment from shared object"), anywhere in ``exc``'s chain. Under ``ulimit -v 150000``
    ``report`` ended in a MemoryError traceback inside ``import matplotlib`` (importlib's frame,
    no module to name), under 180000 it said "the module fontTools raised MemoryError ...
    reinstall it", and under 60000 "matplotlib is needed for the PNG plots / pip install
    'kvprefetch[plot]'" where matplotlib was installed (issue 41, the thirty-fifth hostile
    pass)."""
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen and len(seen) < 20:
        seen.append(cur)
        if isinstance(cur, MemoryError) or (
                isinstance(cur, ImportError)
                and any(w in str(cur) for w in ("failed to map segment",
                                                os.strerror(errno.ENOMEM)))):
            break
        cur = cur.__cause__ or cur.__context__
    else:
        return None
    cause = f"the kit ran out of memory ({type(cur).__name__}" + (
        f": {str(cur).strip().splitlines()[-1][:200]})" if str(cur).strip() else ")")
    limit = _memory_limit()
    if limit is None:
        return cause, "free memory on this machine (or run where more is free), then rerun"
    flag, kib = limit
    return cause, (f"raise this process's memory limit (`ulimit {flag}`: now {kib} KiB; "
                   f"`ulimit {flag} unlimited`), then rerun")


def unencodable(exc: BaseException) -> tuple[str, str] | None:
    """A name the operating system cannot be given under this locale, as cause and fix (None
    for any other exception). Python decodes the command line and the environment with the
    locale's encoding, keeping undecodable bytes as surrogates; the CJK codecs (EUC-JP,
    Shift_JIS, GBK, Big5) decode some bytes of a UTF-8 name as characters they cannot encode
    again, so the first call naming such a path raised UnicodeEncodeError: a traceback in
    every command given a path option of UTF-8 bytes under `LC_ALL=ja_JP.EUC-JP` (issue 41,
    the twenty-sixth hostile pass). Only an encoding error of the file-system encoding, and
    only where that is not UTF-8 (there every decoded name encodes back)."""
    import codecs
    import sys

    if not isinstance(exc, UnicodeEncodeError):
        return None
    try:
        mine = codecs.lookup(sys.getfilesystemencoding()).name
        theirs = codecs.lookup(exc.encoding).name
    except LookupError:
        return None
    if theirs != mine or mine == "utf-8":
        return None
    bad = exc.object[exc.start:exc.end] if isinstance(exc.object, str) else ""
    cause = (f"a path or value ({exc.object!a}) holds {bad!a}, which this locale's encoding "
             f"({mine}) cannot pass to the system: under this locale Python cannot give a name "
             "of these bytes back as it was given")
    fix = ("run kvprefetch under a UTF-8 locale (e.g. `LC_ALL=C.UTF-8`), or use a path of ASCII "
           "characters")
    return cause, fix


def other_bytes_on_disk(value: str) -> bool:
    """Whether ``value`` (a path as Python decoded it) is, under this locale's encoding, other
    bytes than the UTF-8 the kit writes into its files (job scripts, build.ninja, logs:
    ``confine._encoded``; a byte that is not UTF-8 kept as itself). Under Shift_JIS, GBK, Big5
    or latin-1 a non-ASCII name is: a ``--scratch`` of one went into the job scripts as another
    folder (issue 41, the twenty-seventh hostile pass). Never under a UTF-8 or ASCII locale."""
    try:
        return os.fsencode(value) != value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return True

