"""``kvprefetch report FILE...``: render bench (kernel, ncu, e2e) and identity JSON files as
markdown and PNG; regenerate a markdown file's report blocks (``--readme``) or the index of
committed runs (``--index``). No GPU and no torch needed."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import click
from click.core import ParameterSource

from ..console import emit_json, info
from ..workspace.confine import what_is


@click.command()
@click.argument("files", nargs=-1,
                type=click.Path(dir_okay=False, path_type=Path))  # existence: _check_files
@click.option("--out", "out_text", type=click.Path(), default=None,  # as typed: _out says why
              help="The folder to write <stem>.md/.png (and --repeats/--merge's files) in "
                   "[default: the current directory]; with --index, the markdown file to write "
                   "[default: print it].")
@click.option("--formats", default="md,png", show_default=True, help="Which of md, png to write.")
@click.option("--print", "print_md", is_flag=True, help="Also print the markdown to stdout.")
@click.option("--repeats", "repeats_name", default=None, metavar="NAME",
              help="Read the FILES as repeated bench kernel runs of the same shapes and write "
                   "one combined NAME.json/.md: per shape each run's median speedup, whether a "
                   "variant is slower than stock in every run, and beyond the A/A band of the "
                   "`control` variant when the runs carry one.")
@click.option("--readme", "readme", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, callback=lambda ctx, param, value: _named(param, value),
              help="Regenerate the report blocks of this markdown file "
              "(`<!-- report RESULT.json summary|shapes|attribution -->` or `<!-- report "
              "RUN_FOLDER seeds|twins|bounds|host -->` ... `<!-- /report -->`, and `<!-- timings "
              "TIMINGS.json -->` ... `<!-- /timings -->`) from their committed "
              "JSON, and its `<!-- commands -->` block from the commands' help, in place.")
@click.option("--index", "index", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=None, help="Write the index of the committed runs under this folder (each "
              "with a provenance.json; docs/results) as markdown to --out.")
@click.option("--check", is_flag=True,
              help="With --readme or --index: change nothing; exit 1 if the file differs from "
                   "what its JSON gives.")
@click.option("--merge", "merge", is_flag=True,
              help="Read the FILES as shards of one bench kernel campaign (Slurm array tasks, "
                   "machines) and write one merged.json/.md; refused when the shards differ in "
                   "GPU, builds (library sha256) or kit commit, naming the field.")
@click.option("--force-merge", is_flag=True,
              help="With --merge: merge shards that differ anyway; the report lists what differs.")
@click.option("--json", "as_json", is_flag=True, help="Print the written paths as JSON.")
def report(files: tuple[Path, ...], out_text: str | None, formats: str, print_md: bool,
           repeats_name: str | None, readme: Path | None, index: Path | None, check: bool,
           merge: bool, force_merge: bool, as_json: bool) -> None:
    """Render kvprefetch result files (bench kernel/ncu/e2e, numerical identity) into markdown
    tables and plots (speedup heatmap over batch x context for bench kernel); with --repeats,
    combine repeated bench kernel runs into one document; with --merge, merge the shards of one
    campaign; with --readme, regenerate a markdown file's report blocks from the JSON they name;
    with --index, write the index of committed runs (docs/results.md)."""
    from ..bench.documents import load_document, load_documents, reading
    from ..bench.report import render_markdown, write_outputs

    _check_files(files)
    out = _out(out_text, index is not None)
    if files and (readme is not None or index is not None):
        # they were ignored without a word (issue 41, the thirty-first hostile pass)
        raise click.UsageError("--readme and --index read the files their blocks or runs "
                               "name: give them no FILES (render FILES in a run of their own)")
    _refuse_what_is_ignored(readme, index)
    if readme is not None:
        _refresh_readme(readme, check, as_json)
        return
    if index is not None:
        _write_index(index, out, check, as_json)
        return
    if check:
        raise click.UsageError("--check goes with --readme or --index")
    if not files:
        raise click.UsageError("give result FILES to render, --readme MARKDOWN or --index DIR")
    if out is not None and out.exists() and not out.is_dir():
        # a FIFO or a device was called "a file" (issue 41, the fifteenth hostile pass)
        raise click.BadParameter(f"{out} is {what_is(out)}; give a folder", param_hint="--out")

    fmts = tuple(f.strip() for f in formats.split(",") if f.strip())
    bad = [f for f in fmts if f not in ("md", "png")]
    if bad:
        raise click.BadParameter(f"unknown format(s) {', '.join(bad)}; use md, png",
                                 param_hint="--formats")
    if not fmts and not (print_md or merge or repeats_name is not None):
        # --merge and --repeats always write their JSON; --print alone prints (issue 41, pass 8)
        raise click.BadParameter(f"{formats!r} names no format, so report would write nothing; "
                                 "give md, png or both (or --print to only print the markdown)",
                                 param_hint="--formats")
    if force_merge and not merge:
        raise click.UsageError("--force-merge goes with --merge")
    if merge:
        from ..bench.merge import merge_kernel_docs

        _refuse_overwriting_inputs(files, out or Path.cwd(), {"merged": ("json", *fmts)},
                                   "")
        docs = load_documents(files, "shards")
        with reading(*files):
            doc = merge_kernel_docs(docs, [str(p) for p in files], force=force_merge)
            paths = write_outputs(doc, out or Path.cwd(), "merged",
                                  ("json", *(f for f in fmts if f != "json")))
            if print_md:
                click.echo(render_markdown(doc))
        if as_json:
            emit_json({"merged": [str(p) for p in paths]})
        else:
            info("wrote " + ", ".join(str(p) for p in paths))
        return
    if repeats_name is not None:
        from ..bench.plan import check_output_name
        from ..bench.repeats import combine
        from ..errors import OptionError

        if repeats_name in ("", ".", "..") or Path(repeats_name).name != repeats_name:
            raise click.BadParameter(
                f"{repeats_name!r} is a path; give a file name without folders (e.g. repeats) "
                "and the folder with --out", param_hint="--repeats")
        try:
            check_output_name(repeats_name, "--repeats")
        except OptionError as exc:
            raise click.BadParameter(exc.cause, param_hint="--repeats") from None

        _refuse_overwriting_inputs(files, out or Path.cwd(),
                                   {repeats_name: ("json", *(f for f in fmts if f == "md"))},
                                   " or under another --repeats name")
        docs = load_documents(files, "runs")
        with reading(*files):
            combined = combine(docs, sources=[p.name for p in files])
            paths = write_outputs(combined, out or Path.cwd(), repeats_name,
                                  ("json", *(f for f in fmts if f == "md")))
            if print_md:
                click.echo(render_markdown(combined))
        if as_json:
            emit_json({"repeats": [str(p) for p in paths]})
        else:
            info("wrote " + ", ".join(str(p) for p in paths))
        return
    written: dict[str, list[str]] = {}
    _refuse_overwriting_inputs(files, out or Path.cwd(), {_stem(p): fmts for p in files}, "",
                               per_input=True)
    for path in files:
        loaded = load_document(path)
        stem = _stem(path)
        with reading(path):
            paths = write_outputs(loaded, out or Path.cwd(), stem, fmts)
            if print_md:
                click.echo(render_markdown(loaded))
        written[str(path)] = [str(p) for p in paths]
        if not as_json:
            info(f"{path}: wrote " + (", ".join(written[str(path)]) or "nothing"))
    if as_json:
        emit_json(written)


def _check_files(files: Sequence[Path]) -> None:
    """Each of FILES exists (as click's ``exists=True`` checked, links followed). A campaign's
    missing bench result, in the merge job, said "does not exist. To fix: correct the command
    line", a command line the kit wrote (issue 41, the thirty-second hostile pass): it is named
    as the task that did not leave it, with that task's resubmit."""
    from ..errors import ConfigError
    from ..slurm.campaign import shard_task

    for f in files:
        if os.path.exists(f):
            continue
        shard = shard_task(f)
        if shard is None:
            raise click.BadParameter(f"File {click.format_filename(f)!r} does not exist.",
                                     param_hint="'[FILES]...'")
        root, task = shard
        raise ConfigError(
            f"bench task {task}'s result '{f}' does not exist (the task failed, was cancelled "
            "or has not run, or the file was moved since)",
            f"send that task again with `kvprefetch slurm resubmit {root} bench --task {task}`, "
            f"then the merge with `kvprefetch slurm resubmit {root} merge`")


def _named(param: click.Parameter, value: Path | None) -> Path | None:
    """``--readme``, rewritten in place: another user's link on the way refused, as for
    ``--out`` (issue 41, the thirty-eighth hostile pass)."""
    from .common import refuse_foreign_links

    if value is not None:
        refuse_foreign_links(param, str(value))
    return value


def _refuse_what_is_ignored(readme: Path | None, index: Path | None) -> None:
    """Refuse an option that ``--readme`` or ``--index`` would ignore: `report --readme F --out
    X` rewrote F in place and wrote nothing in X, without a word (issue 41, the thirty-third
    hostile pass). ``--out`` goes with ``--index`` (the file to write), not with ``--readme``."""
    if readme is None and index is None:
        return
    if readme is not None and index is not None:
        raise click.UsageError("give --readme or --index, not both: each writes its own file")
    ctx = click.get_current_context()
    mode = "--readme" if readme is not None else "--index"
    used = [opt for name, opt in (("out_text", "--out"), ("formats", "--formats"),
                                  ("print_md", "--print"), ("repeats_name", "--repeats"),
                                  ("merge", "--merge"), ("force_merge", "--force-merge"))
            if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT
            and not (name == "out_text" and readme is None)]
    if used:
        what = ("it rewrites its markdown file in place" if readme is not None
                else "it writes one markdown file, --out")
        raise click.UsageError(f"{mode} does not use {', '.join(used)}: {what}; leave "
                               f"{'it' if len(used) == 1 else 'them'} out")


def _out(text: str | None, index: bool) -> Path | None:
    """``--out`` as typed: with ``--index`` the markdown file to write (``output_file``'s rule,
    as for ``export-header -o``), else the folder to write in. A ``Path`` drops a trailing
    ``/`` and reads ``''`` as ``.``: ``--index R --out new/`` wrote a *file* named ``new``, and
    ``--out ''`` said "cannot write .: a directory is in its place / To fix: move . away"
    (issue 41, the twenty-second hostile pass, as the twenty-first found for ``-o``)."""
    from .common import output_file, refuse_foreign_links

    if text is None:
        return None
    ctx = click.get_current_context()
    param = next(p for p in ctx.command.params if p.name == "out_text")
    if index:
        return output_file(ctx, param, text)
    if not text.strip():
        raise click.BadParameter(f"{text!r} names no folder; give the folder to write in (or "
                                 "leave --out out: the current directory)", ctx=ctx,
                                 param=param)
    refuse_foreign_links(param, text)  # another user's link on the way: refused
    return Path(text)


def _stem(path: Path) -> str:
    """The name a result's outputs take: a compressed result (RUN.json.gz) writes RUN.md, as
    its uncompressed RUN.json does."""
    return (path.name.removesuffix(".gz").removesuffix(".json") if path.suffix == ".gz"
            else path.stem)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)  # through links, and a hard link too
    except (OSError, ValueError):
        return False  # the output is not there yet (or cannot be looked at): no input


