"""upstream.py: where the kit's own csrc/ and patches/ are found from the package's location
(a checkout, or the copy an installed wheel carries in kvprefetch/data), and what a variant's
diffs touch. A move of the module once broke the first silently: every command that reads a
patch failed while the unit layer stayed green."""

from __future__ import annotations

import re
from pathlib import Path

import kvprefetch
from kvprefetch.upstream import (
    ATTENTION_HEADER,
    KIT_HEADERS,
    PAGED_ATTENTION_SOURCES,
    VARIANTS,
    kit_header_dir,
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


def test_every_file_of_csrc_kvprefetch_is_a_kit_header() -> None:
    """`apply` installs, and patch_sha256 (so the build key) hashes, exactly KIT_HEADERS: a
    header added to csrc/kvprefetch/ but left out of the list would be missing from every tree,
    and an edit of it would change no hash. gqa_twins.cuh is the one twins header the patched
    launchers include; its parts are listed, included by it in order, and refuse to be
    included on their own (issue 45)."""
    on_disk = sorted(p.name for p in kit_header_dir().iterdir()
                     if p.is_file() and not p.name.startswith("."))
    assert on_disk == sorted(KIT_HEADERS)
    umbrella = (kit_header_dir() / "gqa_twins.cuh").read_text()
    parts = re.findall(r'^#include "(gqa_twins_[a-z]+\.cuh)"$', umbrella, re.MULTILINE)
    assert parts == ["gqa_twins_device.cuh", "gqa_twins_kernel.cuh", "gqa_twins_launch.cuh"]
    for part in parts:
        text = (kit_header_dir() / part).read_text()
        assert "#ifndef KVPREFETCH_GQA_TWINS_PARTS\n  #error" in text, part
        assert "#pragma once" not in text and not re.search(r"^namespace", text, re.MULTILINE)


def test_every_variant_has_its_diffs_and_they_touch_only_the_attention_sources() -> None:
    for variant in VARIANTS:
        assert patch_files(variant), variant
        touched = patched_paths(variant)
        assert touched and set(touched) <= {ATTENTION_HEADER, *PAGED_ATTENTION_SOURCES}, variant
