"""The one door for subprocesses. ``run`` echoes ``+ cmd``, tees the full output into a log
file, resolves the program on the *child's* PATH, and raises ``CommandError`` with the command,
exit code, log path and last lines on failure. No other module imports ``subprocess``."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import CommandError, ConfigError

_NINJA_PROGRESS = re.compile(r"^\[(\d+)/(\d+)\]")


@dataclass(frozen=True)
class Completed:
    argv: list[str]
    returncode: int
    output: str
    log: Path | None


def which(program: str, env: Mapping[str, str] | None = None) -> str | None:
    """Resolve ``program`` on the PATH of ``env`` (the child's), not the parent's."""
    path = (env if env is not None else os.environ).get("PATH", os.defpath)
    return shutil.which(program, path=path)


def quote(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(str(a)) for a in argv)


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    log: str | os.PathLike[str] | None = None,
    echo: bool = True,
    check: bool = True,
    capture: bool = True,
    timeout: float | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    fix: str | None = None,
) -> Completed:
    """Run ``argv`` (never through a shell). Output goes to ``log`` (appended) and, when
    ``capture``, is returned. ``on_progress`` receives ninja's ``[n/N]`` counters."""
    args = [str(a) for a in argv]
    child_env = dict(env) if env is not None else dict(os.environ)
    resolved = args[0] if os.sep in args[0] else which(args[0], child_env)
    if resolved is None:
        raise ConfigError(
            f"'{args[0]}' was not found on the PATH of the command's environment",
            fix or f"install {args[0]} or put it on PATH",
        )
    args[0] = resolved
    if echo:
        print(f"+ {quote(args)}", file=sys.stderr, flush=True)
    log_path = Path(log) if log is not None else None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: deque[str] = deque(maxlen=25)
    chunks: list[str] = []
    logf = open(log_path, "a", encoding="utf-8") if log_path else None  # noqa: SIM115 -- closed below
    try:
        if logf:
            logf.write(f"+ {quote(args)}\n")
            logf.flush()
        proc = subprocess.Popen(
            args, env=child_env, cwd=cwd, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            errors="replace", bufsize=1,
        )
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if logf:
                    logf.write(line)
                if capture:
                    chunks.append(line)
                tail.append(line.rstrip("\n"))
                if on_progress is not None:
                    m = _NINJA_PROGRESS.match(line)
                    if m:
                        on_progress(int(m.group(1)), int(m.group(2)))
            returncode = proc.wait(timeout=timeout)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            if proc.stdout is not None:
                proc.stdout.close()
    finally:
        if logf:
            logf.close()
    if check and returncode != 0:
        raise CommandError(args, returncode, str(log_path) if log_path else None,
                           "\n".join(tail), fix)
    return Completed(args, returncode, "".join(chunks), log_path)