def _refuse_overwriting_inputs(files: Sequence[Path], out_dir: Path,
                               outputs: dict[str, Sequence[str]], other_name: str,
                               per_input: bool = False) -> None:
    """Refuse, before anything is read or written, a run whose output (``out_dir/NAME.EXT``
    for each ``NAME: EXTS`` of ``outputs``) is one of the result ``files`` it reads, or two of
    whose different inputs would write the same output. `report K1.json K2.json --repeats K1
    --out .` replaced the result K1.json with the combined document, and `report A/run.json
    B/run.json --out R` wrote R/run.md twice, the first lost, both "wrote" (issue 41, the
    twenty-first hostile pass). ``per_input``: each input writes its own ``outputs`` (by its
    stem), not all of them one document; ``other_name``: how else the fix can name them."""
    from ..errors import BenchError

    fix = (f"write the outputs elsewhere (--out FOLDER){other_name}; the result files stay as "
           "they are")
    for name, exts in outputs.items():
        for ext in exts:
            target = out_dir / f"{name}.{ext}"
            for f in files:
                if _same_file(f, target):
                    raise BenchError(f"{target} is the result file {f} this report reads: "
                                     "writing it would replace that result", fix)
    if per_input:
        from ..bench.plan import check_output_name
        from ..errors import OptionError

        for f in files:
            try:  # write_outputs' check, here with the input that gives the name: its
                # "give the folder with --out" was no fix for an input named ..json or a\nb.json
                # (issue 41, the twenty-third hostile pass)
                check_output_name(_stem(f))
            except OptionError:
                raise BenchError(f"{f} would name its outputs {_stem(f)!r}.md/.png, which is "
                                 "no file name (a report takes its input's name, less "
                                 ".json; no folder, no control character, at most 250 "
                                 "bytes)",
                                 "copy or rename the result file to a plain name (e.g. "
                                 "result.json), then render that") from None
    if per_input and any(outputs.values()):  # --print alone writes nothing
        stems: dict[str, Path] = {}
        for f in files:
            other = stems.setdefault(_stem(f), f)
            if not _same_file(other, f) and os.path.realpath(other) != os.path.realpath(f):
                raise BenchError(f"{other} and {f} would both write {out_dir / _stem(f)}.*: the "
                                 "second would replace the first's report",
                                 "render them one at a time, each with its own --out FOLDER")


