"""CLI: verify-kernel."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..console import emit_json, table
from .common import json_option, workdir_option


@click.command("verify-kernel")
@workdir_option
@click.option("--trees", default=None, help="Comma-separated trees (default: every built tree).")
@click.option("--no-gpu", is_flag=True, help="Skip the GPU identity check (reported as not checked).")
@json_option
def verify_kernel(workdir: Path, trees: str | None, no_gpu: bool, as_json: bool) -> None:
    """Prove which library each env loads, that UBLKPF is in its SASS, and bitwise outputs."""
    from ..verify.kernel import verify

    rep = verify(workdir, trees=[t for t in trees.split(",") if t] if trees else None,
                 no_gpu=no_gpu)
    if as_json:
        emit_json(rep.to_dict())
    else:
        for tree, s in rep.sass.items():
            table(["arch", "head", "block", "dtype", "kv cache", "kernels", "UBLKPF min", "max"],
                  [[r["arch"], r["head_size"], r["block_size"], r["dtype"], r["kv_cache"],
                    r["kernels"], r["ublkpf_min"], r["ublkpf_max"]] for r in s["table"]],
                  title=f"{tree}: {s['library']}")
        table(["check", "tree", "status", "detail"],
              [[c.name, c.tree, c.status.upper(), c.detail] for c in rep.checks],
              title="kvprefetch verify-kernel: " + ("PASSED" if rep.passed else "FAILED"))
        if "warning" in rep.envs:
            click.echo("warning: " + rep.envs["warning"], err=True)
    if not rep.passed:
        sys.exit(6)
