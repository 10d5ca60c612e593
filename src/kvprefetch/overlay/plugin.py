"""The overlay plugin as an installable wheel, written by us (no build backend, no network):
the package ``kvprefetch_overlay`` (``plugin_template.py`` plus an ``overlay.json`` naming the
tree, its namespace and its library) and a dist-info whose ``entry_points.txt`` registers
``kvprefetch = kvprefetch_overlay:register`` under ``vllm.general_plugins``. pip or uv install
it like any wheel, so it is listed, recorded and uninstallable like any package."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import zipfile
from pathlib import Path
from typing import Any

from ..errors import BuildError
from ..workspace.confine import write_file

DIST_NAME = "kvprefetch_vllm_overlay"
PACKAGE = "kvprefetch_overlay"
ENTRY_GROUP = "vllm.general_plugins"
ENTRY_NAME = "kvprefetch"
VERSION = "0.1.0"
TEMPLATE = Path(__file__).resolve().parent / "plugin_template.py"


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def plugin_files(config: dict[str, Any]) -> dict[str, bytes]:
    """Every file of the wheel but RECORD, by archive path."""
    info = f"{DIST_NAME}-{VERSION}.dist-info"
    return {
        f"{PACKAGE}/__init__.py": TEMPLATE.read_bytes(),
        f"{PACKAGE}/overlay.json": (json.dumps(config, indent=1, sort_keys=True) + "\n").encode(),
        f"{info}/METADATA": (
            "Metadata-Version: 2.1\n"
            f"Name: {DIST_NAME.replace('_', '-')}\n"
            f"Version: {VERSION}\n"
            "Summary: kvprefetch overlay: routes vLLM 0.10.2's paged_attention_v1/v2 to one "
            "tree's compiled kernels\n"
            "License: Apache-2.0\n").encode(),
        f"{info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: kvprefetch\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n"),
        f"{info}/entry_points.txt": (
            f"[{ENTRY_GROUP}]\n{ENTRY_NAME} = {PACKAGE}:register\n").encode(),
        f"{info}/top_level.txt": f"{PACKAGE}\n".encode(),
    }


def write_plugin_wheel(dest_dir: Path, config: dict[str, Any], *,
                       root: Path | None = None) -> Path:
    """Write the wheel into ``dest_dir`` (deterministic bytes for the same config), made in
    memory and written by ``confine.write_file`` (from the work directory ``root`` down when
    given): a link planted at the wheel, its temporary or its folder is refused, never written
    through (issue 41, the thirteenth hostile pass: ``zipfile`` opened ``<wheel>.tmp`` by path
    and truncated the file a planted link named)."""
    files = plugin_files(config)
    info = f"{DIST_NAME}-{VERSION}.dist-info"
    record = "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d in files.items())
    record += f"{info}/RECORD,,\n"
    files[f"{info}/RECORD"] = record.encode()
    whl = dest_dir / f"{DIST_NAME}-{VERSION}-py3-none-any.whl"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            zi = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            z.writestr(zi, data, zipfile.ZIP_DEFLATED)
    write_file(whl, buf.getvalue(), root=root, family=BuildError)
    return whl