def _refuse_an_index_over_its_runs(root: Path, out: Path) -> None:
    """Refuse an index ``--out`` that is a file the index is made of (a run's provenance.json,
    or a result its headline names): `report --index R --out R/RUN/provenance.json` replaced
    that run's record with the index, and the next index failed on it (issue 41, the
    twenty-first hostile pass)."""
    from ..bench.index import PROVENANCE, find_runs
    from ..errors import BenchError

    for run in find_runs(root):
        read = [run.path / PROVENANCE, *(run.path / str(h["result"]) for h in run.headline
                                         if isinstance(h, dict) and "result" in h)]
        for f in read:
            if _same_file(f, out):
                raise BenchError(f"{out} is {f}, which the index of {root} is made of: writing "
                                 "the index there would replace it",
                                 "write the index elsewhere, e.g. --out docs/results.md")


# a README or an index is text of a few hundred KiB; more is not one (and is never read whole)
MAX_MARKDOWN_BYTES = 4 << 20


def _read_markdown(path: Path) -> str:
    """The text of the markdown file ``path``: a regular UTF-8 file of at most
    MAX_MARKDOWN_BYTES (a FIFO never blocks, a binary file is one error, not a traceback)."""
    from ..errors import BenchError
    from ..reading import read_limited

    try:
        return read_limited(path, MAX_MARKDOWN_BYTES).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BenchError(f"cannot read {path}: it is not UTF-8 text ({exc.reason} at byte "
                         f"{exc.start}), so it is no markdown file",
                         "pass the markdown file whose report blocks to regenerate "
                         "(e.g. README.md)") from exc
    except (OSError, ValueError) as exc:
        raise BenchError(f"cannot read {path}: {exc}",
                         "pass a regular markdown file of at most "
                         f"{MAX_MARKDOWN_BYTES >> 20} MiB (e.g. README.md)") from exc


