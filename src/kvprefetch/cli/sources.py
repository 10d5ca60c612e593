"""CLI: fetch, apply, diff-upstream, export-header (thin over sources/fetch, patching and
upstream_diff)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .. import upstream
from ..console import emit_json, escaped, info, one_line, say, step
from .common import (
    LibraryChecked,
    deprecated,
    dry_run_option,
    json_option,
    output_file,
    variant_option,
    workdir_option,
)


def _check_source(source: str) -> None:
    from ..sources.fetch import check_source

    check_source(source)


@click.command()
@workdir_option
@click.option("--source", default="auto", show_default=True,
              type=LibraryChecked("source", _check_source),
              help="auto (git, else the PyPI sdist), git, sdist, or PATH of a local clone, "
                   "mirror, or vllm-0.10.2.tar.gz (an existing path; not empty).")
@click.option("--repo-url", default=upstream.DEFAULT_REPO_URL, show_default=True,
              help="Git URL for --source git/auto.")
@click.option("--index-url", default=None,
              help="Package index for the sdist (default: PIP_INDEX_URL / pip config / PyPI).")
@click.option("--with-paper", is_flag=True,
              help="Also make a third tree, 'paper', for the paper's variant.")
@click.option("--with-seed", is_flag=True, hidden=True)  # the old name of --with-paper
@click.option("--extra-tree", "extra_trees", multiple=True, metavar="NAME",
              help="Also make tree NAME (e.g. to build a prefetch variant with other -D settings "
                   "next to 'patched' and compare them in one process). Repeatable.")
@click.option("--only", "only_trees", multiple=True, metavar="NAME",
              help="Make only tree NAME (repeatable), not baseline and patched: e.g. a cluster "
                   "job that builds one tree.")
@click.option("--allow-commit", default=None, metavar="SHA",
              help="Accept this commit for tag v0.10.2 (a trusted mirror that rewrote history).")
@click.option("--force", is_flag=True,
              help="Replace trees that carry local modifications (the old ones go to backup/).")
@click.option("--adopt", is_flag=True,
              help="Use a non-empty --workdir that kvprefetch did not create (its files are "
                   "kept: kvprefetch only removes what it creates).")
@click.option("--repair", is_flag=True,
              help="Rebuild corrupt or missing state records from the trees' content (an edit "
                   "stays reported as an edit).")
@dry_run_option
@json_option
def fetch(workdir: Path, source: str, repo_url: str, index_url: str | None, with_paper: bool,
          with_seed: bool,
          extra_trees: tuple[str, ...], only_trees: tuple[str, ...], allow_commit: str | None,
          force: bool, adopt: bool, repair: bool, dry_run: bool, as_json: bool) -> None:
    """Make independent vLLM v0.10.2 trees 'baseline' and 'patched' under --workdir."""
    from ..errors import ConfigError
    from ..sources.fetch import check_allow_commit, check_repo_url, fetch_trees
    from ..workspace.workdir import Workdir, check_tree_name

    for extra in extra_trees:
        check_tree_name(extra, "--extra-tree")
    for only in only_trees:
        check_tree_name(only, "--only")
    if only_trees and (extra_trees or with_paper or with_seed):
        raise ConfigError("--only names every tree to make; --extra-tree and --with-paper add "
                          "to baseline and patched", "use one or the other (e.g. --only paper)")
    bad = [t for t in extra_trees if t in upstream.TREE_NAMES]
    if bad:
        raise ConfigError(f"--extra-tree {', '.join(bad)}: tree names must be identifiers other "
                          "than baseline/patched", "pick a name such as exp_d2")
    check_allow_commit(allow_commit)
    check_repo_url(repo_url)
    if with_seed:
        deprecated("--with-seed", "--with-paper")
    # the paper's tree under the name this work directory made it with (seed before the rename)
    paper = (Workdir(workdir).resolve_tree(upstream.PAPER_TREE),) if with_paper or with_seed else ()
    names = (tuple(dict.fromkeys(only_trees)) if only_trees
             else tuple(dict.fromkeys(upstream.TREE_NAMES + paper + extra_trees)))
    with step(f"fetch vLLM {upstream.VLLM_VERSION} ({source})"):
        res = fetch_trees(workdir, source=source, repo_url=repo_url, index_url=index_url,
                          names=names, force=force, dry_run=dry_run, allow_commit=allow_commit,
                          adopt=adopt, repair=repair)
    for n in res.notices:
        info(f"notice: {n}")
    if as_json:
        emit_json(res)
        return
    for t in res.trees:
        extra = f" (previous tree kept in {t.backup})" if t.backup else ""
        click.echo(escaped(f"{t.name:9s} {t.action:13s} {t.path}{extra}"))
    click.echo(escaped(f"source: {res.source} {res.origin}"
                       + (f" @ {res.commit}" if res.commit else "")))


@click.command()
@workdir_option
@variant_option(help="prefetch: kvprefetch's patch; launch: launcher-side L2 prefetch only; "
                     "paper: the paper's mechanism as described; control: stock rebuilt (A/A "
                     "reference).")
@click.option("--tree", "tree_name", default=None,
              help="Tree to patch (default: 'patched' for prefetch, else the variant's name).")
@dry_run_option
@json_option
def apply(workdir: Path, variant: str, tree_name: str | None, dry_run: bool, as_json: bool) -> None:
    """Apply the prefetch patch to a pristine tree (a no-op when already applied)."""
    from ..sources.patching import apply_patch

    res = apply_patch(workdir, variant, tree_name, dry_run=dry_run)
    if as_json:
        emit_json(res)
    else:
        say(f"{res.tree}: {res.action} {res.variant} "
                   f"(patch sha256 {res.patch_sha256[:16]}…)")


@click.command("diff-upstream")
@workdir_option
@click.option("--tree", "tree_name", default="patched", show_default=True)
@click.option("--check", is_flag=True, help="Exit 1 unless the patch only adds lines.")
@click.option("--stat", is_flag=True, help="Show per-file added/removed counts only.")
@json_option
def diff_upstream(workdir: Path, tree_name: str, check: bool, stat: bool, as_json: bool) -> None:
    """Show the unified diff of every patched file against pristine v0.10.2."""
    from ..sources.upstream_diff import diff_upstream as compute

    res = compute(workdir, tree_name)
    if as_json:
        emit_json({"tree": res.tree, "variant": res.variant, "additive": res.additive,
                   "files": [{"path": f.path, "added": f.added, "removed": f.removed}
                             for f in res.files]})
    elif stat:
        for f in res.files:
            say(f"{one_line(f.path)}: +{f.added} -{f.removed}")
    else:
        for f in res.files:
            click.echo(f.diff, nl=False)
    if check:
        from ..sources.fetch import tree_modifications
        from ..sources.patching import carried_variant
        from ..workspace.workdir import Workdir

        tree_name = res.tree
        # looked at first: files added to a tree the patch never touched left its diff empty,
        # and the check said "pristine" of a tree `apply` then refused as modified (issue 41,
        # the thirty-eighth hostile pass)
        changed = tree_modifications(Workdir(workdir), tree_name)
        if not res.files and not changed:
            say(f"check FAILED: tree {tree_name!r} is pristine (no patch applied)\n"
                f"To fix: name a patched tree (--tree), or patch this one first (`kvprefetch "
                f"apply --tree {tree_name} --variant VARIANT`), then rerun", err=True)
            sys.exit(1)
        if not res.additive:
            bad = ", ".join(f"{f.path} (-{f.removed})" for f in res.files if f.removed)
            say(f"check FAILED: the patch removes or changes upstream lines in {bad}\n"
                       "To fix: express the change as added lines only", err=True)
            sys.exit(1)
        if changed:
            say(f"check FAILED: tree {tree_name!r} differs from what kvprefetch recorded "
                       f"(pristine v0.10.2 plus exactly the patch) in: {', '.join(changed[:8])}\n"
                       "To fix: `kvprefetch fetch --force` (the tree is moved to backup/), then "
                       "`kvprefetch apply`", err=True)
            sys.exit(1)
        carried = carried_variant(Workdir(workdir).tree(tree_name))
        if res.variant is not None and carried != res.variant:
            say(f"check FAILED: tree {tree_name!r} is recorded as carrying the "
                       f"{res.variant} patch but its files carry {carried or 'no patch'}\n"
                       "To fix: `kvprefetch fetch --force`, then `kvprefetch apply`", err=True)
            sys.exit(1)
        click.echo("check passed: the patch only adds lines", err=True)


@click.command("export-header")
@workdir_option
@click.option("-o", "--output", type=click.Path(),  # a str: output_file sees a trailing /
              default="csrc/attention_kernels.cuh", show_default=True,
              callback=output_file)
@variant_option()
@json_option
def export_header(workdir: Path, output: Path, variant: str, as_json: bool) -> None:
    """Write a single-file drop-in attention_kernels.cuh (generated, not committed)."""
    from ..hashing import sha256_file
    from ..sources.patching import drop_in_caveat
    from ..sources.patching import export_header as write

    path = write(workdir, output, variant)
    caveat = drop_in_caveat(variant)
    if as_json:
        emit_json({"output": str(path), "variant": variant, "sha256": sha256_file(path),
                   "caveat": caveat})
    else:
        say(f"wrote {path} ({variant}); "
                   "drop it in as vllm/csrc/attention/attention_kernels.cuh")
        if caveat:
            say(f"note: {caveat}", err=True)
