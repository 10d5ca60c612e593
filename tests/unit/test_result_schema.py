"""The result documents' schema (bench/schema.py) and its one loader (documents.load_document):
what every writer builds loads; every committed result under docs/results loads, its legacy
layouts included; a missing, null or wrong-typed field, another version or another kind is one
BenchError naming the file, the field and the fix. No torch, no GPU."""

from __future__ import annotations

import copy
import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from kvprefetch.bench import documents, report, schema
from kvprefetch.bench.merge import merge_kernel_docs
from kvprefetch.bench.repeats import combine
from kvprefetch.errors import BenchError
from tests.unit.test_report import kernel_doc, ncu_doc

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"


def _write(tmp_path: Path, doc: Any, name: str = "doc.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def _committed() -> list[Path]:
    out = []
    for p in sorted(RESULTS.rglob("*.json*")):
        if p.name == "provenance.json" or not p.name.endswith((".json", ".json.gz")):
            continue
        raw = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
        doc = json.loads(raw)
        if isinstance(doc, dict) and "kind" in doc:  # verify reports and manifests are not
            out.append(p)
    return out


@pytest.fixture(scope="module")
def committed() -> list[Any]:
    """Every committed result, loaded (the loader refuses any that does not fit the schema)."""
    return [documents.load_document(p) for p in _committed()]


def test_every_committed_result_loads_through_the_schema(committed: list[Any]) -> None:
    kinds = Counter(d["kind"] for d in committed)
    # what docs/results holds at this commit: every kind the kit has committed a run of
    assert kinds["kernel"] >= 30 and kinds["sample"] >= 22 and kinds["decode"] >= 9
    assert kinds["repeats"] >= 1


def test_the_legacy_layouts_are_among_the_committed_results(committed: list[Any]) -> None:
    """Version-1 documents written before a field existed load as they are (nothing rewritten):
    kernel rows without timing/kv_bytes and meta without kit, samples without meta.call, decode
    configs without max_seq_len_to_capture."""
    docs = committed
    kernel = [d for d in docs if d["kind"] == "kernel"]
    assert any("timing" not in r and "kv_bytes" not in r for d in kernel for r in d["results"])
    assert any("kit" not in d["meta"] for d in kernel)
    assert any("call" not in d["meta"] for d in docs if d["kind"] == "sample")
    assert any("max_seq_len_to_capture" not in d["meta"]["config"]
               for d in docs if d["kind"] == "decode")


def test_a_legacy_row_renders_as_its_documented_default(tmp_path: Path) -> None:
    """The legacy view: a row without ``timing`` is a graph timing, without ``status`` measured
    (skipped with an error), a meta without ``kit`` names no commit."""
    doc = kernel_doc()
    legacy = copy.deepcopy(doc)
    for r in legacy["results"]:
        del r["timing"], r["kv_bytes"], r["status"]
    doc["meta"].pop("kit", None)
    loaded = documents.load_document(_write(tmp_path, legacy))
    assert report.render_markdown(loaded) == report.render_markdown(doc)


@pytest.mark.parametrize("make", ["kernel", "ncu", "e2e", "identity", "merge", "repeats"])
def test_what_each_writer_builds_loads(tmp_path: Path, make: str) -> None:
    doc = _written(make, tmp_path)
    loaded = documents.load_document(_write(tmp_path, doc))
    assert loaded == json.loads(json.dumps(doc))


def _written(make: str, tmp_path: Path) -> Any:
    if make == "kernel":
        return kernel_doc()
    if make == "ncu":
        return ncu_doc()
    if make == "merge":
        return merge_kernel_docs([kernel_doc()], ["a.json"])
    if make == "repeats":
        return combine([kernel_doc(), kernel_doc()], sources=["1", "2"])
    if make == "identity":
        from kvprefetch.verify.numerics import not_checked

        return not_checked("no CUDA device").to_dict()
    from kvprefetch.bench import e2e

    envs = (e2e.E2EEnv("baseline", Path("/b")), e2e.E2EEnv("patched", Path("/p")))
    plan = e2e.E2EPlan(envs=envs, model_dir=tmp_path, out_dir=tmp_path, max_num_seqs=(8,),
                       repeats=2)
    res = {"tokens_per_second": 100.0, "num_requests": 16, "elapsed_time": 2.0}
    return {"kind": "e2e", "schema": schema.SCHEMA_VERSION,
            "meta": {"input_len": 512, "output_len": 512, "repeats": 2,
                     "environment": e2e.E2E_ENV, "model_dir": "m", "dtype": "float16",
                     "started": "x", "envs": [{"name": "baseline"}, {"name": "patched"}]},
            "rows": e2e.collect([(r, res) for r in e2e.plan_runs(plan)], plan)}


def _edit(path: str, value: Any) -> Any:
    """Set (``...``: delete) the field at a dotted path of a kernel document; digits index."""
    doc = kernel_doc()
    *parents, last = path.split(".")
    node: Any = doc
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    key: Any = int(last) if last.isdigit() else last
    if value is ...:
        del node[key]
    else:
        node[key] = value
    return doc


@pytest.mark.parametrize(("path", "value", "needle"), [
    ("meta", ..., "`meta` is missing"),
    ("meta.device.name", ..., "`meta.device.name` is missing"),
    ("meta.baseline", None, "`meta.baseline` is null, not a string"),
    ("meta.copy_bw_bytes_per_s", "fast", "`meta.copy_bw_bytes_per_s` is a string, not a number"),
    ("results", {}, "`results` is an object, not a list"),
    ("results.1.batch", 1.5, "`results[1].batch` is a number, not a whole number"),
    ("results.1.batch", True, "`results[1].batch` is true or false, not a whole number"),
    ("results.0.variants.patched.speedup.median", None,
     "`results[0].variants.patched.speedup.median` is null, not a number"),
    ("results.0.variants.baseline.time_us", None,
     "`results[0].variants.baseline.time_us` is null, not an object"),
    ("results.0.plan.layers", "2", "`results[0].plan.layers` is a string, not a whole number"),
    ("results.0.timing", 3, "`results[0].timing` is a whole number, not a string"),
    ("meta.variants.0", "baseline", "`meta.variants[0]` is a string, not an object"),
    ("meta.kit", {"commit": 7}, "`meta.kit.commit` is a whole number, not a string"),
])
def test_a_malformed_document_names_the_file_the_field_and_the_fix(
        tmp_path: Path, path: str, value: Any, needle: str) -> None:
    p = _write(tmp_path, _edit(path, value))
    with pytest.raises(BenchError) as err:
        documents.load_document(p)
    text = str(err.value)
    assert str(p) in text and needle in text and "To fix:" in text, text


@pytest.mark.parametrize(("version", "needle"), [
    (2, "is of schema 2; this kvprefetch reads schema 1"),
    ("1", "is of schema '1'"), (True, "is of schema True"), (None, "is of schema None"),
    (..., "has no `schema`")])
def test_another_version_is_refused_naming_it(tmp_path: Path, version: Any, needle: str) -> None:
    p = _write(tmp_path, _edit("schema", version))
    with pytest.raises(BenchError, match="this kvprefetch reads schema 1") as err:
        documents.load_document(p)
    assert needle in str(err.value) and str(p) in str(err.value)
    assert "the kvprefetch that wrote it" in str(err.value)


def test_identity_documents_carry_no_version_but_a_wrong_one_is_refused(tmp_path: Path) -> None:
    from kvprefetch.verify.numerics import not_checked

    doc = not_checked("no CUDA device").to_dict()
    assert "schema" not in doc
    documents.load_document(_write(tmp_path, doc))
    with pytest.raises(BenchError, match="is of schema 3"):
        documents.load_document(_write(tmp_path, {**doc, "schema": 3}))


@pytest.mark.parametrize(("doc", "needle"), [
    ([1, 2], "not a kvprefetch result"), ({"kind": "bogus"}, "not a kvprefetch result"),
    ({"kind": "sample", "schema": 1, "meta": {}, "results": []}, "`meta.started` is missing")])
def test_no_document_of_a_known_kind(tmp_path: Path, doc: Any, needle: str) -> None:
    with pytest.raises(BenchError, match=needle):
        documents.load_document(_write(tmp_path, doc))


def test_keys_the_schema_does_not_name_are_kept(tmp_path: Path) -> None:
    """A later kit's additions within schema 1 load and survive a merge unchanged."""
    doc = kernel_doc()
    doc["meta"]["future"] = {"x": [1, 2]}
    doc["results"][0]["future"] = "y"
    loaded = documents.load_document(_write(tmp_path, doc))
    merged = merge_kernel_docs([loaded], ["a.json"])
    assert merged["meta"]["future"] == {"x": [1, 2]}  # type: ignore[typeddict-item]
    assert merged["results"][0]["future"] == "y"  # type: ignore[typeddict-item]


@pytest.mark.parametrize(("value", "tp", "found"), [
    (None, int | None, None), (3, int | None, None), ("3", int | None, "is a string"),
    (None, int, "is null, not a whole number"), ([64, 16, True], tuple[int, int, bool], None),
    ([64, 16], tuple[int, int, bool], "not a list of 3"), ({"a": 1.5}, dict[str, float], None),
    ({"a": "x"}, dict[str, float], "`a` is a string, not a number"),
    (2, float, None), ("kernel", get_type_hints(schema.KernelDocument)["kind"], None),
    ("sample", get_type_hints(schema.KernelDocument)["kind"], "is 'sample', not 'kernel'")])
def test_problem_reads_the_typing_forms_the_schema_uses(value: Any, tp: Any,
                                                         found: str | None) -> None:
    got = documents.problem(value, tp)
    assert got is None if found is None else (got is not None and found in got), got


def test_every_kind_has_a_document_type() -> None:
    assert set(schema.DOCUMENT_TYPES) == set(schema.KINDS) == set(documents.KINDS)
