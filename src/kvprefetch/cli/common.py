"""Option decorators shared by several commands (sqlite-utils style)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from .. import upstream
from ..console import say

# A count or length given on the command line reaches a C int (ninja's -j, nvcc's --threads,
# vLLM's max_model_len, a pool's size): past 2**31 - 1 it is no number those programs take
# (issue 41, ninth hostile pass: 10**30 was planned). Usage: ``type=count_range(1)``.
INT32_MAX = 2**31 - 1


def count_range(low: int) -> click.IntRange:
    return click.IntRange(min=low, max=INT32_MAX)


# A bench's --seed seeds torch.Generator.manual_seed, which takes an unsigned 64-bit number
# (10**20 is its ValueError, met only on the GPU, in the middle of a run); decode seeds a second
# generator with seed + 1, so the top is 2**63 - 1, and a negative seed (torch wraps it modulo
# 2**64, so -1 is 2**64 - 1) is refused rather than renamed (issue 41, tenth hostile pass).
SEED_RANGE = click.IntRange(min=0, max=2**63 - 1)
# bench kernel's --rounds: interleaved rounds of every shape; fewer than 3 give no spread
# (KernelBenchConfig), and 10,000 (vmm bench's own cap) is already hours per shape at the
# default sample length, so more is a typo, not a plan.
ROUNDS_RANGE = click.IntRange(min=3, max=10_000)


if TYPE_CHECKING:
    from ..bench.plan import Bound

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_WORKDIR = Path("kvprefetch-work")


def _real_workdir(ctx: click.Context, param: click.Parameter, value: Path) -> Path:
    """The work directory the user named, followed once if it is a symlink to a directory.

    Its location is the one thing the kit takes on trust (docs/reliability.md): a user may put
    it on a larger disk behind a link. Inside it no link is ever followed; resolving the link
    here makes every command act on the same real directory (issue 41, class 6: fetch and
    clean refused the link and told the user to remove ``.lock``, while apply went through)."""
    from ..errors import ConfigError

    if ctx.get_parameter_source(param.name or "") is click.core.ParameterSource.ENVIRONMENT:
        # named by KVPREFETCH_WORKDIR, not typed: "correct the command line" and "--workdir X"
        # pointed at a command line that holds no --workdir (issue 41, the thirty-ninth pass)
        try:
            return _real_workdir_checked(ctx, param, value, "KVPREFETCH_WORKDIR")
        except click.BadParameter as exc:
            raise ConfigError(f"KVPREFETCH_WORKDIR={os.fspath(value)!r}: {exc.message}",
                              "set KVPREFETCH_WORKDIR to a work directory, or unset it (or pass "
                              "--workdir DIR, which wins over it)") from None
    return _real_workdir_checked(ctx, param, value, "--workdir")


def _real_workdir_checked(ctx: click.Context, param: click.Parameter, value: Path,
                          named: str) -> Path:
    from ..workspace.foreign import refuse_foreign_link

    refuse_a_path_through_a_file(ctx, param, value, "work directory")
    refuse_foreign_link(value, f"{named} {value}")  # any link on the way, not only the last
    if value.is_symlink() and value.is_dir():
        _refuse_a_campaigns_linked_work(value)
        return value.resolve()
    if os.path.lexists(value) and not value.is_dir():
        # a file, a device, a FIFO or a link to nothing: apply, diff-upstream, export-header and
        # build said "no tree ... run `kvprefetch fetch` first", which fetch then refused (issue
        # 41, the thirtieth hostile pass)
        what = ("a symlink to nothing (or a loop of links)" if value.is_symlink()
                and not value.exists() else "not a folder")
        raise click.BadParameter(f"{os.fspath(value)!r} is {what}; a work directory is a folder "
                                 "(`kvprefetch fetch --workdir DIR` makes one)", ctx=ctx,
                                 param=param)
    return value


def refuse_a_path_through_a_file(ctx: click.Context, param: click.Parameter, value: Path,
                                 what: str) -> None:
    """A folder option whose path goes through a file (``F/x``, F a file): nothing can be made
    there, yet slurm status said "restore F/x/campaign.json as slurm plan wrote it" and
    build "no tree ... run kvprefetch fetch", which fails the same way (issue 41, the
    thirty-eighth hostile pass)."""
    try:
        os.lstat(value)
    except NotADirectoryError:
        raise click.BadParameter(f"{os.fspath(value)!r} goes through a file, not a folder: "
                                 f"no {what} can be there; name a folder", ctx=ctx,
                                 param=param) from None
    except (OSError, ValueError):
        pass


def _refuse_a_campaigns_linked_work(value: Path) -> None:
    """A campaign's ``work/`` is never followed: the campaign's jobs name it (verify-kernel,
    bench kernel), not the user, and ``slurm submit`` refuses it as a link; one there now was
    put by whoever can write the campaign. Swapped for a link to a folder outside after the
    submission, it had the verify job write its report there (issue 41, the nineteenth hostile
    pass). Not resolved, a link swapped in later is refused by ``confine`` (the root's last
    part is opened ``O_NOFOLLOW``).

    A job is known by ``slurm.campaign.JOB_ENV``, which its script exports, not only by the
    ``campaign.json`` beside the link: whoever writes the campaign can move that file away too,
    and the verify job then followed ``work/`` into a folder outside (another work directory of
    the user's) and wrote its report there (issue 41, the twentieth hostile pass)."""
    from ..errors import ConfigError
    from ..slurm.campaign import CAMPAIGN_FILE, JOB_ENV

    job_campaign = os.environ.get(JOB_ENV)
    if not job_campaign and not (value.name == "work"
                                 and os.path.lexists(value.parent / CAMPAIGN_FILE)):
        return
    campaign = job_campaign or str(value.parent)
    raise ConfigError(f"{value} is a symlink in the campaign {campaign}: a campaign's work "
                      "folder is a real folder in it (and a job's scratch a real folder of "
                      "yours), and kvprefetch never follows a link whoever writes the campaign "
                      "could have put there",
                      f"remove the symlink {value} (its target is left as it is), run the "
                      f"prepare job again (kvprefetch slurm resubmit {campaign} prepare), then "
                      "the jobs after it")


def output_file(ctx: click.Context, param: click.Parameter, value: str | None) -> Path | None:
    """An option naming a file to write (``export-header -o``, ``vmm bench --out``): not empty
    and not a folder. ``-o ''`` said "cannot write .: a directory is in its place / To fix:
    move . away", and ``-o DIR`` "move DIR away" (issue 41, ninth hostile pass).

    The option's value comes as the string typed (``click.Path()``, no ``path_type``): a Path
    drops a trailing ``/``, so ``-o out/`` (a folder not made yet) wrote a file named ``out``
    (issue 41, the twenty-first hostile pass)."""
    if value is None:
        return None
    text = os.fspath(value)
    path = Path(text)
    if text.strip() and text.endswith(("/.", "/..")):
        text += "/"  # names a folder as surely as a trailing /
    if not text.strip() or text.endswith("/") or path.is_dir():
        what = "names no file" if not text.strip() else "is a folder"
        example = (Path(text) / "NAME").as_posix() if text.strip() else "a file path"
        raise click.BadParameter(f"{text!r} {what}; give the path of the file to write "
                                 f"(e.g. {example})", ctx=ctx, param=param)
    if text == "-":
        # `-o -` wrote a file named `-` where a user reads standard output (issue 41, left open
        # by the thirty-sixth hostile pass); the kit writes only regular files, as below
        raise click.BadParameter("'-' is not read as standard output here: kvprefetch writes "
                                 "its output only into a regular file (e.g. out.txt), which "
                                 "you can then read or pipe on; for a file named -, give ./-",
                                 ctx=ctx, param=param)
    if _names_a_special_file(path):
        # -o /dev/stdout (a link to the terminal or a pipe) was refused with "move the
        # symlink /dev/stdout away", advice that breaks the system if followed (issue 41, the
        # twentieth hostile pass)
        raise click.BadParameter(f"{text!r} is a link to a terminal, pipe or device, not a file; "
                                 "kvprefetch writes its output only into a regular file "
                                 f"(e.g. {path.name or 'out'}.txt), which you can then "
                                 "read or pipe on", ctx=ctx, param=param)
    refuse_foreign_links(param, text)
    return path


def refuse_foreign_links(param: click.Parameter, text: str) -> None:
    """A path option the user names to write in or load from (``-o``, ``--out``,
    ``--paged-workdir``) held to ``--workdir``'s rule: no link on the way that another user
    owns (``workspace/foreign.refuse_foreign_link``). Only --workdir and a campaign were: an
    ``export-header -o /tmp/shared/out/x.h`` through ``nobody``'s ``/tmp/shared/out ->
    ~/thesis`` wrote into the folder nobody chose (issue 41, the thirty-eighth hostile pass,
    as the thirty-seventh found for --workdir)."""
    from ..workspace.foreign import refuse_foreign_link

    refuse_foreign_link(Path(text), f"{'/'.join(param.opts)} {text}")


def _names_a_special_file(path: Path) -> bool:
    """Whether ``path`` is a link to something that is no regular file or folder (a terminal,
    a pipe, a device): never opened, only ``stat``. (A FIFO or device named directly already
    has its own message, from the writer.)"""
    import stat

    try:
        if not path.is_symlink():
            return False
        mode = path.stat().st_mode
    except (OSError, ValueError):
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def workdir_option(f: F) -> F:
    return click.option(
        "--workdir", type=click.Path(path_type=Path), default=DEFAULT_WORKDIR, show_default=True,
        envvar="KVPREFETCH_WORKDIR", callback=_real_workdir,
        help="Directory holding the trees, downloads, builds and environments.",
    )(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True,
                        help="Print the result as JSON on stdout.")(f)


def dry_run_option(f: F) -> F:
    return click.option("--dry-run", is_flag=True,
                        help="Print what would be done and change nothing.")(f)


def deprecated(old: str, new: str) -> None:
    """Say on stderr that ``old`` still works but is now spelled ``new``."""
    say(f"note: {old} is deprecated and still works; use {new}", err=True)


def _canonical_variant(ctx: click.Context, param: click.Parameter, value: str) -> str:
    new = upstream.canonical_variant(value)
    if new != value:
        deprecated(f"--variant {value}", f"--variant {new}")
    return new


class VariantChoice(click.Choice):  # type: ignore[type-arg]
    """The patch variants; an old name (``seed``) is accepted but never offered: a usage
    error lists only the names to use (issue 42)."""

    def __init__(self) -> None:
        super().__init__(upstream.VARIANTS)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> Any:
        if value in upstream.LEGACY_NAMES:
            return value
        return super().convert(value, param, ctx)


def variant_option(help: str | None = None) -> Callable[[F], F]:
    """``--variant``: the patch variant (an old name such as ``seed`` still works)."""
    return click.option(
        "--variant", type=VariantChoice(),
        default="prefetch", show_default=True, callback=_canonical_variant,
        metavar="[" + "|".join(upstream.VARIANTS) + "]", help=help)


def tree_option(help: str) -> Callable[[F], F]:
    """Repeatable ``--tree NAME`` (into the parameter ``trees``); the hidden ``--variant NAME``
    is its old spelling (bench named trees variants), accepted with a note on stderr."""
    def deco(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, trees: tuple[str, ...], legacy_trees: tuple[str, ...],
                    **kwargs: Any) -> Any:
            if legacy_trees:
                deprecated("--variant NAME (a tree)", "--tree NAME")
            return f(*args, trees=trees + legacy_trees, **kwargs)

        out = click.option("--variant", "legacy_trees", multiple=True, hidden=True)(wrapper)
        out = click.option("--tree", "trees", multiple=True, metavar="NAME", help=help)(out)
        return out  # type: ignore[return-value]
    return deco


class BoundedNumber(click.ParamType):
    """A number within a library ``Bound`` (bench/plan.py): click's usage error names the option
    and the range. Unlike ``click.FloatRange`` it refuses NaN (which passes every comparison)
    and infinity (issue 41, fourth pass)."""

    def __init__(self, bound: Bound) -> None:
        self.bound = bound
        self.name = "integer" if bound.integer else "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> Any:
        from ..errors import OptionError

        number = (click.INT if self.bound.integer else click.FLOAT).convert(value, param, ctx)
        try:
            return self.bound.check(number)
        except OptionError as exc:
            self.fail(exc.cause, param, ctx)


class LibraryChecked(click.ParamType):
    """A text value the library checks (``check`` returns it, or raises a ``KvprefetchError``):
    the same rule for the command line and for a plan read back (e.g. a campaign.json), shown
    as click's usage error naming the option."""

    def __init__(self, name: str, check: Callable[[str], object]) -> None:
        self.name = name
        self.check = check

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> Any:
        from ..errors import KvprefetchError

        try:
            self.check(value)
        except KvprefetchError as exc:
            self.fail(exc.message, param, ctx)
        return value


def _check_arch(spec: str) -> None:
    from ..machine.toolchain import parse_arch_list

    parse_arch_list(spec)


# slurm plan --arch: torch's TORCH_CUDA_ARCH_LIST, as `build --arch` parses it (the build
# itself refuses a bad one while planning, before it changes anything)
ARCH_TYPE = LibraryChecked("arch list", _check_arch)
