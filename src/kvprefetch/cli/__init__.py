"""The ``kvprefetch`` command line: parses options, calls the library, renders the result.
Nothing here (or in what it imports at start-up) touches CUDA, so ``--help`` works anywhere."""

from __future__ import annotations

import atexit
import importlib
import os
import signal
import sys
import threading
import time
from contextlib import suppress
from types import FrameType
from typing import Any

import click

from .. import __version__
from ..console import escaped
from ..errors import KvprefetchError, Terminated, third_party_failed, third_party_origin
from ..runner import leave_out_relative_path, raise_when_safe, stop_children
from ..stdio import StreamWriteError, standard_streams

# name -> "module:attribute" of a click command; imported only when that command runs, so a
# missing optional dependency of one command never breaks --help or the others.
COMMANDS: dict[str, str] = {
    "fetch": "kvprefetch.cli.sources:fetch",
    "apply": "kvprefetch.cli.sources:apply",
    "diff-upstream": "kvprefetch.cli.sources:diff_upstream",
    "export-header": "kvprefetch.cli.sources:export_header",
    "build": "kvprefetch.cli.build:build",
    "clean": "kvprefetch.cli.build:clean",
    "doctor": "kvprefetch.cli.doctor:doctor",
    "verify-kernel": "kvprefetch.cli.verify:verify_kernel",
    "bench": "kvprefetch.cli.bench:bench",
    "report": "kvprefetch.cli.report:report",
    "vmm": "kvprefetch.cli.vmm:vmm",
    "slurm": "kvprefetch.cli.slurm:slurm",
}


def _os_error_family(command: str | None) -> type[KvprefetchError]:
    from .. import errors

    return {"fetch": errors.FetchError, "apply": errors.PatchError,
            "diff-upstream": errors.PatchError, "export-header": errors.PatchError,
            "build": errors.BuildError, "verify-kernel": errors.VerifyError,
            "bench": errors.BenchError}.get(command or "", errors.ConfigError)


