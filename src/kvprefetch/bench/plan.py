"""What every ``bench`` plan shares: the output files it will write (``--out``, ``--name``,
``--formats``) and the refusals about the builds it compares (none found; the stock
``baseline`` not first). ``kernel_plan`` and ``decode_plan`` build on it. Pure: no torch, no
click.
"""

from __future__ import annotations

import math
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


@dataclass(frozen=True)
class Bound:
    """A numeric option's meaningful range (issue 41, fourth pass: NaN, negative and huge values
    were accepted and failed later, or never). ``low`` <= value <= ``high`` (``low`` itself
    excluded where ``low_open``), a finite number (NaN compares false with every bound, and
    infinity cannot size anything), a whole one where ``integer``. The reason for each range
    is written where its ``Bound`` is defined. The command line checks the same ``Bound``
    (cli/common.py ``BoundedNumber``), so both name the option and the range."""

    option: str
    low: float
    high: float
    low_open: bool = False
    integer: bool = False

    def describe(self) -> str:
        what = "a whole number" if self.integer else "a finite number"
        return f"{what} {'>' if self.low_open else '>='} {self.low:.12g} and <= {self.high:.12g}"

    def check(self, value: object) -> float:
        """``value`` when it lies in the range, else an OptionError naming the option."""
        # a whole number is finite: math.isfinite converts it to a float, and one past 1e308
        # (`--steps` of 400 digits) was an OverflowError traceback (issue 41, the nineteenth
        # hostile pass)
        ok = (isinstance(value, int | float) and not isinstance(value, bool)
              and (isinstance(value, int) or not self.integer)
              and (isinstance(value, int) or math.isfinite(value))
              and (value > self.low if self.low_open else value >= self.low)
              and value <= self.high)
        if not ok:
            raise OptionError(f"{value!r} is not {self.describe()}", self.option)
        return value  # type: ignore[return-value]


def check_bounds(values: Sequence[tuple[Bound, object]]) -> None:
    """Each value against its bound (the first out of range is refused)."""
    for bound, value in values:
        bound.check(value)


def parse_formats(text: str) -> tuple[str, ...]:
    """``json,md`` -> ``("json", "md")``; anything but json, md and png is refused."""
    out = tuple(f.strip() for f in text.split(",") if f.strip())
    bad = [f for f in out if f not in FORMATS]
    if bad:
        raise OptionError(f"unknown format(s) {', '.join(bad)}; use json, md, png", "--formats")
    if not out:
        # a run that writes nothing would measure for nothing (issue 41, eighth pass)
        raise OptionError(f"{text!r} names no format, so the run would write nothing; "
                          "use one or more of json, md, png", "--formats")
    return out


def check_output_name(name: str, option: str = "--name") -> str:
    """``name`` when it is a plain file name (the base of ``<name>.json/.md/.png``), else an
    OptionError: a folder in it (``../../x``) would put the outputs outside ``--out``, and a
    control character into a file name (issue 41, third pass: ``bench --name`` took both)."""
    if name in ("", ".", "..") or "/" in name or "\x00" in name or any(
            ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise OptionError(f"{name!r} is not a file name (no folders, no control characters); "
                          "give the folder with --out", option)
    if _name_bytes(name) + len(".json") > NAME_MAX:
        # `<name>.json` is the longest output name: a name of 251 to 255 bytes passed, the run
        # measured, and writing its outputs said "File name too long / To fix: use a shorter
        # path ... (the --workdir, -o/--out or campaign folder that named it)", which the
        # folder was not (issue 41, the thirty-first hostile pass)
        raise OptionError(f"{name[:40]!r}... ({_name_bytes(name)} bytes) is too long a name: "
                          f"its outputs' names (<name>.json) must fit Linux's {NAME_MAX} bytes "
                          "in one name", option)
    return name


NAME_MAX = 255  # bytes in one name of a path (Linux)


def _name_bytes(name: str) -> int:
    """``name``'s length on disk: a byte read with Python's ``surrogateescape`` is one byte."""
    try:
        return len(name.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:  # a lone surrogate no byte stands for
        return len(name.encode("utf-8", "surrogatepass"))


def output_dir(out: Path | None, workdir: Path) -> Path:
    """``--out``, or ``<workdir>/bench``. The work directory is recorded as one
    (``confine.trust_root``): what a bench run makes under it (``make_dir``) and the logs it
    writes there (``runner.open_log``) go from it down, never through a link in it."""
    from ..workspace.confine import trust_root

    trust_root(workdir)
    return _dotdot_as_the_kernel(out) if out else workdir / "bench"


def _dotdot_as_the_kernel(out: Path) -> Path:
    """``out`` with its ``..`` read as the kernel reads them (the part up to the last one
    resolved, links first): the confined acts below a work directory fold ``..`` by name, the
    programs a run starts in the folder (vLLM's working folder) do not. ``--out WD/L/../new``
    with ``L`` a link elsewhere had ``bench ncu`` write its CSVs and logs into ``WD/new``, a
    folder nobody named, and its documents into the folder the path names; ``bench e2e``
    failed with "No such file or directory / check the path" (issue 41, the thirty-fourth
    hostile pass)."""
    from ..workspace.confine import kernel_path

    parts = out.parts
    if ".." not in parts:
        return out
    last = len(parts) - parts[::-1].index("..")
    # a link to nothing or a loop before it is refused (``kernel_path``): realpath read the
    # link's target by name and made its folders (the thirty-fifth pass)
    return kernel_path(Path(*parts[:last]), family=BenchError).joinpath(*parts[last:])


def make_dir(d: Path) -> None:
    """``mkdir -p d`` for a bench run's files: from the work directory down without following
    a link when ``d`` is in it (``output_dir`` recorded it), else ``d`` itself not a link (an
    ``--out`` the user names may have links above it). ``bench e2e`` made its ``runs/``
    folder with ``mkdir(parents=True)``: a ``bench/e2e`` planted as a link in the work
    directory had the folder made, the run logs appended and vLLM's results written outside
    (issue 41, the twenty-third hostile pass)."""
    from ..workspace.confine import ensure_dir, root_of

    ensure_dir(d, root=root_of(d), family=BenchError)


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
