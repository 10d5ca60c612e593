"""The CPU-only stand-in for a ``bench kernel`` shard (``kvprefetch slurm stand-in``), for
clusters and CI machines without a GPU: it exercises a campaign's array, its files and its merge
with real inputs, and never invents a timing.

What it computes, on the CPU, from the real builds: the shard's shapes (the campaign's matrix at
the task's batch size), each build's library re-hashed and checked against its manifest (the
``so_sha256`` that ``report --merge`` compares), and per shape whether every build instantiates
it. Every row is ``skipped``, with the reason: not timed (no GPU), or the instantiation missing.
The document says ``stand_in`` in ``meta.device``, and the report prints it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..errors import BenchError
from ..kitinfo import kit_info
from .campaign import Campaign

NOT_TIMED = "CPU stand-in shard: no GPU here, nothing was timed"


def stand_in_shard(c: Campaign, task: int) -> dict[str, Any]:
    from ..bench.kernel import KernelBenchConfig, not_measured
    from ..bench.kernel_results import ShapeResult
    from ..bench.matrix import build_matrix
    from ..hashing import MAX_LIBRARY_BYTES, sha256_file
    from ..kernels.kvinputs import min_bytes_moved
    from ..kernels.ops import find_builds

    if not 0 <= task < len(c.bench.batches):
        raise BenchError(f"task {task} is not a shard of this campaign (tasks 0.."
                         f"{len(c.bench.batches) - 1})", "pass the array task id")
    t0 = time.monotonic()
    builds = find_builds(c.workdir, c.tree_names)
    found = [b.tree for b in builds]
    if sorted(found) != sorted(c.tree_names):
        raise BenchError(f"the campaign's builds are {list(c.tree_names)} but {c.workdir} holds "
                         f"kernels-only builds of {found}",
                         "let the build jobs finish (or resubmit the failed one) first")
    for b in builds:
        try:
            actual = sha256_file(b.so_path, limit=MAX_LIBRARY_BYTES)
        except OSError as exc:
            raise BenchError(f"cannot hash {b.so_path}, the library its manifest "
                             f"{b.manifest_path} names: {exc.strerror}",
                             "rebuild the tree (resubmit its build job): a library is a "
                             "regular file of at most a few GiB") from None
        if actual != b.so_sha256:
            raise BenchError(f"{b.so_path} has sha256 {actual}, its manifest "
                             f"{b.manifest_path} says {b.so_sha256}",
                             "rebuild the tree: "
                             f"`kvprefetch build --kernels-only --trees {b.tree}`")
    matrix = build_matrix(c.bench.presets, [str(c.bench.batches[task])], c.bench.contexts)
    config = KernelBenchConfig(mode="cold")
    results = []
    for shape in matrix.shapes():
        a = shape.attn
        lacking = [b.tree for b in builds
                   if not b.supports(a.head_size, a.block_size, a.kv_cache_dtype, a.dtype)]
        why = (f"instantiation not in build(s): {', '.join(lacking)}" if lacking else NOT_TIMED)
        results.append(ShapeResult(shape, config.mode, None, min_bytes_moved(a), (), None, why,
                                   "skipped"))
    return {
        "kind": "kernel", "schema": 1,
        "meta": {
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "seconds": round(time.monotonic() - t0, 1),
            "device": {"name": "none (CPU stand-in)", "l2_bytes": 0,
                       "stand_in": "rows are skipped, never timed; the libraries were re-hashed "
                                   "against their manifests"},
            "copy_bw_bytes_per_s": 0.0, "baseline": builds[0].tree,
            "variants": [{"name": b.tree, "namespace": b.namespace, "so_sha256": b.so_sha256,
                          "so_path": str(b.so_path)} for b in builds],
            "configs": [], "matrix": matrix.to_dict(),
            "command": ["kvprefetch", "slurm", "stand-in", c.root, "--task", str(task)],
            "aborted": "", "not_measured": not_measured(results),
            "kit": kit_info().to_dict(), "shard": {"task": task, "of": len(c.bench.batches)},
        },
        "results": [r.to_dict() for r in results],
    }


def write_shard(c: Campaign, task: int) -> Path:
    import json

    from ..workspace.confine import write_file

    doc = stand_in_shard(c, task)
    out = c.shard(task)
    # confined to the campaign: a symlinked results/ is refused, never written through
    write_file(out, json.dumps(doc, indent=1) + "\n", root=Path(c.root), family=BenchError)
    return out
