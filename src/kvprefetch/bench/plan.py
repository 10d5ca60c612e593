"""What every ``bench`` plan shares: the output files it will write (``--out``, ``--name``,
``--formats``) and the refusals about the builds it compares (none found; the stock
``baseline`` not first). ``kernel_plan`` and ``decode_plan`` build on it. Pure: no torch, no
click.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from ..errors import BenchError, OptionError
from .schema import Document

FORMATS = ("json", "md", "png")


DocT = TypeVar("DocT", bound=Document)


@dataclass(frozen=True, kw_only=True)
class BenchRun(Generic[DocT]):
    """A finished run: its result document (what ``report`` renders) and the files written."""

    doc: DocT
    paths: tuple[Path, ...]


def parse_formats(text: str) -> tuple[str, ...]:
    """``json,md`` -> ``("json", "md")``; anything but json, md and png is refused."""
    out = tuple(f.strip() for f in text.split(",") if f.strip())
    bad = [f for f in out if f not in FORMATS]
    if bad:
        raise OptionError(f"unknown format(s) {', '.join(bad)}; use json, md, png")
    return out


def check_output_name(name: str, option: str = "--name") -> str:
    """``name`` when it is a plain file name (the base of ``<name>.json/.md/.png``), else an
    OptionError: a folder in it (``../../x``) would put the outputs outside ``--out``, and a
    control character into a file name (issue 41, third pass: ``bench --name`` took both)."""
    if name in ("", ".", "..") or "/" in name or "\x00" in name or any(
            ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise OptionError(f"{name!r} is not a file name (no folders, no control characters); "
                          "give the folder with --out", option)
    return name


def output_dir(out: Path | None, workdir: Path) -> Path:
    """``--out``, or ``<workdir>/bench``."""
    return out or workdir / "bench"


def output_paths(out_dir: Path, name: str, formats: Sequence[str]) -> list[str]:
    """The files a run writes, in the order of ``formats``."""
    return [str(out_dir / f"{name}.{f}") for f in formats]


def require_builds(trees: Sequence[str], workdir: Path) -> None:
    """A real run needs kernels-only builds (a dry run plans without them)."""
    if not trees:
        raise BenchError(f"no kernels-only builds under {workdir / 'build'}",
                         "run `kvprefetch build --kernels-only` on this machine first")


def require_baseline_first(trees: Sequence[str]) -> None:
    """Speedups and bitwise equality are relative to the stock build; never to another variant."""
    if not trees or trees[0] != "baseline":
        raise BenchError(f"the stock 'baseline' build is not among {list(trees)}",
                         "build it (`kvprefetch build --kernels-only`) and include it in --tree")
