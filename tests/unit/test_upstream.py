"""upstream.py: where the kit's own csrc/ and patches/ are found from the package's location
(a checkout, or the copy an installed wheel carries in kvprefetch/data), and what a variant's
diffs touch. A move of the module once broke the first silently: every command that reads a
patch failed while the unit layer stayed green."""

from __future__ import annotations

from pathlib import Path

import kvprefetch
from kvprefetch.upstream import (
    ATTENTION_HEADER,
    KIT_HEADERS,
    PAGED_ATTENTION_SOURCES,
    VARIANTS,
    kit_headers,
    kit_root,
    patch_files,
    patched_paths,
)


def test_kit_root_is_the_checkout_holding_csrc_and_patches() -> None:
    root = kit_root()
    package = Path(kvprefetch.__file__).resolve().parent
    assert root in (package / "data", package.parent.parent)
    assert sorted(p.name for p, _ in kit_headers()) == sorted(KIT_HEADERS)
    assert all(p.is_file() for p, _ in kit_headers())


def test_every_variant_has_its_diffs_and_they_touch_only_the_attention_sources() -> None:
    for variant in VARIANTS:
        assert patch_files(variant), variant
        touched = patched_paths(variant)
        assert touched and set(touched) <= {ATTENTION_HEADER, *PAGED_ATTENTION_SOURCES}, variant
