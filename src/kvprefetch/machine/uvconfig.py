"""Which configuration the kit's uv runs read. uv looks for a ``uv.toml`` or a ``pyproject.toml``
with ``[tool.uv]`` in its working folder and every folder above it, before the user's own
(``~/.config/uv/uv.toml``) and the system's (``/etc/uv/uv.toml``). The kit starts uv in an
empty folder of its own in TMPDIR (``runner.NEUTRAL_CWD``), and above that folder is ``/tmp``,
which every local user may write: a ``/tmp/uv.toml`` of anyone's named the index the overlay
environments installed vLLM and torch from, or their cache (issue 41, the twenty-eighth pass
left it open; shown with ``cache-dir`` in ``tests/integration/test_uv_config.py``). So the kit
names uv's configuration itself: the file the user chose (``UV_CONFIG_FILE``, or none with
``UV_NO_CONFIG``) is uv's own to read; else the user's file, else the system's, is passed with
``--config-file``; else ``--no-config``. Where both a user's and a system file exist, uv would
have merged them: the user's alone is read (name both in one file to keep the system's)."""

from __future__ import annotations

import os
from collections.abc import Mapping


def uv_config_args(environ: Mapping[str, str]) -> list[str]:
    """uv's global options naming the configuration it reads (the module says why)."""
    if environ.get("UV_CONFIG_FILE") or environ.get("UV_NO_CONFIG", "").lower() in (
            "1", "true", "yes", "on"):
        return []
    home = environ.get("HOME", "")
    user = environ.get("XDG_CONFIG_HOME") or (os.path.join(home, ".config") if home else "")
    system = [*(environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":"), "/etc"]
    for folder in (user, *system):
        path = os.path.join(folder, "uv", "uv.toml")
        if os.path.isabs(folder) and os.path.isfile(path):
            return ["--config-file", path]
    return ["--no-config"]
