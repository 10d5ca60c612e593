"""kvprefetch.kernels.selection's option parsing: unknown sizes and dtypes are config errors,
fp8_e4m3 is fp8 and the defaults are vLLM's full set (the arithmetic checked against the real
launcher sources is in tests/integration/test_selection.py)."""

from __future__ import annotations

import pytest

from kvprefetch.errors import ConfigError
from kvprefetch.kernels.selection import (
    KV_DTYPES,
    Selection,
    parse_selection,
)


@pytest.mark.parametrize(("heads", "blocks", "kv", "needle"), [
    ("100", None, None, "does not instantiate [100]"),
    ("128,100", None, None, "does not instantiate [100]"),
    (None, "12", None, "does not instantiate [12]"),
    ("abc", None, None, "is not a list of integers"),
    (None, None, "int8", "unknown ['int8']"),
    (None, None, ",", "unknown empty"),
])
def test_unknown_sizes_and_dtypes_are_config_errors(heads: str | None, blocks: str | None,
                                                    kv: str | None, needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_selection(heads, blocks, kv)
    assert needle in exc.value.cause
    assert exc.value.fix and ("choose from" in exc.value.fix or "subset" in exc.value.fix)


def test_fp8_e4m3_is_fp8_and_defaults_are_full() -> None:
    assert parse_selection(None, None, "fp8_e4m3,fp16").kv_dtypes == ("fp16", "fp8")
    default = parse_selection(None, None, None)
    assert default == Selection() and default.kv_dtypes == KV_DTYPES
