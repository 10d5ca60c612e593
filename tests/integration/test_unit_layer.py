"""The unit layer runs anywhere: in a fresh venv holding only the kit and its ``test`` extra (no
torch, which the extra does not install, and no nvcc on PATH), ``pytest tests/unit`` passes with
nothing skipped (issue 45; cibuildwheel's ``unit_test/`` runs with no toolchain the same way).

The venv is made with uv (``uv venv`` + ``uv pip install -e <copy>[test]``, the uv the ``test``
extra installs), else with ``python -m venv`` and pip, from whatever index this environment names:
pip reads PIP_INDEX_URL and its config itself; uv is handed the same index as UV_INDEX_URL (with
PIP_EXTRA_INDEX_URL and PIP_CERT), since it reads neither. On a machine with an empty cache the
install downloads the extra's wheels (about 280 MB, seconds on a fast link); the unit layer then
takes what it takes in the kit's own venv (under a minute on 2 cores). The checkout is copied
first (its tracked and unignored files), so that the editable install and the inner run write
nothing into it."""

from __future__ import annotations

import os
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from kvprefetch.runner import run
from kvprefetch.sources.download import configured_index_url
from kvprefetch.upstream import DEFAULT_INDEX_URL

REPO = Path(__file__).resolve().parents[2]


def _copy_checkout(dest: Path) -> Path:
    """The checkout's tracked and unignored files (uncommitted edits included), nothing else:
    no .venv, no build products, no caches."""
    listing = run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                   "--exclude-standard"], echo=False).output
    for rel in filter(None, listing.split("\0")):
        src = REPO / rel
        if not (src.is_file() or src.is_symlink()):
            continue  # deleted in the work tree, not yet in the index
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target, follow_symlinks=False)
    return dest


def _uv() -> str | None:
    try:
        from uv import find_uv_bin
    except ImportError:
        return shutil.which("uv")
    return find_uv_bin()


def _uv_index_environ(env: dict[str, str]) -> dict[str, str]:
    """``env`` with pip's index settings restated for uv, unless uv's own are set."""
    out = dict(env)
    if not any(k in env for k in ("UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_CONFIG_FILE")):
        url = configured_index_url(env)
        if url != DEFAULT_INDEX_URL.rstrip("/"):
            out["UV_INDEX_URL"] = url
    if env.get("PIP_EXTRA_INDEX_URL") and "UV_EXTRA_INDEX_URL" not in env:
        out["UV_EXTRA_INDEX_URL"] = env["PIP_EXTRA_INDEX_URL"]
    if env.get("PIP_CERT") and "SSL_CERT_FILE" not in env:
        out["SSL_CERT_FILE"] = env["PIP_CERT"]
    return out


def _make_venv(venv: Path, checkout: Path, env: dict[str, str]) -> Path:
    """A new venv with the copied kit installed editable with its ``test`` extra: its python."""
    python = venv / "bin" / "python"
    uv = _uv()
    if uv is not None:
        uv_env = _uv_index_environ(env)
        run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], env=uv_env,
            timeout=300)
        run([uv, "pip", "install", "--quiet", "--python", str(python), "-e",
             f"{checkout}[test]"], env=uv_env, timeout=900)
    else:
        run([sys.executable, "-m", "venv", str(venv)], env=env, timeout=300)
        run([str(python), "-m", "pip", "install", "-q", "-e", f"{checkout}[test]"], env=env,
            timeout=900)
    return python


def _path_without_nvcc(venv: Path, path: str) -> str:
    """The venv's bin, then ``path`` without every directory that holds an nvcc."""
    keep = [d for d in path.split(os.pathsep) if d and not (Path(d) / "nvcc").exists()]
    return os.pathsep.join([str(venv / "bin"), *keep])


def test_unit_layer_passes_without_torch_or_nvcc(tmp_path: Path,
                                                 base_environ: dict[str, str]) -> None:
    checkout = _copy_checkout(tmp_path / "kvprefetch")
    venv = tmp_path / "venv"
    python = _make_venv(venv, checkout, base_environ)
    env = dict(base_environ, PATH=_path_without_nvcc(venv, base_environ.get("PATH", "")),
               VIRTUAL_ENV=str(venv))
    assert shutil.which("nvcc", path=env["PATH"]) is None

    no_torch = run([str(python), "-c", "import torch"], env=env, check=False, echo=False)
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.output, \
        no_torch.output

    report = tmp_path / "unit.xml"
    done = run([str(python), "-m", "pytest", "tests/unit", "-q", "-p", "no:cacheprovider",
                f"--junitxml={report}", f"--basetemp={tmp_path / 'inner-tmp'}"],
               env=env, cwd=checkout, check=False, timeout=900)
    tail = "\n".join(done.output.splitlines()[-40:])
    assert done.returncode == 0, tail
    root = ET.parse(report).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None, tail
    counts = {k: int(suite.get(k, "0")) for k in ("tests", "skipped", "failures", "errors")}
    assert counts["tests"] > 400 and counts["skipped"] == 0, (counts, tail)
    assert counts["failures"] == counts["errors"] == 0, (counts, tail)
