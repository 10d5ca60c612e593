"""Output helpers shared by the commands: JSON emission, timed steps with ✓/✕, and tables.
Color only on a TTY and never with NO_COLOR (rich handles both)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any


def _default(o: Any) -> Any:
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.asdict(o)
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, Enum):
        return o.value
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    if hasattr(o, "to_dict"):
        return o.to_dict()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def to_json(obj: Any) -> str:
    return json.dumps(obj, default=_default, indent=2, sort_keys=False)


def emit_json(obj: Any) -> None:
    sys.stdout.write(to_json(obj) + "\n")
    sys.stdout.flush()


def _color() -> bool:
    return sys.stderr.isatty() and "NO_COLOR" not in os.environ


def escaped(value: object) -> str:
    """``value`` as text the terminal shows and never obeys: every control character but a
    newline and a tab escaped as Python writes it (``\\x1b``). A path typed with an escape
    sequence, or a file name in the work directory made by whoever can write there, printed in
    a message or a table retitled, cleared or recoloured the user's terminal (issue 41, the
    eleventh and twelfth hostile passes; Slurm's values are capped too, ``cluster.shown``).
    click strips only colour sequences, and only off a terminal."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch in "\n\t"
                   # a byte a path held that is not UTF-8 (surrogateescape): that byte
                   else f"\\x{ord(ch) - 0xDC00:02x}" if 0xDC80 <= ord(ch) <= 0xDCFF
                   else ascii(ch)[1:-1] for ch in text)


def one_line(value: object) -> str:
    """``value`` escaped (``escaped``), its newlines and tabs too: a name from the work directory
    in a listing of one entry per line. A file named ``x\nremoved important`` in ``build/``
    printed a line of its own in ``clean``'s listing, "removed important", a deletion that never
    happened (issue 41, the twenty-second pass left it open)."""
    return escaped(value).replace("\n", "\\n").replace("\t", "\\t")


def say(value: object, *, err: bool = False, nl: bool = True) -> None:
    """A command's line of output (stdout, or stderr with ``err``), ``escaped``: the
    ``click.echo`` lines of the commands printed paths and names as they were, so a work
    directory named with ESC or a C1 byte reached the terminal raw (issue 41, the twelfth pass
    left it open). Data a command prints for a program to read (a diff, a script, Markdown,
    JSON) goes out as it is, through ``click.echo``."""
    import click

    click.echo(escaped(value), err=err, nl=nl)


def info(msg: str) -> None:
    """Progress and notices go to stderr so that stdout stays clean for --json."""
    print(escaped(msg), file=sys.stderr, flush=True)


@contextmanager
def step(label: str) -> Iterator[None]:
    """A timed step: prints ``✓ label (1.2 s)`` or ``✕ label (1.2 s)``."""
    t0 = time.monotonic()
    ok, bad = ("\x1b[32m✓\x1b[0m", "\x1b[31m✕\x1b[0m") if _color() else ("✓", "✕")
    label = escaped(label)
    try:
        yield
    except BaseException:
        print(f"{bad} {label} ({time.monotonic() - t0:.1f} s)", file=sys.stderr, flush=True)
        raise
    print(f"{ok} {label} ({time.monotonic() - t0:.1f} s)", file=sys.stderr, flush=True)


def plain(value: object) -> Any:
    """``value`` as a rich ``Text`` that shows it as it is. A plain ``str`` given to rich is
    read as markup and emoji codes: a path, a Slurm reason or a detail holding ``[red]`` or
    ``:smile:`` was shown without them (doctor printed a work directory
    ``/tmp/w[red]y`` as ``/tmp/wy``), and one holding ``[/x]`` stopped the command with rich's
    MarkupError, which the command line then blamed on a broken rich ("repair or reinstall
    it"; issue 41, the eleventh hostile pass)."""
    from rich.text import Text

    return Text(escaped(value))


def rich_table(headers: Sequence[str], rows: Sequence[Sequence[Any]],
               title: str | None = None) -> Any:
    """A rich ``Table`` of ``rows``, every header, cell and the title shown as it is
    (``plain``), whole: a word longer than its column (a work directory's path) is folded onto
    the next lines, never cut to an ellipsis (doctor showed a long work directory as
    ``/tmp/.../test_a_table_shows_a_path_as_i0…``, its end lost)."""
    from rich.table import Table

    t = Table(title=plain(title) if title is not None else None, show_lines=False)
    for h in headers:
        t.add_column(plain(h), overflow="fold")
    for r in rows:
        t.add_row(*(plain(c) for c in r))
    return t


# The most rows a table shows on the terminal. rich lays a row out in some milliseconds, so the
# 100 000 shapes a bench plan may hold (bench.matrix.MAX_SHAPES) kept `bench decode --dry-run`
# drawing for minutes after its plan was made in seconds (issue 41, the twenty-first hostile
# pass); a thousand rows is more than anyone reads, and draws in a few seconds.
MAX_TABLE_ROWS = 1000


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    """Render a table to stdout with rich (plain text when not a TTY): its first
    ``MAX_TABLE_ROWS`` rows, and a line saying how many more there are."""
    from rich.console import Console

    console = Console(no_color="NO_COLOR" in os.environ, width=max(100, 160))
    console.print(rich_table(headers, rows[:MAX_TABLE_ROWS], title))
    if len(rows) > MAX_TABLE_ROWS:
        console.print(f"... and {len(rows) - MAX_TABLE_ROWS} more rows, not shown (the first "
                      f"{MAX_TABLE_ROWS} are above; --json, where the command has it, lists "
                      "every one)", markup=False, highlight=False)
