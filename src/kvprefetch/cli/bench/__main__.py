"""``python -m kvprefetch.cli.bench ...`` (the device scripts) is ``kvprefetch bench ...``: the
same group through the same entry point, so the same error handling (cause + fix, the family's
exit code, OSError mapped, no traceback) and every subcommand."""

from __future__ import annotations

import sys

from .. import main

if __name__ == "__main__":  # pragma: no cover - exercised by scripts/device/*.sh
    main(["bench", *sys.argv[1:]], prog_name="kvprefetch")