def with_fix(exc: click.UsageError) -> click.UsageError:
    """A usage error with the kit's "To fix" line (every error says how to fix it): click says
    what was wrong; this says where the right spelling is. Same text otherwise, same exit code
    (2), same "Try --help" header. The text is ``escaped``: a value an option's check quoted
    back (``--source`` with ESC in it) reached the terminal raw (issue 41, the thirteenth
    hostile pass)."""
    text = escaped(exc.format_message())
    if "To fix:" in text:
        return exc if text == exc.format_message() else click.UsageError(text, ctx=exc.ctx)
    where = exc.ctx.command_path if exc.ctx is not None else "kvprefetch"
    return click.UsageError(f"{text}\nTo fix: correct the command line; `{where} --help` lists "
                            "the commands, their options and the values they take", ctx=exc.ctx)


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        cmd: click.Command = getattr(importlib.import_module(module), attr)
        return cmd

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as exc:
            raise with_fix(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        debug = bool(ctx.params.get("debug"))
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:  # a subcommand's (or an unknown command's) usage error
            raise with_fix(exc) from None
        except KvprefetchError as exc:
            if debug:
                raise
            _stopped_first(exc)
            click.echo(f"error: {escaped(exc.message)}", err=True)
            sys.exit(exc.exit_code)
        except StreamWriteError as exc:
            # stdout itself could not be written (`> /dev/full`): not the work directory's
            # fault, and "partial files were removed" would be untrue (issue 41, ninth pass)
            if debug:
                raise
            family = _os_error_family(ctx.invoked_subcommand)
            err = family(*output_failed(exc))
            click.echo(f"error: {escaped(err.message)}", err=True)
            sys.exit(err.exit_code)
        except BrokenPipeError:
            # The reader of our output went away (`kvprefetch … | head -1`): not a fault of a
            # path or a file system. click's own handling (as for `--help | head -1`) exits 1
            # quietly (issue 41, the seventh hostile pass: "clean failed: Broken pipe … check
            # the path and its file system").
            raise
        except OSError as exc:
            # Anything the library did not map itself (a full disk, a read-only work
            # directory): still one message with a fix, in the family of the command.
            if debug:
                raise
            from ..oserrors import describe

            family = _os_error_family(ctx.invoked_subcommand)
            cause, fix = describe(exc)
            err = family(f"{ctx.invoked_subcommand or 'kvprefetch'} failed: {cause}", fix)
            click.echo(f"error: {escaped(err.message)}", err=True)
            sys.exit(err.exit_code)
        except KeyboardInterrupt as exc:
            if debug:
                raise
            _interrupted(exc)
        except Exception as exc:
            # raised inside a third-party module (torch, numpy, matplotlib, rich, ...): a broken
            # install, or a module of that name planted on PYTHONPATH, raising on import or on
            # use. One message naming the module and its file (issue 41, ninth hostile pass:
            # a `torch` raising RuntimeError on import was a traceback in bench and vmm, a
            # `matplotlib` in report, a `rich` in every dry run's table). An exception from
            # the kit's own code (or the standard library called by it) stays a traceback: a
            # bug of the kit's, which its tests must see.
            from ..oserrors import no_thread, out_of_memory, unencodable

            named = unencodable(exc) or no_thread(exc) or out_of_memory(exc)
            if named is not None and not debug:
                # a path the locale's codec cannot encode back (issue 41, the twenty-sixth
                # pass); a thread not started under `ulimit -u` (the twenty-ninth)
                family = _os_error_family(ctx.invoked_subcommand)
                err = family(f"{ctx.invoked_subcommand or 'kvprefetch'} failed: {named[0]}",
                             named[1])
                click.echo(f"error: {escaped(err.message)}", err=True)
                sys.exit(err.exit_code)
            loop = _symlink_loop(exc)
            if loop is not None and not debug:
                # pathlib's resolve() reports a loop of links as RuntimeError("Symlink loop
                # from '<path>'"), not as the OSError (ELOOP) every other call gives: a
                # --workdir, --scratch or campaign named by a link to itself was a traceback in
                # build --dry-run, slurm publish, slurm plan and doctor (issue 41, the
                # twentieth hostile pass). The same one message as that OSError.
                from ..oserrors import describe

                family = _os_error_family(ctx.invoked_subcommand)
                cause, fix = describe(loop)
                err = family(f"{ctx.invoked_subcommand or 'kvprefetch'} failed: {cause}", fix)
                click.echo(f"error: {escaped(err.message)}", err=True)
                sys.exit(err.exit_code)
            origin = third_party_origin(exc)
            if debug or origin is None:
                raise
            _stopped_first(exc)
            family = _os_error_family(ctx.invoked_subcommand)
            err = family(*third_party_failed(exc, *origin))
            click.echo(f"error: {escaped(err.message)}", err=True)
            sys.exit(err.exit_code)


def _symlink_loop(exc: Exception) -> OSError | None:
    """The ELOOP OSError pathlib's "Symlink loop from '<path>'" RuntimeError stands for."""
    import ast
    import errno
    import os

    text = str(exc)
    prefix = "Symlink loop from "
    if type(exc) is not RuntimeError or not text.startswith(prefix):
        return None
    try:
        path = ast.literal_eval(text[len(prefix):])
    except (ValueError, SyntaxError):
        path = text[len(prefix):]
    return OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path))


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kvprefetch")
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
def main(debug: bool) -> None:
    """Carry an asynchronous KV-cache L2 prefetch into vLLM v0.10.2's PagedAttention decode
    kernel, build stock and patched side by side, and prove what each one runs.

    \b
    Typical flow (what scripts/main.sh runs, and the README describes):
      kvprefetch fetch                    # pristine trees: baseline, patched
      kvprefetch apply --variant prefetch # patch the 'patched' tree
      kvprefetch diff-upstream --check    # the patch only adds lines
      kvprefetch build --arch 9.0a        # compile each tree into its own environment
      kvprefetch verify-kernel            # which .so loads, UBLKPF in SASS, bitwise outputs
    """


def no_world_writable() -> None:
    """Add world-write to the umask (whatever else it masks stays masked): nothing the kit or
    a program it runs creates is writable by every user. Under ``umask 000`` the work
    directory, ``state/``, ``trees/``, ``.locks/``, a campaign folder and its ``scripts/`` were
    made 0777 and the files ``apply`` patched 0666, so any local user could replace a record,
    plant a link or edit an sbatch script (issue 41, ninth hostile pass; the threat model
    gives the work directory to the user and the user's programs only). Group write (``umask
    002``, a team's shared project folder) is the user's to choose, and kept.

    The owner's own bits are never masked: under ``umask 277`` (or 777, 177) the kit made a
    campaign or work directory it could not write into or enter itself, then blamed the
    current folder ("slurm failed: scripts: Permission denied / To fix: make . writable"),
    leaving the empty folder behind (issue 41, the tenth hostile pass)."""
    os.umask((os.umask(0o022) & ~0o700) | 0o002)


