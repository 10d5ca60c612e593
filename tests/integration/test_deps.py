"""`build --deps-dir` with hash-listed archives of vLLM's three FetchContent dependencies (the
three .tar.gz files and SHA256SUMS; docs/building.md, "Offline full builds"): the listing is
read, each archive is checked against it before it is unpacked, unpacked once, and the full
build's plan points vLLM's three variables at the unpacked trees. Uses the archives in
$KVPREFETCH_DEPS_DIR, else in ../shared/deps beside the checkout (the project machines' copy),
else skips, saying how to get them. Nothing is configured or compiled here."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kvprefetch.errors import ConfigError, FetchError
from kvprefetch.sources.deps import (
    DEPS_VARS,
    PROBE_FILES,
    deps_env,
    find_archives,
    unpack_archives,
)
from tests.integration.helpers import deps_skip_reason

REPO = Path(__file__).resolve().parents[2]
CANDIDATES = [Path(os.environ["KVPREFETCH_DEPS_DIR"])] if os.environ.get("KVPREFETCH_DEPS_DIR") \
    else [REPO.parent / "shared" / "deps"]
SHARED = next((p for p in CANDIDATES if (p / "SHA256SUMS").is_file()), None)
needs_archives = pytest.mark.skipif(SHARED is None, reason=deps_skip_reason(CANDIDATES))


@needs_archives
def test_archives_are_checked_and_unpacked_once(tmp_path: Path) -> None:
    assert SHARED is not None
    deps = tmp_path / "deps"
    shutil.copytree(SHARED, deps)
    root = tmp_path / "work" / "deps"
    env = deps_env(deps, root)
    assert set(env) == set(DEPS_VARS.values())
    found = find_archives(deps, root)
    assert found is not None and set(found) == set(DEPS_VARS)
    done = unpack_archives(deps, root.parent)
    assert len(done) == 3
    for name, var in DEPS_VARS.items():
        assert (Path(env[var]) / PROBE_FILES[name]).is_file()
    stamp = Path(env["VLLM_CUTLASS_SRC_DIR"]) / ".kvprefetch-sha256"
    before = stamp.stat().st_mtime_ns
    unpack_archives(deps, root.parent)  # kept: the stamp matches
    assert stamp.stat().st_mtime_ns == before


@needs_archives
def test_a_tampered_archive_is_refused_before_unpacking(tmp_path: Path) -> None:
    assert SHARED is not None
    deps = tmp_path / "deps"
    shutil.copytree(SHARED, deps)
    (flashmla,) = deps.glob("FlashMLA-*.tar.gz")
    flashmla.write_bytes(flashmla.read_bytes() + b"\0")
    root = tmp_path / "work" / "deps"
    with pytest.raises(FetchError) as exc:
        unpack_archives(deps, root.parent)
    assert "SHA256SUMS says" in exc.value.cause
    assert not (root / flashmla.name[: -len(".tar.gz")]).exists()


def test_missing_deps_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in DEPS_VARS.values():
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "cutlass").mkdir()
    with pytest.raises(ConfigError) as exc:
        deps_env(tmp_path, tmp_path / "unpacked")
    assert "flash-attention" in exc.value.cause and "FlashMLA" in exc.value.cause
    (tmp_path / "SHA256SUMS").write_text("0" * 64 + "  cutlass-abc.tar.gz\n")
    (tmp_path / "cutlass-abc.tar.gz").write_bytes(b"")
    with pytest.raises(ConfigError) as exc:
        find_archives(tmp_path, tmp_path / "unpacked")
    assert "flash-attention" in exc.value.cause
