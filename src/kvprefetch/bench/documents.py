"""Reading a result document (any ``kind`` bench or verify writes), the one way ``report``,
``--merge``, ``--repeats``, ``--readme`` and ``--index`` read one: a bounded read of a regular
file, plain or gzip-compressed, then a check against its kind's schema (bench/schema.py), so
that a hand-edited, truncated, hostile or other-version result is one ``BenchError`` naming the
file, the field and the fix, never a traceback or a hang. ``reading`` turns what a renderer
still trips over in a checked document (an empty list, a zero time) into the same kind of
error."""

from __future__ import annotations

import functools
import types
import typing
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, Union

from ..errors import BenchError
from ..reading import parse_json
from .schema import (
    DOCUMENT_TYPES,
    KINDS,
    SCHEMA_VERSION,
    UNVERSIONED_KINDS,
    Document,
)

__all__ = ["KINDS", "MAX_RESULT_BYTES", "load_document", "load_documents", "problem",
           "reading"]

# The most a result may hold, decompressed (the largest committed one is well under 1 MiB;
# a sampled run's raw rounds a few MiB): beyond it a file is refused, never read into memory.
MAX_RESULT_BYTES = 64 << 20
_FIX = "pass a JSON file written by kvprefetch bench or verify, unedited"


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
    # a stream cut short (its CRC never checked) or bytes after it: not a file kvprefetch
    # wrote, whatever JSON the first part holds (issue 41, the eleventh pass left it open: a
    # result with bytes after its gzip stream was read as if they were not there)
    if not d.eof:
        raise ValueError("its gzip stream is cut short (no end and no CRC)")
    if d.unused_data:
        raise ValueError(f"{len(d.unused_data)} bytes follow its gzip stream")
    return data


def load_document(path: Path) -> Document:
    """A result JSON file, plain or gzip-compressed (``.json.gz``: how bulky runs are kept),
    checked against its kind's schema (bench/schema.py): a known ``kind``, this kit's
    ``schema`` version, every required field there and every field of the type the schema
    gives it. Anything else is one BenchError naming the file, the field and the fix."""
    return _parse(path, _bytes_of(path))


def load_documents(paths: Sequence[Path], what: str) -> list[Document]:
    """The result files ``paths`` that one command reads together into one document (``report
    --merge``'s shards, ``--repeats``' runs), each as ``load_document`` reads it, and at most
    MAX_RESULT_BYTES of them all together, the most one result may hold: the command holds
    them all in memory at once. Each file alone was bounded, not their sum: eight
    gzip shards of 600 KB on disk, each 60 MiB of JSON, kept ``--merge`` reading for 95 s in
    2.9 GB of memory and ended in a ``SystemError`` traceback under a 3 GB limit (issue 41, the
    twenty-second hostile pass). ``what``: how the files are named in the message."""
    total = 0
    docs = []
    for p in paths:
        raw = _bytes_of(p)
        total += len(raw)
        if total > MAX_RESULT_BYTES:
            raise BenchError(f"the {what} up to {p} hold more than {MAX_RESULT_BYTES >> 20} "
                             "MiB of JSON together, more than one result kvprefetch reads, and "
                             "report holds them all in memory at once",
                             f"combine fewer {what} at a time (a campaign's shards are a few "
                             "hundred KiB each)")
        docs.append(_parse(p, raw))
    return docs


def _bytes_of(path: Path) -> bytes:
    try:
        return _read_result(path)
    except (OSError, ValueError, zlib.error) as exc:
        raise BenchError(f"cannot read {path}: {exc}", _FIX) from exc


