"""What the ``bench`` subcommands share on the command line: the output options (``--out``,
``--name``, ``--formats``), the repeatable ``--tree``, and the library's ``OptionError`` shown as
click's own usage error."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click

from ...bench.plan import FORMATS, check_output_name
from ...errors import OptionError
from ..common import refuse_foreign_links, tree_option

F = TypeVar("F", bound=Callable[..., Any])


def output_options(default_name: str) -> Callable[[F], F]:
    def deco(f: F) -> F:
        f = click.option("--out", type=click.Path(), default=None,
                         callback=_output_folder,
                         help="Output folder [default: <workdir>/bench].")(f)
        f = click.option("--name", default=default_name, show_default=True,
                         callback=_output_name,
                         help="Base name of the output files (<name>.json/.md/.png).")(f)
        f = click.option("--formats", default=",".join(FORMATS), show_default=True,
                         help="Which of json, md, png to write.")(f)
        return f
    return deco


def _output_folder(ctx: click.Context, param: click.Parameter, value: str | None
                   ) -> Path | None:
    """``--out``: a folder, or a path where one will be made. ``--out ''`` wrote into the
    current folder (``Path('')`` is ``.``) and a FIFO or device there was "File exists /
    check the path" (issue 41, the tenth hostile pass)."""
    if value is None:
        return None
    if not value.strip():
        raise click.BadParameter(f"{value!r} names no folder; give the folder to write in (or "
                                 "leave --out out: <workdir>/bench)", ctx=ctx, param=param)
    out = Path(value)
    if out.exists() and not out.is_dir():
        raise click.BadParameter(f"{value!r} is not a folder; give the folder to write in",
                                 ctx=ctx, param=param)
    refuse_foreign_links(param, value)  # another user's link on the way: refused
    return out


def _output_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    with usage_errors():
        return check_output_name(value)


trees_option = tree_option("Tree to load (repeatable; default: every kernels-only build "
                           "found, baseline first).")


@contextmanager
def usage_errors() -> Iterator[None]:
    """The library's ``OptionError`` (a bad value or combination it found while planning) as
    click's usage error: the "Usage:" header, "Invalid value for OPTION", exit code 2."""
    try:
        yield
    except OptionError as exc:
        raise click.BadParameter(exc.cause, param_hint=exc.option) from None