COMMANDS_BLOCK = re.compile(r"(<!-- commands -->\n)(.*?)(<!-- /commands -->)", re.DOTALL)

# The most blocks one markdown file may ask for (the README holds four). Each block is
# regenerated on its own: a 10 KB file repeating one `seeds` block 300 times kept `report
# --readme` busy for minutes, and 20,000 `timings` blocks (800 KB) made a 200 MB README in
# 600 MB of memory, one the next run refuses to read (issue 41, the twenty-fourth hostile pass).
MAX_MARKDOWN_BLOCKS = 100


def _block_count(text: str) -> int:
    from ..bench.readme_blocks import README_BLOCK
    from ..timings import TIMINGS_BLOCK

    return sum(len(rx.findall(text)) for rx in (README_BLOCK, TIMINGS_BLOCK, COMMANDS_BLOCK))


def _check_markdown_size(path: Path, text: str, regenerated: bool) -> None:
    """Refuse a markdown file asking for more than MAX_MARKDOWN_BLOCKS blocks, and a
    regenerated one over MAX_MARKDOWN_BYTES (what ``_read_markdown`` reads back)."""
    from ..errors import BenchError

    if regenerated:
        # surrogatepass: a lone surrogate is counted here (3 bytes) and refused by the write
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > MAX_MARKDOWN_BYTES:
            raise BenchError(f"{path}: its regenerated blocks would make it {size >> 20} MiB, "
                             f"more than the {MAX_MARKDOWN_BYTES >> 20} MiB kvprefetch reads "
                             "back; nothing was written",
                             "keep fewer or smaller report blocks in the file")
        return
    blocks = _block_count(text)
    if blocks > MAX_MARKDOWN_BLOCKS:
        raise BenchError(f"{path} holds {blocks} report, timings and commands blocks, more than "
                         f"the {MAX_MARKDOWN_BLOCKS} one `report --readme` regenerates",
                         "keep each result's block once in the file (the README holds four), "
                         "or split the file")


def command_table() -> str:
    """The markdown table of every ``kvprefetch`` command and its one-line help, read from the
    click commands themselves (a group lists its subcommands)."""
    from ..cli import main

    ctx = click.Context(main)
    rows = ["| command | what it does |", "|---|---|"]
    for name in main.list_commands(ctx):
        cmd = main.get_command(ctx, name)
        assert cmd is not None
        usage = f"kvprefetch {name}"
        if isinstance(cmd, click.Group):
            usage += " " + "\\|".join(cmd.list_commands(click.Context(cmd)))
        rows.append(f"| `{usage}` | {cmd.get_short_help_str(limit=150)} |")
    return "\n".join(rows) + "\n"


