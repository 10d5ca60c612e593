"""``report --merge``: several shards of one ``bench kernel`` campaign (one per Slurm array task,
or per machine) into one ``kind: kernel`` document.

Shards are merged only when they measured the same thing the same way: the same GPU, the same
builds (each variant's library sha256) and the same kit commit. Otherwise the merge is refused and
the message names the field and the values that differ; ``force`` merges anyway and records
what differed in ``meta.merge.forced``. A shape measured twice is always refused: two numbers for
one row cannot be told apart in the report."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..errors import BenchError
from .schema import Document, KernelDocument, KernelMeta, ShapeRow, is_kernel


def _variants(doc: KernelDocument) -> str:
    return ", ".join(f"{v['name']}={v.get('so_sha256', 'in-process')}"
                     for v in doc["meta"].get("variants", []))


def _kit_commit(doc: KernelDocument) -> str:
    kit = doc["meta"].get("kit") or {}
    return str(kit.get("commit") or "not recorded")


# field name -> how to read it from a shard; the names are what the refusal message says.
IDENTITY_FIELDS: dict[str, Callable[[KernelDocument], str]] = {
    "device (meta.device.name)": lambda d: str((d["meta"].get("device") or {}).get("name")),
    "builds (meta.variants[].so_sha256)": _variants,
    "kit commit (meta.kit.commit)": _kit_commit,
    "baseline (meta.baseline)": lambda d: str(d["meta"].get("baseline")),
}


def differences(docs: Sequence[KernelDocument], names: Sequence[str]) -> list[str]:
    """One line per identity field on which the shards disagree, each value with its files."""
    out = []
    for field, get in IDENTITY_FIELDS.items():
        seen: dict[str, list[str]] = {}
        for doc, name in zip(docs, names, strict=True):
            seen.setdefault(get(doc), []).append(name)
        if len(seen) > 1:
            out.append(f"{field} differs: " + "; ".join(
                f"{value!r} in {', '.join(files)}" for value, files in seen.items()))
    return out


def _row_key(r: ShapeRow) -> tuple[str, str, str]:
    """A row's identity across shards: its shape, mode and timing (a graph run in vLLM's call
    holds eager rows of the same label where vLLM runs the step eagerly)."""
    return (r["label"], r["mode"], r.get("timing") or "graph")


def merge_kernel_docs(docs: Sequence[Document], names: Sequence[str],
                      force: bool = False) -> KernelDocument:
    """The merged document: the first shard's meta, every shard's rows in the order given."""
    if len(docs) != len(names) or not docs:
        raise BenchError("nothing to merge", "pass two or more shard JSON files to --merge")
    wrong = [n for d, n in zip(docs, names, strict=True) if not is_kernel(d)]
    if wrong:
        raise BenchError(f"only `bench kernel` results can be merged; {', '.join(wrong)} "
                         "are of another kind", "pass the shards' bench kernel JSON files")
    shards = [d for d in docs if is_kernel(d)]
    diffs = differences(shards, names)
    if diffs and not force:
        raise BenchError("the shards are not from one campaign:\n" + "\n".join(diffs),
                         "merge only shards of the same GPU, builds and kit commit, or pass "
                         "--force-merge to merge them anyway (the report then lists what differs)")
    rows: list[ShapeRow] = []
    where: dict[tuple[str, str, str], str] = {}
    for doc, name in zip(shards, names, strict=True):
        for r in doc["results"]:
            k = _row_key(r)
            if k in where:
                raise BenchError(f"shape {k[0]} ({k[1]}) is in both {where[k]} and {name}",
                                 "each shard must cover different shapes; drop the duplicate "
                                 "shard (a resubmitted task's older output, say)")
            where[k] = name
            rows.append(r)
    meta: KernelMeta = shards[0]["meta"].copy()
    meta["seconds"] = round(sum(float(d["meta"].get("seconds") or 0) for d in shards), 1)
    meta["not_measured"] = [x for d in shards for x in d["meta"].get("not_measured", [])]
    meta["aborted"] = "; ".join(f"{n}: {d['meta'].get('aborted')}"
                                for d, n in zip(shards, names, strict=True)
                                if d["meta"].get("aborted"))
    meta["merge"] = {"shards": [{"file": n, "started": d["meta"].get("started"),
                                 "rows": len(d["results"])}
                                for d, n in zip(shards, names, strict=True)],
                     "forced": diffs}
    return {"kind": "kernel", "schema": shards[0]["schema"], "meta": meta, "results": rows}
