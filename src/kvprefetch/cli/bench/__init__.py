"""``kvprefetch bench``: the group, one module per subcommand (kernel, decode, ncu, e2e), each
a thin click layer over ``kvprefetch.bench``: it parses the command line into the library's
options, calls the library's plan (``--dry-run`` prints or, with ``--json``, emits it and
touches no GPU) and run, and renders the result. Nothing here imports torch at import time.

``python -m kvprefetch.cli.bench`` (the device scripts) is ``kvprefetch bench`` (__main__.py).
"""

from __future__ import annotations

import click

from .decode import decode
from .e2e import e2e
from .kernel import kernel
from .ncu import ncu


@click.group()
def bench() -> None:
    """Benchmark stock vs patched decode attention (kernel, ncu) and vLLM end to end (e2e)."""


for _command in (kernel, ncu, e2e, decode):
    bench.add_command(_command)