def refresh_commands(text: str) -> tuple[str, list[str]]:
    """``text`` with its ``<!-- commands -->`` block regenerated, and ["commands"] if it
    changed."""
    changed: list[str] = []

    def fill(m: re.Match[str]) -> str:
        body = command_table()
        if body != m[2]:
            changed.append("commands")
        return m[1] + body + m[3]

    return COMMANDS_BLOCK.sub(fill, text), changed


def _refresh_readme(readme: Path, check: bool, as_json: bool) -> None:
    from ..bench.readme_blocks import check_block_names, check_block_nesting, refresh_blocks
    from ..errors import BenchError
    from ..timings import refresh_timings
    from ..workspace.confine import kept_mode, write_file

    text = _read_markdown(readme)
    _check_markdown_size(readme, text, regenerated=False)
    check_block_names(text)
    check_block_nesting(text)
    new, changed = refresh_blocks(text, readme.parent)
    new, changed_timings = refresh_timings(new, readme.parent)
    new, changed_commands = refresh_commands(new)
    _check_markdown_size(readme, new, regenerated=True)
    changed += changed_timings + changed_commands
    # a README that is a symlink is read through it, never written through it: both the
    # refusal below and --check's fix name the file it points to (they said "move the symlink
    # away, then rerun", and --check to run the command that refused; issue 41, the
    # twenty-sixth pass)
    real = Path(os.path.realpath(readme)) if readme.is_symlink() else readme
    if as_json:
        emit_json({"readme": str(readme), "changed": changed, "checked": check})
    if check and not _block_count(text):
        # --check on a file holding no block said "every report block matches its JSON": a
        # pass for a CI pointed at the wrong file (issue 41, left open by the thirty-seventh pass)
        raise BenchError(f"{readme} holds no report, timings or commands block, so there is "
                         "nothing to check",
                         "point --readme at the markdown file holding the "
                         "`<!-- report RESULT.json summary -->` blocks (the project's README.md)")
    if check:
        if changed:
            raise BenchError(f"{readme}: report blocks differ from their JSON: "
                             f"{', '.join(changed)}",
                             f"run `kvprefetch report --readme {real}` and commit the result")
        if not as_json:
            info(f"{readme}: every report block matches its JSON")
        return
    if new != text and real != readme:
        raise BenchError(f"refusing to write {readme}: it is a symlink to {real}, and kvprefetch "
                         "never writes through one", f"run `kvprefetch report --readme {real}`")
    if new != text:
        # rewritten in place as `export-header -o` writes: never through a symlink (the file
        # or its folder), never over a device node or a FIFO
        write_file(readme, new, family=BenchError, mode=kept_mode(readme),
                   exact=True)
    if not as_json:
        info(f"{readme}: " + (f"regenerated {', '.join(changed)}" if changed
                              else "up to date" if _block_count(text)
                              else "no report, timings or commands block in it; nothing to "
                                   "regenerate"))


def _write_index(root: Path, out: Path | None, check: bool, as_json: bool) -> None:
    from ..bench.index import index_markdown
    from ..errors import BenchError
    from ..workspace.confine import is_plain_file, kept_mode, write_file

    if out is None and check:
        raise click.UsageError("--index --check needs --out FILE, the index to compare")
    text = index_markdown(root, out or Path("results.md"))
    if out is None:
        click.echo(text, nl=False)
        return
    # only a regular file is read back (a symlink or a FIFO at --out is "changed", and the
    # write below refuses it)
    try:
        changed = not is_plain_file(out) or _read_markdown(out) != text
    except BenchError:
        changed = True
    if as_json:
        emit_json({"index": str(out), "changed": changed, "checked": check})
    if check:
        if changed:
            raise BenchError(f"{out} differs from the index of {root}",
                             f"run `kvprefetch report --index {root} --out {out}` and commit "
                             "the result")
        if not as_json:
            info(f"{out}: matches the runs under {root}")
        return
    if changed:
        _refuse_an_index_over_its_runs(root, out)
        # the rule of `export-header -o` (confine.write_file without a root): neither the file
        # nor its folder may be a symlink, the folder's ancestors may be
        write_file(out, text, family=BenchError, mode=kept_mode(out), exact=True)
    if not as_json:
        info(f"{out}: " + ("regenerated" if changed else "up to date"))