def _parse(path: Path, raw: bytes) -> Document:
    try:
        doc = parse_json(raw, path)
    except ValueError as exc:
        raise BenchError(f"cannot read {path}: {exc}", _FIX) from exc
    if not isinstance(doc, dict) or doc.get("kind") not in KINDS:
        raise BenchError(f"{path} is not a kvprefetch result (kind must be one of "
                         f"{', '.join(KINDS)})", "pass a JSON file written by kvprefetch bench")
    kind = doc["kind"]
    if "schema" in doc or kind not in UNVERSIONED_KINDS:
        version = doc.get("schema", "missing")
        if version != SCHEMA_VERSION or isinstance(version, bool):
            got = "has no `schema`" if version == "missing" else f"is of schema {version!r}"
            raise BenchError(f"{path}: this `{kind}` result {got}; this kvprefetch reads schema "
                             f"{SCHEMA_VERSION}",
                             "render it with the kvprefetch that wrote it (its meta.kit.version) "
                             "or rerun the benchmark with this one")
    found = problem(doc, DOCUMENT_TYPES[kind])
    if found:
        raise BenchError(f"{path}: a field the report reads is missing or not what kvprefetch "
                         f"writes: {found} (a `{kind}` result, schema {SCHEMA_VERSION})", _FIX)
    return doc  # type: ignore[return-value]  # checked against DOCUMENT_TYPES[kind] above


# ----------------------------------------------------------------------------- the check

_TYPE_NAMES = {dict: "an object", list: "a list", str: "a string", int: "a whole number",
               float: "a number", bool: "true or false"}


@functools.cache
def _fields(cls: type) -> tuple[tuple[tuple[str, Any], ...], frozenset[str]]:
    """A TypedDict's keys with their types, in declaration order, and its required keys."""
    hints = typing.get_type_hints(cls)
    return tuple(hints.items()), frozenset(cls.__required_keys__)  # type: ignore[attr-defined]


def problem(value: Any, tp: Any, where: str = "") -> str | None:
    """The first place where the JSON value ``value`` is not of the type ``tp`` (a TypedDict
    above, ``list[X]``, ``dict[str, X]``, ``X | None``, a ``Literal``, a JSON scalar type or
    ``Any``), as "`where.field` is null, not a number"; None if it is. ``int`` excludes booleans,
    ``float`` is any number. Keys a class does not declare are not looked at (a later kit's
    additions within the same schema)."""
    if tp is Any:
        return None
    if typing.is_typeddict(tp):
        if not isinstance(value, dict):
            return f"{_at(where)} is {_json_type(value)}, not an object"
        fields, required = _fields(tp)
        for key, sub in fields:
            if key not in value:
                if key in required:
                    return f"{_at(_join(where, key))} is missing"
                continue
            found = problem(value[key], sub, _join(where, key))
            if found:
                return found
        return None
    origin = typing.get_origin(tp)
    if origin is Union or origin is types.UnionType:
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None if len(options) < len(typing.get_args(tp)) else \
                f"{_at(where)} is null, not {_describe(options[0])}"
        each = [problem(value, a, where) for a in options]
        return None if None in each else each[0]
    if origin is list:
        if not isinstance(value, list):
            return f"{_at(where)} is {_json_type(value)}, not a list"
        (item,) = typing.get_args(tp)
        for i, x in enumerate(value):
            found = problem(x, item, f"{where}[{i}]")
            if found:
                return found
        return None
    if origin is tuple:  # a fixed-length JSON list
        items = typing.get_args(tp)
        if not isinstance(value, list) or len(value) != len(items):
            return f"{_at(where)} is {_json_type(value)}, not a list of {len(items)}"
        for i, (x, item) in enumerate(zip(value, items, strict=True)):
            found = problem(x, item, f"{where}[{i}]")
            if found:
                return found
        return None
    if origin is dict:
        if not isinstance(value, dict):
            return f"{_at(where)} is {_json_type(value)}, not an object"
        _, item = typing.get_args(tp)
        for k, x in value.items():
            found = problem(x, item, _join(where, str(k)))
            if found:
                return found
        return None
    if origin is Literal:
        allowed = typing.get_args(tp)
        return None if value in allowed else \
            f"{_at(where)} is {value!r}, not {' or '.join(repr(a) for a in allowed)}"
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) if tp is float
          else isinstance(value, int) and not isinstance(value, bool) if tp is int
          else isinstance(value, tp))
    return None if ok else f"{_at(where)} is {_json_type(value)}, not {_describe(tp)}"


def _describe(tp: Any) -> str:
    if typing.is_typeddict(tp) or typing.get_origin(tp) is dict:
        return "an object"
    if typing.get_origin(tp) in (list, tuple):
        return "a list"
    return _TYPE_NAMES.get(tp, str(tp))


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
