"""Option decorators shared by several commands (sqlite-utils style)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_WORKDIR = Path("kvprefetch-work")


def workdir_option(f: F) -> F:
    return click.option(
        "--workdir", type=click.Path(path_type=Path), default=DEFAULT_WORKDIR, show_default=True,
        envvar="KVPREFETCH_WORKDIR",
        help="Directory holding the trees, downloads, builds and environments.",
    )(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")(f)


def dry_run_option(f: F) -> F:
    return click.option("--dry-run", is_flag=True, help="Print what would be done and change nothing.")(f)
