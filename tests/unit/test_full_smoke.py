"""The full-mode smoke's pure parts (builds/full_smoke.py): which objects, the ninja target
names, reading cmake's version and build.ninja. The toolkit view (it runs gcc for its driver
stand-in) and the smoke itself are tested in tests/integration/test_full_smoke.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvprefetch.builds.full_smoke import (
    SMOKE_SOURCES,
    ninja_targets,
    object_target,
    parse_objects,
)
from kvprefetch.errors import ConfigError
from kvprefetch.machine.cmake import parse_cmake_version
from kvprefetch.verify.manifests import newest_manifests
from kvprefetch.workspace.workdir import Workdir


def test_objects_option() -> None:
    assert parse_objects(None) == ("v1", "v2")
    assert parse_objects("v2") == ("v2",)
    assert parse_objects("v1, v1,v2") == ("v1", "v2")
    assert parse_objects("none") == ()
    with pytest.raises(ConfigError, match="v3"):
        parse_objects("v1,v3")


def test_object_targets_are_cmakes_names() -> None:
    assert object_target(SMOKE_SOURCES["v1"]) == \
        "CMakeFiles/_C.dir/csrc/attention/paged_attention_v1.cu.o"


def test_ninja_targets_reads_build_statements() -> None:
    text = ("rule CUDA_COMPILER__C_unscanned_Release\n  command = nvcc\n"
            "build CMakeFiles/_C.dir/csrc/attention/paged_attention_v1.cu.o: "
            "CUDA_COMPILER__C_unscanned_Release /src/csrc/attention/paged_attention_v1.cu || "
            "cmake_object_order_depends_target__C\n"
            "build a$ b.o | implicit.o: phony x\n")
    got = ninja_targets(text)
    assert "CMakeFiles/_C.dir/csrc/attention/paged_attention_v1.cu.o" in got
    assert {"a b.o", "implicit.o"} <= got
    assert "/src/csrc/attention/paged_attention_v1.cu" not in got


def test_cmake_version() -> None:
    assert parse_cmake_version("cmake version 3.31.10\n\nCMake suite") == (3, 31, 10)
    assert parse_cmake_version("cmake version 3.25.1") == (3, 25, 1)
    assert parse_cmake_version("nonsense") is None


def test_verify_never_picks_the_smoke_manifest(tmp_path: Path) -> None:
    """A smoke after a kernels-only build must not hide that build from verify-kernel."""
    built = tmp_path / "build" / "patched" / "0123456789abcdef" / "manifest.json"
    smoke = tmp_path / "build" / "patched" / "full-smoke" / "manifest.json"
    for p, mode in ((built, "kernels-only"), (smoke, "full-smoke")):
        p.parent.mkdir(parents=True)
        p.write_text(json.dumps({"tree": "patched", "mode": mode}))
    os.utime(built, (1, 1))  # the smoke is newer
    assert newest_manifests(Workdir(tmp_path))["patched"]["mode"] == "kernels-only"
