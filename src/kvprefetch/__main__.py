"""``python -m kvprefetch`` runs the CLI (useful where the console script is not installed), and
``main`` is the console script's entry point too.

A Ctrl-C while the command line is still being imported is the same one line as a Ctrl-C
later (issue 41, third pass: one sent in the first 0.1 s printed a KeyboardInterrupt
traceback). The console script imported ``kvprefetch.cli`` (click and the rest) itself, outside
any handler, and printed that traceback still (issue 41, the ninth hostile pass); it now starts
here, where only ``sys`` is imported before the guard.

A Ctrl-C that lands while Python runs code whose exceptions it ignores (importlib's module-lock
weakref callback, a ``__del__``) is printed as "Exception ignored ... KeyboardInterrupt" and
dropped: the command then ran on to its end, exit 0 (a fresh CI rehearsal of issue 41's
twenty-second pass, 1 run). The command line's own hook (``cli.stop_like_ctrl_c``) takes such a
stop back once it is installed; until then ``_keep_dropped_stops`` keeps it, and the stop is
raised as soon as the import is done."""

import os
import sys


def _working_folder_first() -> bool:
    """Whether ``sys.path[0]`` is the working folder ``-m`` put there. A working folder deleted
    after the shell entered it is none (``-m`` then puts nothing first): ``os.getcwd()`` raised
    there, a FileNotFoundError traceback before any command ran (issue 41, the twenty-seventh
    hostile pass), where the command line now says to ``cd`` into an existing folder."""
    if not sys.path or sys.path[0] == "":
        return bool(sys.path)
    try:
        return sys.path[0] == os.getcwd()
    except OSError:
        return False


if __name__ == "__main__" and _working_folder_first():
    # ``python -m`` puts its working folder first on ``sys.path``, and a user's is often the
    # work directory (``cd W && python -m kvprefetch ... --workdir .``): a ``click.py`` or
    # ``git/`` planted there ran at the command line's import, then a traceback (issue 41, the
    # twenty-sixth hostile pass). The kit itself is found already; what it imports later is not
    # looked for there.
    del sys.path[0]

_DROPPED: list[BaseException] = []  # stops Python dropped during the import of the command line


def _keep_dropped_stops(args: "sys.UnraisableHookArgs") -> None:
    if isinstance(args.exc_value, KeyboardInterrupt):
        _DROPPED.append(args.exc_value)
        return
    sys.__unraisablehook__(args)


def main() -> None:
    sys.unraisablehook = _keep_dropped_stops
    try:
        from .cli import run

        if _DROPPED:
            raise _DROPPED[0]
    except KeyboardInterrupt:
        print("interrupted: nothing was changed; rerun the command", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:
        # a module the command line imports (click, or one named like a standard module,
        # planted on PYTHONPATH or broken) raising: one message, as later (issue 41, the tenth
        # hostile pass: a `click.py` raising on import was a traceback)
        from .errors import ConfigError, third_party_failed, third_party_origin

        origin = third_party_origin(exc, kit=("kvprefetch",))
        if origin is None or "--debug" in sys.argv[1:]:
            raise
        err = ConfigError(*third_party_failed(exc, *origin))
        try:  # the planted module's path, escaped (a name with ESC reached the terminal raw)
            from .console import escaped

            text = escaped(err.message)
        except Exception:  # noqa: BLE001 -- a planted module may break it too
            text = ascii(err.message)
        print(f"error: {text}", file=sys.stderr)
        sys.exit(err.exit_code)
    run()


if __name__ == "__main__":
    main()