def output_failed(exc: OSError) -> tuple[str, str]:
    """(cause, fix) for a standard output that could not be written."""
    cause = f"cannot write this command's output to its standard output: {exc.strerror or exc}"
    fix = ("send the output somewhere it can be written (`> FILE` on a file system with room, "
           "or a pipe), then rerun; this is not a fault of the work directory or of any file "
           "the command writes")
    return cause, fix


def _interrupted(exc: KeyboardInterrupt) -> None:
    """Ctrl-C (exit 130), SIGTERM (143), SIGHUP (129) or another ending signal (128 + its
    number), once every cleanup has run: one line. The first stop signal decides: TERM, then
    two INTs during its cleanup (the third raises) exited 130, not 143 (issue 41, the twelfth
    pass left it open)."""
    _ENDED[0] = True
    if _SIGNALS and _SIGNALS[0] != signal.SIGINT:
        exc = Terminated(_SIGNALS[0])
    elif _SIGNALS:
        exc = KeyboardInterrupt()
    if isinstance(exc, Terminated):
        name = signal.Signals(exc.signum).name
        click.echo(f"stopped by {name}: nothing further was changed; rerun to resume", err=True)
        sys.exit(128 + exc.signum)
    click.echo("interrupted: nothing further was changed; rerun to resume", err=True)
    sys.exit(130)


_SIGNALS: list[int] = []  # the stop signals received so far


def _stopped_first(exc: BaseException) -> None:
    """A stop signal came first: the error ``exc`` is what the stop left (a library turned
    the ``KeyboardInterrupt`` into its own error), so the command reports the stop. Ctrl-C
    while matplotlib was being imported said "matplotlib is needed for the PNG plots / To
    fix: pip install 'kvprefetch[plot]'" (issue 41, the eleventh hostile pass)."""
    if not _SIGNALS:
        return
    signum = _SIGNALS[0]
    stop = KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)
    _interrupted(stop)


def _second_signal(signum: int) -> bool:
    """Count ``signum``; True for the second one, which must not raise. The first has raised
    and its cleanups are running (a temporary beside a user's output removed, a scratch folder
    in the system temp folder, a tree rolled back): a second exception in the middle of one
    stopped it and left its files behind (issue 41, the tenth hostile pass: a Ctrl-C pressed
    twice, or Slurm's and a wrapper's signals). The second one SIGKILLs every child at once
    (what the first one's grace would do after 10 s); a third raises, for a user who insists."""
    _SIGNALS.append(signum)
    if _IN_STOP[0]:
        # a signal while an earlier one's handler stops the children: counted only. Its
        # handler ran inside the earlier one's, inside threading's lock of ``Event.set`` (not
        # re-entrant), and waited on it for ever (issue 41, the thirteenth hostile pass: a
        # storm of SIGINTs after a SIGTERM hung the command, 1 run in about 10)
        return True
    _IN_STOP[0] = True
    try:
        if len(_SIGNALS) == 1:
            stop_children()
            if len(_SIGNALS) > 1:  # a second came meanwhile: as a second does
                stop_children(signal.SIGKILL)
            return False  # the first stop raises, whatever came meanwhile
        stop_children(signal.SIGKILL)
        return len(_SIGNALS) == 2
    finally:
        _IN_STOP[0] = False


_IN_STOP = [False]  # a handler is stopping the children (``_second_signal``)


# A stop raised where Python ignores exceptions (a weakref callback, a ``__del__``: the handler
# runs wherever the main thread is) was printed as "Exception ignored in: <function
# _get_module_lock.<locals>.cb ...> Traceback ... KeyboardInterrupt" and lost: the command ran
# on to its end, exit 0 (issue 41, the eleventh hostile pass: a Ctrl-C during report's
# imports). ``_unraisable`` takes such a stop back and raises its signal again, whose handler
# then raises the same exception where it is not ignored, without counting it as a second.
_REDELIVER: list[KeyboardInterrupt] = []
_IN_HOOK = [False]


