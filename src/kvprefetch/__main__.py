"""``python -m kvprefetch`` runs the CLI (useful where the console script is not installed), and
``main`` is the console script's entry point too.

A Ctrl-C while the command line is still being imported is the same one line as a Ctrl-C
later (issue 41, third pass: one sent in the first 0.1 s printed a KeyboardInterrupt
traceback). The console script imported ``kvprefetch.cli`` (click and the rest) itself, outside
any handler, and printed that traceback still (issue 41, the ninth hostile pass); it now starts
here, where only ``sys`` is imported before the guard."""

import sys


def main() -> None:
    try:
        from .cli import run
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
