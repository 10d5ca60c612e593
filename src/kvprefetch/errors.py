"""The error hierarchy. Every failure the kit reports is a ``KvprefetchError`` whose message
says the cause and then "To fix: ..."; each family has its own process exit code."""

from __future__ import annotations

import os
import sys
import sysconfig
import types
from contextlib import suppress


class KvprefetchError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, cause: str, fix: str | None = None) -> None:
        self.cause = cause
        self.fix = fix
        super().__init__(self.message)

    @property
    def message(self) -> str:
        return f"{self.cause}\nTo fix: {self.fix}" if self.fix else self.cause


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread as Ctrl-C raises ``KeyboardInterrupt`` (of
    which it is a kind), so that every cleanup Ctrl-C runs runs for them too: the temporary
    beside an output is removed, a lock is released, a child process is stopped (issue 41, the
    ninth hostile pass: under Python's default action a ``kill`` left ``.README.md.tmp-…``
    beside the user's README, and a build's ninja and nvcc compiling after the kit had gone).
    ``signum``: the signal; the command exits 128 + it, as the default action's status reads."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signum)


class ConfigError(KvprefetchError):
    """Bad options or an unsuitable machine (arch, toolkit, environment variables)."""

    exit_code = 2


class OptionError(ConfigError):
    """An option's value, or a combination of options, that the library refuses while it plans
    (``bench`` plans: an unknown ``--formats`` entry, a context longer than
    ``--max-model-len``). ``option`` names the option where one is to blame. The command line
    shows it as its own usage error (the "Usage:" header, "Invalid value for OPTION", the same
    exit code 2), so a check that moved from the click layer into the library reads the same."""

    def __init__(self, cause: str, option: str | None = None) -> None:
        self.option = option
        super().__init__(cause, "correct the command line; --help lists the options and the "
                                "values they take")


class FetchError(KvprefetchError):
    """Getting or checking the vLLM sources failed."""

    exit_code = 3


class PatchError(KvprefetchError):
    """The patch cannot be applied, or a tree is not in the state we expect."""

    exit_code = 4


class BuildError(KvprefetchError):
    """A build step failed."""

    exit_code = 5


class VerifyError(KvprefetchError):
    """A verification check failed (wrong binary, missing instruction, different outputs)."""

    exit_code = 6


class BenchError(KvprefetchError):
    """A benchmark could not run or produced results that cannot be trusted."""

    exit_code = 7


class LockError(KvprefetchError):
    """Another kvprefetch process holds the lock on a tree or build."""

    exit_code = 8


class CommandError(KvprefetchError):
    """A subprocess failed. Carries the command, exit code, log path and the last lines."""

    exit_code = 5

    def __init__(self, argv: list[str], returncode: int, log: str | None, tail: str,
                 fix: str | None = None) -> None:
        self.argv = argv
        self.returncode = returncode
        self.log = log
        self.tail = tail
        where = f" (full log: {log})" if log else ""
        cause = f"command failed with exit code {returncode}{where}: {' '.join(argv)}"
        if tail:
            cause += "\n--- last lines ---\n" + tail
        super().__init__(cause, fix or "read the log above; rerun with --debug for a traceback")


class SlurmError(KvprefetchError):
    """A Slurm command (sbatch, scontrol, sacct) failed, or a campaign's job did not succeed."""

    exit_code = 10  # 9 is the VMM cache's (vmm/errors.py)


def _stdlib_dirs() -> tuple[str, ...]:
    """The folders the running interpreter's own standard library lives in (not its
    site-packages, which a virtual environment puts under ``platstdlib``)."""
    base = os.path.dirname(os.path.realpath(os.__file__))
    found = {base, os.path.join(base, "lib-dynload")}
    with suppress(Exception):
        paths = sysconfig.get_paths()
        found |= {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib")}
        found -= {os.path.realpath(paths[k]) for k in ("purelib", "platlib")}
    return tuple(sorted(found))


def _in_stdlib(filename: str) -> bool:
    """Whether ``filename`` (a code object's) is a file of the interpreter's standard library:
    frozen, or under its folder and not in a site-packages below it."""
    if filename.startswith("<"):
        return True
    path = os.path.realpath(filename)
    if {"site-packages", "dist-packages"} & set(path.split(os.sep)):
        return False
    return any(path.startswith(d + os.sep) for d in _stdlib_dirs())


def third_party_origin(exc: BaseException, *, kit: tuple[str, ...] = ("kvprefetch", "click")
                       ) -> tuple[str, str] | None:
    """(top-level module, its file) of the frame that raised ``exc``, when that frame is code
    of a third-party module: neither the kit's (``kit``: its own package and click), nor the
    standard library's. A module *named* like a standard one (``json``, ``shlex``) that is not
    the standard library's file (one planted on PYTHONPATH, which comes first) is third-party
    (issue 41, the tenth hostile pass: a ``json.py`` raising on import was a traceback, where a
    ``torch.py`` was one message)."""
    named = _module_named(exc)
    if named is not None:
        top, filename = named
        if top and top not in kit and not (top in sys.stdlib_module_names
                                           and _in_stdlib(filename)):
            return top, filename
    tb = exc.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    frame = tb.tb_frame
    name = str(frame.f_globals.get("__name__") or "")
    top = name.partition(".")[0]
    filename = frame.f_code.co_filename
    if not top or top in kit or top == "__main__" or top.startswith("_"):
        return None
    if top in sys.stdlib_module_names and _in_stdlib(filename):
        return None
    return top, filename


def _module_named(exc: BaseException) -> tuple[str, str] | None:
    """(top-level module, its file) of the module an ``AttributeError`` (``module 'click' has
    no attribute 'Group'``) or an ``ImportError`` (``cannot import name ... from 'click'``)
    names: the kit's own line raised it, but the module is at fault (a ``click.py`` on
    PYTHONPATH without ``Group`` was a traceback; issue 41, the twenty-sixth pass)."""
    mod = getattr(exc, "obj", None) if isinstance(exc, AttributeError) else None
    if isinstance(mod, types.ModuleType):
        return str(mod.__name__).partition(".")[0], str(getattr(mod, "__file__", None) or "?")
    if isinstance(exc, ImportError) and exc.name and exc.path:
        return exc.name.partition(".")[0], str(exc.path)
    return None


def third_party_failed(exc: BaseException, module: str, filename: str) -> tuple[str, str]:
    """(cause, fix) for an exception raised inside the third-party ``module``."""
    detail = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    cause = (f"the module {module} ({filename}) raised {type(exc).__name__}"
             + (f": {detail}" if detail else ""))
    fix = (f"`{sys.executable} -c 'import {module}'` shows whether {module} itself is broken: "
           f"repair or reinstall it in this environment, or take a module of that name that "
           "PYTHONPATH puts first off it; `kvprefetch --debug ...` shows the full traceback")
    return cause, fix
