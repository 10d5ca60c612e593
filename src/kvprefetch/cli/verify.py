"""CLI: verify-kernel. Progress while it runs (stderr), then a verdict-first summary; the
per-tree tables and every check's detail go to ``<workdir>/verify/report.txt`` (and to the
terminal with ``--verbose``), the machine form to ``report.json`` (and stdout with ``--json``)."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..console import emit_json, info, plain, rich_table
from ..console import say as say_line  # a function below has its own `say`
from .common import count_range, json_option, workdir_option

if TYPE_CHECKING:
    from ..verify.report import Check, VerifyReport

_MARK = {"pass": "✓", "fail": "✕", "not checked": "–"}


def _family(check: Check) -> str:
    """The family a check belongs to: its name up to the first comma (the forced-twin GPU passes
    are one family with the plain pass)."""
    return check.name.split(",")[0]


def summary_lines(rep: VerifyReport) -> list[str]:
    """The verdict, then one line per check family with its counts, then every failure in full
    and the not-checked reasons, then where the full report is."""
    checks = rep.checks
    counts = {s: sum(c.status == s for c in checks) for s in ("pass", "fail", "not checked")}
    trees = [t for t in rep.envs if t != "warning"]
    took = rep.timing.get("total_s")
    lines = [f"kvprefetch verify-kernel: {'PASSED' if rep.passed else 'FAILED'}  "
             f"({len(trees)} trees; {len(checks)} checks: {counts['pass']} passed, "
             f"{counts['fail']} failed, {counts['not checked']} not checked"
             + (f"; {took:.1f} s" if took is not None else "") + ")"]
    families: dict[str, list[Check]] = {}
    for c in checks:
        families.setdefault(_family(c), []).append(c)
    width = max(len(f) for f in families) if families else 0
    for fam, cs in families.items():
        n = {s: sum(c.status == s for c in cs) for s in ("pass", "fail", "not checked")}
        mark = _MARK["fail"] if n["fail"] else _MARK["pass"] if n["pass"] else _MARK["not checked"]
        parts = [f"{n['fail']} failed"] if n["fail"] else []
        parts += [f"{n['pass']} passed"] if n["pass"] else []
        parts += [f"{n['not checked']} not checked"] if n["not checked"] else []
        lines.append(f"  {mark} {fam.ljust(width)}  {', '.join(parts)}")
    failed = [c for c in checks if c.status == "fail"]
    if failed:
        lines.append("failed:")
        lines += [f"  ✕ {c.name} [{c.tree}]: {c.detail}" for c in failed]
    reasons: dict[tuple[str, str], list[Check]] = {}
    for c in checks:
        if c.status == "not checked":
            reasons.setdefault((_family(c), c.detail), []).append(c)
    if reasons:
        lines.append("not checked:")
        for (fam, detail), cs in reasons.items():
            where = ", ".join(dict.fromkeys(c.tree for c in cs))
            times = f" (x{len(cs)})" if len(cs) > 1 else ""
            lines.append(f"  – {fam}{times} [{where}]: {detail}")
    if "warning" in rep.envs:
        lines.append("warning: " + rep.envs["warning"])
    report = rep.report_path
    lines.append(f"full report: {report.with_suffix('.txt')} (JSON: {report})")
    return lines


def details_text(rep: VerifyReport, *, color: bool = False) -> str:
    """The per-tree UBLKPF tables and every check with its detail (what --verbose prints)."""
    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, width=160, no_color=not color, color_system=None if not color
                      else "auto", force_terminal=color)

    def table(headers: list[str], rows: list[list[object]], title: str) -> None:
        console.print(rich_table(headers, rows, title))

    for tree, s in rep.sass.items():
        if "table" not in s:
            continue
        table(["arch", "head", "block", "dtype", "kv cache", "kernels", "UBLKPF min", "max"],
              [[r["arch"], r["head_size"], r["block_size"], r["dtype"], r["kv_cache"],
                r["kernels"], r["ublkpf_min"], r["ublkpf_max"]] for r in s["table"]],
              title=f"{tree}: {s['library']}")
    table(["check", "tree", "status", "detail"],
          [[c.name, c.tree, c.status.upper(), c.detail] for c in rep.checks],
          title="kvprefetch verify-kernel: " + ("PASSED" if rep.passed else "FAILED"))
    return buf.getvalue()


@contextmanager
def _progress() -> Iterator[Callable[[str], None]]:
    """Progress lines on stderr: under a rich spinner on a terminal, plain lines otherwise or
    with NO_COLOR."""
    if not (sys.stderr.isatty() and "NO_COLOR" not in os.environ):
        yield info
        return
    from rich.console import Console
    from rich.text import Text

    console = Console(stderr=True, highlight=False)
    with console.status("verify-kernel: starting") as status:
        def say(msg: str) -> None:
            console.print(plain(msg), soft_wrap=True)
            status.update(Text(f"running; last: {msg.strip()}", no_wrap=True, overflow="ellipsis"))
        yield say


@click.command("verify-kernel")
@workdir_option
@click.option("--trees", default=None, help="Comma-separated trees (default: every built tree).")
@click.option("--no-gpu", is_flag=True,
              help="Skip the GPU identity check (reported as not checked).")
@click.option("--jobs", "-j", type=count_range(1), default=None,
              help="Probes and disassemblies at a time (default: one per CPU).")
@click.option("--verbose", "-v", is_flag=True,
              help="Also print the per-tree UBLKPF tables and every check's detail.")
@json_option
def verify_kernel(workdir: Path, trees: str | None, no_gpu: bool, jobs: int | None,
                  verbose: bool, as_json: bool) -> None:
    """Prove which library each env loads, that UBLKPF is in its SASS, and bitwise outputs.

    Prints a verdict-first summary; the full report is written to <workdir>/verify/report.txt
    (and report.json). Each library's disassembly is cached by its sha256 in
    <workdir>/verify/cache, so a second run takes seconds."""
    from ..errors import VerifyError
    from ..verify.kernel import verify
    from ..workspace.confine import write_file

    with _progress() as say:
        rep = verify(workdir, trees=[t for t in trees.split(",") if t] if trees else None,
                     no_gpu=no_gpu, jobs=jobs, progress=say)
    text = details_text(rep)
    write_file(rep.report_path.with_suffix(".txt"), text + "\n".join(summary_lines(rep)) + "\n",
               root=Path(workdir), family=VerifyError)
    if as_json:
        emit_json(rep.to_dict())
    else:
        if verbose:
            sys.stdout.write(details_text(rep, color=sys.stdout.isatty()
                                          and "NO_COLOR" not in os.environ))
        say_line("\n".join(summary_lines(rep)))
    if not rep.passed:
        sys.exit(6)
