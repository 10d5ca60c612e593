"""Reading a result document (any ``kind`` bench or verify writes): a bounded read of a regular
file, plain or gzip-compressed, and a check of its shape, so that a hand-edited, truncated or
hostile result is one ``BenchError`` naming the field, never a traceback or a hang. ``reading``
turns what a renderer trips over deeper in a checked document into the same kind of error."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import BenchError

KINDS = ("kernel", "ncu", "e2e", "identity", "repeats", "decode", "sample")


# The most a result may hold, decompressed (the largest committed one is well under 1 MiB;
# a sampled run's raw rounds a few MiB): beyond it a file is refused, never read into memory.
MAX_RESULT_BYTES = 64 << 20
_FIX = "pass a JSON file written by kvprefetch bench or verify, unedited"

# The spine of each kind: every field a reader indexes without checking first, with its type.
# A dict is a JSON object with those keys (a key ending in "?" may be absent); a one-element
# list is a JSON list whose every element has that shape; ``int`` excludes booleans; ``float``
# is any number. Only what the readers need: anything else in a document is kept as it is.
_ROWS_COMMON = {"batch": int, "context": int, "block_size": int, "dtype": str,
                "kv_cache_dtype": str, "kernel": str, "label?": str, "variants?": dict}
_SHAPES: dict[str, dict[str, Any]] = {
    "kernel": {"meta": {"baseline": str, "variants": [{"name": str}],
                        "device": {"name": str, "l2_bytes": int}},
               "results": [{**_ROWS_COMMON, "mode": str, "preset": str}]},
    "sample": {"meta": {"baseline": str, "variants": [{"name": str}], "device": dict,
                        "sample": dict},
               "results": [{**_ROWS_COMMON, "head_size": int, "num_heads": int,
                            "num_kv_heads": int}]},
    "decode": {"meta": {"baseline": str, "trees": [str], "model": dict, "device?": dict,
                        "config?": dict},
               "results": [{"label": str, "trees?": dict}]},
    "repeats": {"meta": {"variants": list}, "results": [dict], "summary": [dict]},
    "ncu": {"meta": {"variants": [str], "options": dict, "started": str},
            "shapes": [{"label": str, "variants": dict, "deltas": dict}]},
    "e2e": {"meta": {"input_len": int, "output_len": int, "repeats": int, "environment": dict,
                     "model_dir": str, "dtype": str, "started": str, "envs": [{"name": str}]},
            "rows": [{"max_num_seqs": int, "num_prompts": int, "envs": dict}]},
    "identity": {"status": str, "variants": [str], "device": str, "checked": int, "failed": int,
                 "not_checked": int, "rows": [{"label": str, "kernel": str, "status": str,
                                               "rel_err": dict, "problems": list}]},
}
_TYPE_NAMES = {dict: "an object", list: "a list", str: "a string", int: "a whole number",
               float: "a number", bool: "true or false"}


def _shape_problem(value: Any, spec: Any, where: str) -> str | None:
    """The first place where ``value`` does not have the shape ``spec``, or None."""
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return f"{_at(where)} is {_json_type(value)}, not an object"
        for key, sub in spec.items():
            name = key.rstrip("?")
            if name not in value:
                if key.endswith("?"):
                    continue
                return f"{_at(_join(where, name))} is missing"
            found = _shape_problem(value[name], sub, _join(where, name))
            if found:
                return found
        return None
    if isinstance(spec, list):
        if not isinstance(value, list):
            return f"{_at(where)} is {_json_type(value)}, not a list"
        for i, item in enumerate(value):
            found = _shape_problem(item, spec[0], f"{where}[{i}]")
            if found:
                return found
        return None
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) if spec is float
          else isinstance(value, int) and not isinstance(value, bool) if spec is int
          else isinstance(value, spec))
    return None if ok else f"{_at(where)} is {_json_type(value)}, not {_TYPE_NAMES[spec]}"


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _at(where: str) -> str:
    return f"`{where}`" if where else "the document"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    for t in (bool, dict, list, str, int, float):
        if isinstance(value, t):
            return _TYPE_NAMES[t]
    return type(value).__name__


def _read_result(path: Path) -> bytes:
    """The (decompressed) bytes of a result file: a regular file only (a FIFO never blocks),
    at most MAX_RESULT_BYTES either way (a gzip bomb stops there)."""
    from ..reading import read_limited

    raw = read_limited(Path(path), MAX_RESULT_BYTES)
    if Path(path).suffix != ".gz":
        return raw
    d = zlib.decompressobj(wbits=31)  # gzip
    data = d.decompress(raw, MAX_RESULT_BYTES + 1)
    if len(data) > MAX_RESULT_BYTES:
        raise ValueError(f"it holds more than {MAX_RESULT_BYTES >> 20} MiB decompressed")
    return data


def load_document(path: Path) -> dict[str, Any]:
    """A result JSON file, plain or gzip-compressed (``.json.gz``: how bulky runs are kept),
    whose shape has been checked: every field the readers index (``_SHAPES``) is there with
    its type, so a hand-edited or truncated result is one error naming the field."""
    try:
        doc = json.loads(_read_result(path).decode("utf-8"))
    except RecursionError as exc:
        raise BenchError(f"cannot read {path}: JSON nested too deep", _FIX) from exc
    except (OSError, ValueError, zlib.error) as exc:
        raise BenchError(f"cannot read {path}: {exc}", _FIX) from exc
    if not isinstance(doc, dict) or doc.get("kind") not in KINDS:
        raise BenchError(f"{path} is not a kvprefetch result (kind must be one of "
                         f"{', '.join(KINDS)})", "pass a JSON file written by kvprefetch bench")
    problem = _shape_problem(doc, _SHAPES.get(doc["kind"], {}), "")
    if problem:
        raise BenchError(f"{path} is not a well-formed `{doc['kind']}` result: {problem}", _FIX)
    return doc


# What a reader raises on a document whose shape passed the check but whose deeper values do
# not make sense (a null where a number belongs, an empty list, a zero time).
_READ_ERRORS = (KeyError, TypeError, AttributeError, IndexError, ValueError, ZeroDivisionError,
                OverflowError, RecursionError)


@contextmanager
def reading(*paths: Path | str) -> Iterator[None]:
    """Around rendering, merging or combining loaded results: a field the shape check does not
    cover that is missing or of the wrong type is one BenchError naming the file(s), never a
    traceback."""
    try:
        yield
    except _READ_ERRORS as exc:
        what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        names = ", ".join(str(p) for p in paths)
        raise BenchError(f"{names}: a field the report reads is missing or not what kvprefetch "
                         f"writes ({what})", _FIX) from exc
