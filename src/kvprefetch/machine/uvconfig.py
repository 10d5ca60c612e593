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
have merged them: the user's alone is read (name both in one file to keep the system's).

uv reads that file whole, waiting on it: a ``UV_CONFIG_FILE`` naming a FIFO, ``/proc/kmsg`` or
``/dev/zero`` (or a user's ``uv.toml`` linked to one) kept ``build --mode overlay`` in ``uv
venv`` for ever, with no output (issue 41, the thirtieth hostile pass). Such a file is refused
before uv starts (``check_readable``). A relative ``UV_CONFIG_FILE`` is named to uv from the
folder the kit was started in, where the user meant it."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from ..errors import ConfigError
from ..reading import MAX_RECORD_BYTES


def uv_config_args(environ: Mapping[str, str]) -> list[str]:
    """uv's global options naming the configuration it reads (the module says why). Every uv
    run the kit starts names its options here, so its cache folder is checked here too
    (``refuse_foreign_cache``)."""
    refuse_foreign_cache(environ)
    # uv's own reading of a yes (clap's boolish values): y and t too, which the kit missed and
    # then named the user's uv.toml though the user had asked for none (the thirtieth pass)
    if environ.get("UV_CONFIG_FILE") or environ.get("UV_NO_CONFIG", "").lower() in (
            "1", "true", "yes", "on", "y", "t"):
        chosen = environ.get("UV_CONFIG_FILE")
        if not chosen:
            return []
        check_readable(chosen, "UV_CONFIG_FILE",
                       "point UV_CONFIG_FILE at a uv.toml file, or unset it")
        # uv starts in an empty folder of the kit's: a relative UV_CONFIG_FILE, meant from
        # the user's folder, was "No such file" there though the file was in place (issue 41,
        # the thirtieth hostile pass). Named absolute; uv's option wins over its variable.
        return [] if os.path.isabs(chosen) else ["--config-file", os.path.abspath(chosen)]
    home = environ.get("HOME", "")
    user = environ.get("XDG_CONFIG_HOME") or (os.path.join(home, ".config") if home else "")
    system = [*(environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":"), "/etc"]
    for folder in (user, *system):
        path = os.path.join(folder, "uv", "uv.toml")
        if os.path.isabs(folder) and os.path.isfile(path):
            check_readable(path, "uv's configuration",
                           f"replace {path} by a uv.toml file, or move it away (or set "
                           "UV_NO_CONFIG=1)")
            return ["--config-file", path]
    return ["--no-config"]


_CACHES = {"uv": ("UV_CACHE_DIR", "UV_NO_CACHE"), "pip": ("PIP_CACHE_DIR", "PIP_NO_CACHE_DIR")}


def refuse_foreign_cache(environ: Mapping[str, str], tool: str = "uv") -> None:
    """Refuse (ConfigError) a cache folder of ``tool`` (uv or pip) that another user chose: each
    writes its cache by path in its own variable's folder (``UV_CACHE_DIR``, ``PIP_CACHE_DIR``),
    else ``$XDG_CACHE_HOME/<tool>``, else ``~/.cache/<tool>`` (the ``uv venv`` of a kernels-only
    ``--env-backend uv`` build its interpreter records, an overlay or full build gigabytes of
    wheels); ``XDG_CACHE_HOME`` through ``nobody``'s link had uv write in the folder the link
    chose (issue 41, the fortieth hostile pass; pip's by the lead after it). ``UV_NO_CACHE`` and
    ``PIP_NO_CACHE_DIR`` use none; a relative folder lies in the kit's own empty working
    folder."""
    from ..workspace.foreign import refuse_foreign_chosen

    own, off = _CACHES[tool]
    if environ.get(off, "").lower() in ("1", "true", "yes", "on", "y", "t"):
        return
    for var, folder in ((own, environ.get(own, "")),
                        ("XDG_CACHE_HOME", os.path.join(environ.get("XDG_CACHE_HOME", ""), tool)),
                        ("HOME", os.path.join(environ.get("HOME", ""), ".cache", tool))):
        if not environ.get(var):
            continue
        # uv and pip leave a relative XDG_CACHE_HOME out (the XDG rule) and take HOME's: read
        # as the end here, nobody's link at HOME went unchecked and `uv venv` wrote its cache
        # through it (issue 41, the forty-first hostile pass)
        if var == "XDG_CACHE_HOME" and not os.path.isabs(environ[var]):
            continue
        if os.path.isabs(folder):
            refuse_foreign_chosen(Path(folder), f"{tool}'s cache {folder} (from {var}="
                                  f"{environ[var]})", f"set {var} to a folder of your own (or "
                                  f"{own} to one), or unset it, then rerun")
        return


def check_readable(path: str, what: str, fix: str) -> None:
    """Refuse a configuration file uv would wait on for ever, or read without end: a FIFO, a
    device, a socket, a kernel file that says 0 bytes and whose read would wait
    (``/proc/kmsg``), or one past the kit's own record limit. One uv cannot open, or a folder,
    is left to uv, which says so and stops at once."""
    try:
        st = os.stat(path)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode):
        return
    why = ""
    if not stat.S_ISREG(st.st_mode):
        why = "is not a regular file (a FIFO, device or socket)"
    elif st.st_size > MAX_RECORD_BYTES:
        why = f"has {st.st_size} bytes, more than any uv.toml"
    elif st.st_size == 0 and _read_would_wait(path):
        why = "is a kernel file whose read waits"
    if why:
        raise ConfigError(f"{what} {path} {why}; uv reads it whole and would wait on it for "
                          "ever", fix)


def _read_would_wait(path: str) -> bool:
    """Whether a first read of an empty-looking regular file would wait (a kernel file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.read(fd, 1)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False
