"""The README's timings as measured, not typed (issue 42: the README said 18.6-22.7 min for the
main job and "seconds" for the unit loop where a fresh machine took 40.5 min and 98 s).

A timing run is a small JSON file (``docs/timings/<date>-fresh-machine.json``; not under
docs/results, whose folders are benchmark runs with a provenance.json each): the machine, and
per command run its commit, the exact command, how it was run (what was fresh,
what else shared the machine), its exit code and wall time, and where the figure comes from.
A markdown block ``<!-- timings PATH -->`` ... ``<!-- /timings -->`` (PATH relative to the
markdown file) is that file rendered as a table; ``kvprefetch report --readme`` regenerates it
beside the report blocks, and ``--check`` (tests/unit/test_readme_reports.py) fails on any
difference. Pure: text in, text out."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from .errors import ConfigError

TIMINGS_BLOCK = re.compile(r"(<!-- timings (\S+) -->\n)(.*?)(<!-- /timings -->)", re.DOTALL)
_RUN_FIELDS = ("what", "command", "commit", "how", "exit", "wall_s", "source")


def load_timings(path: Path) -> dict[str, Any]:
    """The timing file at ``path``, checked: a ``machine`` and ``runs``, each run with every
    field of ``_RUN_FIELDS``."""
    from .reading import load_json

    try:  # size-capped, never a FIFO; JSON nested too deep is a bad file, not a traceback
        doc = load_json(Path(path), 1 << 20)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the timing file {path}: {exc}",
                          "point the timings block at a committed timings.json") from exc
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if not isinstance(runs, list) or not runs or not isinstance(doc.get("machine"), str):
        raise ConfigError(f"{path} has no machine or no runs",
                          "write {\"machine\": ..., \"runs\": [...]} (kvprefetch/timings.py)")
    if not _one_line(doc["machine"], printable=False):
        raise ConfigError(f"{path}: its machine is not one line of text",
                          "give the machine as text on one line, without `<!--` or `-->`")
    for run in runs:
        missing = [f for f in _RUN_FIELDS if not isinstance(run, dict) or f not in run]
        if missing:
            raise ConfigError(f"{path}: a run lacks {', '.join(missing)}",
                              f"give every run {', '.join(_RUN_FIELDS)}")
        bad = _bad_fields(run)
        if bad:
            raise ConfigError(f"{path}: a run's {', '.join(bad)} is not what a timing holds",
                              "give text (one line, no `<!--` or `-->`) for what, command, "
                              "commit, how and source, an integer exit code and wall_s in "
                              "seconds (a number >= 0)")
    return doc


def _bad_fields(run: dict[str, Any]) -> list[str]:
    """The fields of a run ``timings_table`` cannot render as one table row (issue 41, the
    fifth hostile pass: a wall_s of null, text or a list was a TypeError traceback)."""
    bad = [f for f in ("what", "command", "commit", "how", "source") if not _one_line(run[f])]
    if not isinstance(run["exit"], int) or isinstance(run["exit"], bool):
        bad.append("exit")
    wall = run["wall_s"]
    # no wall time is near a float's limit: a 400-digit integer made math.isfinite (and the
    # minutes) an OverflowError traceback (issue 41, the nineteenth hostile pass)
    if not isinstance(wall, (int, float)) or isinstance(wall, bool) \
            or not -1e300 < wall < 1e300 or not math.isfinite(wall) or wall < 0:
        bad.append("wall_s")
    return bad


def _one_line(text: object, *, printable: bool = True) -> bool:
    """``text`` fits one row of the block: printable, and no comment marker. A machine of
    several lines, or a field holding ``<!-- /timings -->``, ended the block early, and every
    later `report --readme` copied the rest of it after the block again: the README grew by a
    line a run and ``--check`` never passed (issue 41, the thirtieth hostile pass; the seventh
    found the same in a report block's names)."""
    if not isinstance(text, str) or "<!--" in text or "-->" in text:
        return False
    if printable:
        return text.isprintable()
    # the machine: a lone surrogate is left to the write, which names its line
    return not any(ord(c) < 32 or 0x7f <= ord(c) < 0xa0 or c in "\u2028\u2029" for c in text)


def minutes(seconds: float) -> str:
    """``2430`` -> ``40.5 min``; under two minutes in seconds (``98 s``)."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def latest_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last run of each command, in the file's order: what a reader runs today. The file
    keeps every run (the README's table had grown to 30 rows of history)."""
    last = {r["command"]: i for i, r in enumerate(runs)}
    return [r for i, r in enumerate(runs) if last[r["command"]] == i]


def timings_table(doc: dict[str, Any]) -> str:
    """The block's lines: the last run of each command, the count of earlier runs the file
    keeps, then the machine."""
    rows = ["| what | command | wall time | exit | commit | how it ran | source |",
            "|---|---|---|---|---|---|---|"]
    shown = latest_runs(doc["runs"])
    for r in shown:
        rows.append(f"| {r['what']} | `{r['command']}` | {minutes(float(r['wall_s']))} | "
                    f"{r['exit']} | `{str(r['commit'])[:7]}` | {r['how']} | {r['source']} |")
    earlier = len(doc["runs"]) - len(shown)
    kept = (f" The file keeps {earlier} earlier run{'s' if earlier > 1 else ''} of these "
            "commands." if earlier else "")
    return "\n".join(rows) + f"\n\nThe last run of each command.{kept} Machine: {doc['machine']}.\n"


def refresh_timings(text: str, root: Path) -> tuple[str, list[str]]:
    """``text`` with every timings block regenerated from its file (relative to ``root``), and
    the paths of the blocks whose lines changed."""
    changed: list[str] = []

    def fill(m: re.Match[str]) -> str:
        body = timings_table(load_timings(root / m[2]))
        if body != m[3]:
            changed.append(m[2])
        return m[1] + body + m[4]

    return TIMINGS_BLOCK.sub(fill, text), changed