def _deliver_later(signum: int) -> None:
    """``signum`` to this process again in 10 ms, from a thread: its handler then runs in the
    main thread wherever it is by then, not inside the hook that asks for it (a signal raised
    there ran its handler at once, inside the hook, which ignored it again)."""
    def later() -> None:
        time.sleep(0.01)
        with suppress(OSError):
            os.kill(os.getpid(), signum)
    threading.Thread(target=later, name="kvprefetch-redeliver", daemon=True).start()


def _redelivered(signum: int) -> bool:
    if not _REDELIVER:
        return False
    if _IN_HOOK[0]:
        _deliver_later(signum)
    else:
        raise_when_safe(_REDELIVER.pop())
    return True


def _unraisable(args: Any) -> None:
    exc = args.exc_value
    if isinstance(exc, KeyboardInterrupt) and _SIGNALS:
        if not _REDELIVER:
            _REDELIVER.append(exc)
        _IN_HOOK[0] = True
        try:
            _deliver_later(_SIGNALS[-1])
        finally:
            _IN_HOOK[0] = False
        return
    sys.__unraisablehook__(args)


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    if not _redelivered(signum) and not _second_signal(signum) and not _ending(frame):
        raise_when_safe(Terminated(signum))


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    if not _redelivered(signum) and not _second_signal(signum) and not _ending(frame):
        raise_when_safe(KeyboardInterrupt())


def _ending(frame: FrameType | None) -> bool:
    """The command has ended (``_ENDED``), or the signal came in ``run``'s own code or in
    ``_interrupted``'s, which only report how it ended: a stop there is counted
    (``_second_signal``), never raised. Raised there, it escaped ``run`` with a traceback:
    "SystemExit: 0 ... During handling ... Terminated: 15" (issue 41, the thirteenth hostile
    pass: TERM, INT, INT as a real ``apply`` ended, 1 run in about 230). The frame covers the
    moments before the flag is set: a function's first instruction checks for signals."""
    return _ENDED[0] or (frame is not None and frame.f_code in (run.__code__,
                                                                _interrupted.__code__))


_ENDED = [False]  # the command has ended: ``run`` reports it and hands the signals over


# Every signal whose default action ends the process and that a person or a batch system
# sends to stop it: SIGTERM (kill, Slurm's time limit), SIGHUP (a closed terminal), SIGQUIT
# (Ctrl-backslash), and the ones whose default ends it though nobody means a stop by them:
# SIGUSR1/2 (a `kill -USR1` meant to ask for progress, as dd answers it), SIGALRM,
# SIGVTALRM, SIGPROF and SIGXCPU (`ulimit -t`, a batch system's CPU limit). Under their
# default action the process ended at once and left `.README.md.tmp-…` beside the user's
# README (issue 41, the tenth hostile pass; the ninth made SIGTERM and SIGHUP raise).
_ENDING_SIGNALS = tuple(getattr(signal, name) for name in (
    "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGVTALRM", "SIGPROF",
    "SIGXCPU") if hasattr(signal, name))


def stop_like_ctrl_c() -> None:
    """SIGTERM and SIGHUP raise ``Terminated`` (a ``KeyboardInterrupt``) in the main thread,
    so a ``kill``, Slurm's time limit or a closed terminal runs the cleanups Ctrl-C runs (each
    temporary beside an output removed, locks released, child processes stopped) where
    Python's default action ended the process at once (issue 41, the ninth hostile pass); so
    do the other signals that end a process (``_ENDING_SIGNALS``, the tenth pass). A
    signal the caller ignores (``nohup``'s SIGHUP) stays ignored. Each of the three first stops
    the kit's running child processes (``runner.stop_children``)."""
    sys.unraisablehook = _unraisable
    for signum in _ENDING_SIGNALS:
        if signal.getsignal(signum) == signal.SIG_DFL:
            signal.signal(signum, _raise_terminated)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        # Ctrl-C as before, and every child stopped too (a `kill -INT` reaches the kit alone)
        signal.signal(signal.SIGINT, _raise_interrupt)


