"""``reading``: the one bounded reader of the JSON the kit reads back (records, manifests,
results, campaigns, timings): a regular file of bounded size, nested at most
``MAX_JSON_DEPTH`` levels, or one ValueError naming it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvprefetch.reading import MAX_JSON_DEPTH, deeper_than, load_json, parse_json


def _nested(levels: int) -> str:
    return "[" * levels + "1" + "]" * levels


def test_json_as_deep_as_the_limit_is_read_and_one_level_more_is_not() -> None:
    assert deeper_than(json.loads(_nested(MAX_JSON_DEPTH)), MAX_JSON_DEPTH) is False
    assert parse_json(_nested(MAX_JSON_DEPTH), "x") is not None
    with pytest.raises(ValueError, match="nested more than 64 levels"):
        parse_json(_nested(MAX_JSON_DEPTH + 1), "x")


def test_json_too_deep_for_pythons_parser_is_the_same_valueerror() -> None:
    with pytest.raises(ValueError, match="x holds JSON nested too deep"):
        parse_json(_nested(200_000), "x")


def test_bad_bytes_and_bad_json_are_valueerrors_naming_the_input() -> None:
    with pytest.raises(UnicodeDecodeError):  # a ValueError
        parse_json(b"\xff{}", "x")
    with pytest.raises(json.JSONDecodeError):  # a ValueError
        parse_json(b"{", "x")


def test_load_json_reads_only_a_regular_file_of_bounded_size(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        load_json(fifo)
    big = tmp_path / "big.json"
    big.write_text("[" + "1," * 100 + "1]")
    with pytest.raises(ValueError, match="larger than"):
        load_json(big, limit=50)
    deep = tmp_path / "deep.json"
    deep.write_text(_nested(100))
    with pytest.raises(ValueError, match=f"{deep} holds JSON nested more than"):
        load_json(deep)
