"""The README's report blocks: the lines between ``<!-- report PATH KIND -->`` and
``<!-- /report -->`` that ``kvprefetch report --readme`` regenerates from committed results
(a kernel or decode result's tables, a sampled run's seeds, twins, bounds, host and
attribution tables, a folder of decode runs)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import BenchError
from .documents import load_document, reading
from .report import render_markdown
from .schema import DecodeDocument, Document, SampleDocument

# A block of a markdown file (the README) that `kvprefetch report --readme` regenerates from a
# committed result JSON: `<!-- report PATH KIND -->`, the lines, `<!-- /report -->`. PATH is
# relative to the markdown file's folder; KIND is `summary` (the summary table) or `shapes` (the
# per-shape table of a `bench kernel` result, one preset, dtype and block size; the per-workload
# table of a `bench decode` result); for sampled benchmarks (`bench kernel --sample`),
# `attribution` (what each mechanism is worth, one result), `seeds` (PATH a run's folder: the
# distribution of every sample-*.json[.gz] in it, one row per seed and timing), `twins` (PATH
# a run's folder: the steps with twins compiled, by the twin `auto`'s rule runs there),
# `bounds` (the v1 steps of launch-bounded instantiations, by the code the rule runs there) and
# `host` (PATH a run's folder: each variant's extra host time per call on host-bound steps);
# `twins`, `bounds` and `host` take one result too; `decode` (PATH a run's folder: every
# decode-*.json[.gz] in it, one row per model and context: decode_points_table).
SAMPLE_KINDS = ("seeds", "twins", "bounds", "host", "attribution")
README_BLOCK = re.compile(
    r"(<!-- report (\S+) (summary|shapes|seeds|twins|bounds|host|attribution|decode) -->\n)"
    r"(.*?)"
    r"(<!-- /report -->)",
    re.DOTALL)
_BLOCK_HEADS = {"summary": ("| mode |", "| tree |"), "shapes": ("| batch |", "| workload |")}


def report_block(doc: Document, kind: str) -> str:
    """The lines of the result's markdown (``render_markdown``) a README block of ``kind``
    shows."""
    md = render_markdown(doc).splitlines()
    start = next((i for i, line in enumerate(md) if line.startswith(_BLOCK_HEADS[kind])), None)
    if start is None:
        raise BenchError(f"the result has no {kind} table",
                         "point the README block at a `bench kernel` or `bench decode` result")
    end = start
    while end < len(md) and md[end].startswith("|"):
        end += 1
    return "\n".join(md[start:end]) + "\n"


def check_block_names(text: str) -> None:
    """Every file or folder a report or timings block names is the same bytes under this
    locale as the README's UTF-8 text. Under GBK or Big5 a block naming ``中.json`` (UTF-8) was
    looked for under another name: "No such file / To fix: pass a JSON file written by
    kvprefetch", where it lies beside the README (or another file of that name was read into
    the block; issue 41, the twenty-eighth hostile pass)."""
    import sys

    from ..oserrors import other_bytes_on_disk
    from ..timings import TIMINGS_BLOCK

    for m in (*README_BLOCK.finditer(text), *TIMINGS_BLOCK.finditer(text)):
        if other_bytes_on_disk(m[2]):
            raise BenchError(f"a block of the markdown file names {m[2][:80]!r}, which is, under "
                             f"this locale's encoding ({sys.getfilesystemencoding()}), another "
                             "file name than the file's UTF-8 text",
                             "run kvprefetch under a UTF-8 locale (e.g. `LC_ALL=C.UTF-8`), or "
                             "name the results by ASCII paths in the blocks")


# What `report --readme` takes for a block's first and last line, of every kind it regenerates
# (report, timings, commands: README_BLOCK, timings.TIMINGS_BLOCK, cli.report.COMMANDS_BLOCK).
_OPENS = re.compile(r"<!-- (?:report \S+ (?:summary|shapes|seeds|twins|bounds|host|attribution"
                    r"|decode) |timings \S+ |commands )-->\n")
_CLOSES = re.compile(r"<!-- /(report|timings|commands) -->")


def check_block_nesting(text: str) -> None:
    """Every block is closed by its own end marker before the next block opens. A block left
    open (its ``<!-- /report -->`` forgotten or mistyped) was regenerated up to the next
    block's end marker: the user's text between, and the next block's first line, were
    replaced by the table without a word, and ``--check``'s fix was the command that did it
    (issue 41, the thirtieth hostile pass)."""
    crlf = re.search(r"<!-- (?:report \S+ \S+ |timings \S+ |commands )-->\r\n", text)
    if crlf:  # no block matched: "up to date", and --check "every block matches", of none
        raise BenchError(f"the block at line {text.count(chr(10), 0, crlf.start()) + 1} "
                         f"({crlf[0].strip()!r}) ends its line with CRLF (Windows line ends), "
                         "so kvprefetch finds no block there and would regenerate nothing",
                         "convert the file to LF line ends (e.g. `dos2unix FILE` or "
                         "`sed -i 's/\\r$//' FILE`), then rerun `kvprefetch report --readme`")
    marks = sorted([(m.start(), m[0].split()[1], m[0]) for m in _OPENS.finditer(text)]
                   + [(m.start(), "/" + m[1], m[0]) for m in _CLOSES.finditer(text)])
    for i, (at, kind, mark) in enumerate(marks):
        if kind.startswith("/"):
            continue
        line = text.count("\n", 0, at) + 1
        nxt = marks[i + 1] if i + 1 < len(marks) else None
        if nxt is not None and nxt[1] == "/" + kind:
            continue
        where = ("the file ends, so it would never be regenerated" if nxt is None else
                 f"line {text.count(chr(10), 0, nxt[0]) + 1} holds {nxt[2].strip()!r}; "
                 "regenerating it would replace every line up to the next end marker, text "
                 "of yours included")
        raise BenchError(f"the block opened at line {line} ({mark.strip()!r}) is not closed by "
                         f"`<!-- /{kind} -->` before {where}; nothing was written",
                         f"close the block with `<!-- /{kind} -->` on the line after its "
                         "table, then rerun `kvprefetch report --readme`")


def refresh_blocks(text: str, root: Path) -> tuple[str, list[str]]:
    """``text`` with every report block regenerated from its JSON (relative to ``root``), and
    the paths of the blocks whose lines changed."""
    changed: list[str] = []

    def fill(m: re.Match[str]) -> str:
        try:
            os.lstat(root / m[2])
        except FileNotFoundError:
            # the reader's fix was "pass a JSON file written by kvprefetch bench", where the
            # block names it (issue 41, the thirtieth hostile pass)
            raise BenchError(f"the report block `<!-- report {m[2][:80]} {m[3]} -->` names "
                             f"{str(root / m[2])[:200]}, which does not exist",
                             "point the block at a result file or run folder that exists, "
                             "relative to the markdown file") from None
        except (OSError, ValueError):
            pass  # a name no file can have, a folder not entered: the reading below names it
        try:
            with reading(root / m[2]):
                if m[3] == "decode":
                    body = decode_block(root / m[2])
                elif m[3] in SAMPLE_KINDS:
                    body = sample_block(root / m[2], m[3])
                else:
                    body = report_block(load_document(root / m[2]), m[3])
        except OSError as exc:
            # a block naming a path no file can have (a name past 255 bytes) or a folder that
            # cannot be entered: the command line's fix for it was "use a shorter path ... (the
            # --workdir, -o/--out or campaign folder that named it)", where the block named it
            # (issue 41, the twenty-third hostile pass)
            raise BenchError(f"the report block `<!-- report {m[2][:80]} {m[3]} -->` names "
                             f"{str(root / m[2])[:200]}, which cannot be read "
                             f"({exc.strerror})", "point the block at a result file or run "
                             "folder that exists, relative to the markdown file") from None
        _check_body(body, root / m[2])
        if body != m[4]:
            changed.append(m[2])
        return m[1] + body + m[5]

    return README_BLOCK.sub(fill, text), changed


def _check_body(body: str, path: Path) -> None:
    """A block's lines are table rows and nothing else: a text field of a result (a model's or
    a variant's name) holding a newline, a control character or ``<!--`` would end the block
    early, and every later run would copy the rest of it outside again, growing the README
    (issue 41, the seventh hostile pass)."""
    for line in body.splitlines():
        bad = (not line.startswith("|") or "<!--" in line or "-->" in line
               or any(ord(c) < 32 or 0x7f <= ord(c) < 0xa0 or c in "\u2028\u2029"
                      for c in line))
        if bad:
            raise BenchError(f"{path}: a text field of the result would put {line[:80]!r} into "
                             "the README's block, which holds table rows only (a newline, a "
                             "control character or a comment marker in a name)",
                             "correct the field in the result (or regenerate it with `kvprefetch "
                             "bench`), then rerun `kvprefetch report --readme`")


def decode_block(path: Path) -> str:
    """A README block over the `bench decode` results of the folder ``path``
    (decode-*.json[.gz]): one row per model and context (decode_points_table)."""
    from .decode_report import decode_points_table

    files = sorted(p for p in Path(path).glob("decode-*.json*")
                   if p.name.endswith((".json", ".json.gz")))
    if not files:
        raise BenchError(f"{path} holds no decode-*.json[.gz]",
                         "point a `decode` block at a folder of `bench decode` runs")
    docs: list[DecodeDocument] = []
    for f in files:
        doc = load_document(f)
        if doc["kind"] != "decode":
            raise BenchError(f"{f} is not a `bench decode` result",
                             "keep only `bench decode` results named decode-*.json there")
        docs.append(doc)
    return "\n".join(decode_points_table(docs)) + "\n"


def sample_block(path: Path, kind: str) -> str:
    """A README block of a sampled benchmark: ``seeds`` over the sample-*.json[.gz] of the
    folder ``path``, ``attribution`` of the result ``path``, ``twins``, ``bounds`` and ``host``
    of either."""
    from .sample_report import (
        attribution_table,
        bounds_table,
        host_table,
        seeds_table,
        twins_table,
    )

    if kind in ("seeds", "twins", "bounds", "host"):
        one = kind != "seeds" and Path(path).is_file()
        files = [Path(path)] if one else sorted(
            p for p in Path(path).glob("sample-*.json*") if p.name.endswith((".json", ".json.gz")))
        if not files:
            raise BenchError(f"{path} holds no sample-*.json[.gz]",
                             f"point a `{kind}` block at a folder of `bench kernel --sample` runs")
        docs = sorted((_load_sample(f, kind) for f in files),
                      key=lambda d: d["meta"]["sample"]["seed"])
        table = {"seeds": seeds_table, "twins": twins_table, "bounds": bounds_table,
                 "host": host_table}[kind]
        return "\n".join(table(docs)) + "\n"
    doc = _load_sample(path, kind)
    names = {v["name"] for v in doc["meta"]["variants"]}
    lines = attribution_table(doc)
    if not names & {"launch", "gqa_off"} or len(lines) <= 2:
        raise BenchError(f"{path} has no attribution (the ablation trees did not run)",
                         "run the sample with --variant launch and --variant gqa_off too")
    return "\n".join(lines) + "\n"


def _load_sample(path: Path, kind: str) -> SampleDocument:
    doc = load_document(path)
    if doc["kind"] != "sample":
        raise BenchError(f"{path} is not a sampled benchmark",
                         f"point a `{kind}` block at a `bench kernel --sample` result or a "
                         "folder of them")
    return doc