def run() -> None:
    """The command line, with a Ctrl-C (SIGTERM, SIGHUP) before or after click takes over as
    one line and exit 130 (143, 129) (click's own handling starts only once ``main`` runs; the
    lazy imports of a command happen inside it). The standard streams are made safe first
    (``stdio``): a closed one is ``/dev/null``, text they cannot encode is escaped, and a stdout
    that cannot be written (``--help > /dev/full``) is one message, not a traceback."""
    standard_streams()
    no_world_writable()
    leave_out_relative_path()
    _SIGNALS.clear()
    _REDELIVER.clear()
    _ENDED[0] = False
    _STATUS[0] = _UNSET
    try:
        try:
            _command()
        except StreamWriteError as exc:
            _ENDED[0] = True
            cause, fix = output_failed(exc)
            click.echo(f"error: {escaped(cause)}\nTo fix: {escaped(fix)}", err=True)
            sys.exit(2)
        except KeyboardInterrupt as exc:
            _interrupted(exc)
    except SystemExit as exc:
        _STATUS[0] = exc.code  # how the command ended, for a signal during the shutdown
        raise
    finally:
        _ENDED[0] = True
        # the command has ended (its message printed): a signal during the interpreter's
        # shutdown ends the process at once, never "Exception ignored in <module 'threading'>
        # ... KeyboardInterrupt" (issue 41, the ninth hostile pass), with the status the
        # command ended with: the first stop signal's after a stop (under the default action a
        # TERM's stop that an INT met during the shutdown read as killed by SIGINT, the
        # thirteenth pass), the command's own after it finished (killed by the signal, the
        # fourteenth and fifteenth passes: an error's exit 4 read as killed by SIGTERM)
        ours = []
        for signum in (*_ENDING_SIGNALS, signal.SIGINT):
            if signal.getsignal(signum) in (_raise_terminated, _raise_interrupt,
                                            signal.default_int_handler):
                signal.signal(signum, _exit_as_first)
                ours.append(signum)
        if ours:
            atexit.register(_block_at_finalisation, ours)


def _command() -> None:
    """The command itself, with the kit's signal handling (``run``'s own code only reports
    how it ended: ``_ending``)."""
    stop_like_ctrl_c()
    try:
        main()
    finally:
        sys.stdout.flush()


def _block_at_finalisation(signums: list[int]) -> None:
    """Once the command has ended, the last Python code before the interpreter resets every
    handler it installed to the default action (and tears its modules down): the stop signals are
    blocked from here on, so one that comes during the teardown stays pending and the process
    exits with the status the command ended with. Under the default action it was killed by
    the later signal: "stopped by SIGTERM", then killed by SIGINT (issue 41, the fourteenth
    hostile pass: 3 of 30 signal storms against `fetch --repair`); an error's message, then
    killed by SIGTERM (the fifteenth: 2 of 60 storms against a failing `apply`).

    Then ignored, too: the mask holds for this thread only, and a signal sent to the process
    goes to any thread that does not block it (numpy's OpenBLAS workers, which `report`'s
    plots start), where, once the teardown had reset the handlers, its default action killed
    the process: "stopped by SIGTERM", then killed by SIGHUP (38 of 40 storms against `report`;
    issue 41, the fifteenth hostile pass). The teardown leaves an ignored signal ignored."""
    with suppress(OSError, ValueError):
        signal.pthread_sigmask(signal.SIG_BLOCK, signums)
    for signum in signums:
        with suppress(OSError, ValueError):
            signal.signal(signum, signal.SIG_IGN)


_UNSET = object()
_STATUS: list[object] = [_UNSET]  # the command's ``SystemExit`` code, once it has ended


def _exit_as_first(signum: int, frame: object) -> None:
    """A signal once the command has ended (its message printed, its cleanups run): exit at
    once with the status it ended with: the first stop signal's (128 + it) after a stop, as
    its message said, or the command's own (a stop that lands once it has ended is counted,
    never acted on: the thirteenth hostile pass)."""
    code = _STATUS[0]
    if code is _UNSET:  # ended by an exception that is no exit (a bug's traceback)
        status = 128 + (_SIGNALS[0] if _SIGNALS else signum)
    elif code is None:
        status = 0  # ``sys.exit()``
    elif isinstance(code, int):
        status = code & 0xFF
    else:
        status = 1  # a message for a code: Python prints it and exits 1
    os._exit(status)


if __name__ == "__main__":  # pragma: no cover
    run()
