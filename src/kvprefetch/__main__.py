"""``python -m kvprefetch`` runs the CLI (useful where the console script is not installed).

A Ctrl-C while the command line is still being imported is the same one line as a Ctrl-C
later (issue 41, third pass: one sent in the first 0.1 s printed a KeyboardInterrupt
traceback); the console script gets the same from ``cli.run``."""

import sys

try:
    from .cli import run
except KeyboardInterrupt:
    print("interrupted: nothing was changed; rerun the command", file=sys.stderr)
    sys.exit(130)

run()
