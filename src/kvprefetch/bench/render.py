"""Small pieces every result renderer shares: a markdown table, a geometric mean, context
lengths as written in tables, and matplotlib (imported lazily; PNGs only with the `plot` extra)."""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..errors import BenchError, ConfigError
from .schema import RepeatsRow, ShapeRow


def geomean(values: Iterable[float]) -> float | None:
    vals = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def ctx(n: int) -> str:
    """``4096`` -> ``4k``; other lengths as they are."""
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def _mpl_folders() -> list[tuple[str, Path]]:
    """The folders matplotlib makes and writes (its config folder, and its cache folder, where
    it writes ``fontlist-*.json``) when it is imported, each with the variable that chose it:
    ``MPLCONFIGDIR`` for both, else ``XDG_CONFIG_HOME``/``XDG_CACHE_HOME`` or ``HOME``'s
    ``.config``/``.cache``, plus ``matplotlib`` (matplotlib's ``_get_config_or_cache_dir``)."""
    chosen = os.environ.get("MPLCONFIGDIR")
    if chosen:
        return [("MPLCONFIGDIR", Path(chosen))]
    home = os.path.expanduser("~")
    out = []
    for var, default in (("XDG_CONFIG_HOME", ".config"), ("XDG_CACHE_HOME", ".cache")):
        base = os.environ.get(var)
        out.append((var, Path(base, "matplotlib")) if base
                   else ("HOME", Path(home, default, "matplotlib")))
    return out


def _refuse_foreign_mpl_folders() -> None:
    """Refuse (ConfigError) a folder matplotlib would write in that another user chose: a link
    of theirs on the way, or a folder above it of theirs. matplotlib makes its folders and
    writes its font cache by path through whatever the variables name: ``XDG_CACHE_HOME``
    through ``nobody``'s link in a shared folder had ``report --formats png`` make
    ``matplotlib/fontlist-*.json`` in the folder the link chose, which ``nobody`` can re-point
    at any folder of the user's between two runs (issue 41, the fortieth hostile pass; the
    rule of ``TMPDIR``, ``foreign.refuse_foreign_temp``, the thirty-ninth's)."""
    from ..workspace.foreign import absolute_folder_vars, refuse_foreign_folders

    # matplotlib is imported in `/` (``pyplot``), and reads a relative folder from there: with
    # MPLCONFIGDIR (or XDG_CACHE_HOME, or HOME) relative, this check read it from the user's
    # folder and matplotlib wrote its font cache below `/`, through nobody's link in
    # `/tmp` (issue 41, the forty-first hostile pass). Named absolute, from the user's folder,
    # where the user meant it, for the check and matplotlib alike.
    absolute_folder_vars(("MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "HOME"),
                         os.environ)
    for var, folder in _mpl_folders():
        if not folder.is_absolute():
            # matplotlib is imported in `/` (pyplot says why), where it makes a relative folder:
            # MPLCONFIGDIR=mpl (or HOME empty) had `report --formats png` make /mpl and write
            # its font cache there, while this check looked at ./mpl (issue 41, the forty-first
            # hostile pass)
            raise ConfigError(f"matplotlib's folder {folder} (from {var}="
                              f"{os.environ.get(var, '')}) is not an absolute path: matplotlib "
                              "would make it in / (kvprefetch imports it there), not in the "
                              "current folder",
                              f"set {var} to an absolute path of a folder of your own (or unset "
                              "it), or pass --formats md for no figures, then rerun")
        refuse_foreign_folders([(var, folder)], os.environ, "matplotlib's folder",
                               also=", or pass --formats md for no figures")


def pyplot() -> Any:
    # imported in `/`, not the current folder: matplotlib reads `matplotlibrc` from the current
    # folder on import, and a FIFO of that name there (a campaign's results/, where `report` is
    # run) had the import wait on it for ever (issue 41, the twenty-sixth pass)
    _refuse_foreign_mpl_folders()
    try:
        here: int | None = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:  # a folder it cannot look into: matplotlib cannot see a matplotlibrc there
        here = None
    try:
        if here is not None:
            os.chdir("/")
        try:
            import matplotlib
        except ImportError as exc:
            from ..oserrors import out_of_memory

            memory = out_of_memory(exc)  # installed, but not loaded under `ulimit -v`
            if memory is not None:
                raise BenchError(*memory) from exc
            raise BenchError("matplotlib is needed for the PNG plots",
                             "pip install 'kvprefetch[plot]' (or pass --formats json,md)") from exc
        # matplotlib's own defaults, not the matplotlibrc it read on import: it looks first in
        # the current folder (then $MATPLOTLIBRC, $MPLCONFIGDIR, ~/.config), and `figure.hooks`
        # there made every figure import and call a module (`report` run in a campaign's
        # results/: code taken from the campaign), `text.usetex` ran latex (issue 41, the
        # twenty-fifth pass)
        matplotlib.rcdefaults()
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    finally:
        if here is not None:
            os.fchdir(here)
            os.close(here)

    _check_font()

    # numpy's overflow and invalid-value warnings from matplotlib's tick and transform code on a
    # result's numbers near or past the float limit (1e308, Infinity: they plot, off any scale).
    # They name matplotlib's own files, not the input, so they would only send the user there
    # (issue 41, eighth pass); the report's tables still show every number as it is.
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"matplotlib\.")

    return plt


def _check_font() -> None:
    """The font every figure draws its text with opens. matplotlib takes the font files from its
    font cache (``fontlist-*.json`` in ``$MPLCONFIGDIR`` or ``~/.cache/matplotlib``); a cache
    naming a broken file (a stale or planted one) failed the first label drawn with "the module
    matplotlib raised RuntimeError: FT_Open_Face ... broken file / To fix: ... reinstall it",
    which leaves the cache as it is (issue 41, the twenty-seventh hostile pass)."""
    from matplotlib import font_manager, get_cachedir

    try:
        fname = font_manager.findfont(font_manager.FontProperties())
    except (OSError, RuntimeError, ValueError):  # no font at all: matplotlib's own message
        return
    cache = os.path.join(get_cachedir(), "fontlist-*.json")
    # a font file of no bytes (/proc/kmsg, whose read waits for the kernel's next message) is no
    # font: named in the cache, for the text or as a fallback family, FreeType's read of it
    # hung `report` for ever (issue 41, the twenty-eighth hostile pass)
    for entry in (*font_manager.fontManager.ttflist, *font_manager.fontManager.afmlist):
        try:
            empty = os.path.getsize(entry.fname) == 0
        except (OSError, TypeError, ValueError):
            continue  # gone or no path: matplotlib falls back from it itself
        if empty:
            raise BenchError(f"matplotlib's font cache ({cache}) names {entry.fname!r}, a file "
                             "of no bytes, as a font for the figures' text",
                             f"remove matplotlib's font cache (rm {cache}: the next run builds "
                             "it again from the system's fonts), or pass --formats md for no "
                             "figures")
    try:
        font_manager.get_font(fname)
    except (OSError, RuntimeError, ValueError) as exc:
        raise BenchError(f"matplotlib's font {fname} cannot be opened ({exc}); matplotlib's "
                         f"font cache ({cache}) names it for the figures' text",
                         f"remove matplotlib's font cache (rm {cache}: the next run builds it "
                         "again from the system's fonts) or repair that font file, or pass "
                         "--formats md for no figures") from None


# At most this many heatmaps in one figure, and numbers written in a heatmap of at most this many
# cells (a real run's default matrix is one group of 37 shapes, a few variants); groups of bars
# (ncu_png: one per shape and kernel; decode_png: one per shape); the longest name drawn, in
# characters and lines (a real name is tens of characters; the markdown has every name whole)
MAX_PANELS = 24
MAX_CELLS = 400
MAX_BARS = 48
MAX_LABEL_CHARS = 160
MAX_LABEL_LINES = 4


def plain(text: object) -> str:
    """``text`` (a name read from a result) drawn as it is: every ``$`` escaped, so a model,
    variant or shape name holding two is no mathtext (``$\\frac{$`` failed the figure as "not what
    kvprefetch writes", a folder's name that `bench decode` writes unedited; issue 41, the
    twenty-fifth pass). At most ``MAX_LABEL_CHARS`` characters on ``MAX_LABEL_LINES`` lines:
    a name of 100,000 combining accents ran the figure's layout for minutes until memory ran
    out, 200,000 letters for 40 s (the markdown has every name whole)."""
    text = "\n".join(str(text).split("\n")[:MAX_LABEL_LINES])
    if len(text) > MAX_LABEL_CHARS:
        text = text[:MAX_LABEL_CHARS] + "…"
    return text.replace("$", "\\$")


def save_figure(fig: Any, path: Path) -> Path:
    """Write ``fig`` as a PNG at ``path``: rendered in memory, then written by
    confine.write_file (matplotlib's own writer would follow a symlink planted at ``path``)."""
    import io

    import matplotlib.pyplot as plt

    from ..workspace.confine import write_file

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    write_file(path, buf.getvalue(), family=BenchError)
    return path


def shape_key(r: ShapeRow | RepeatsRow) -> tuple[str, str, str, int, int, int, str]:
    """What identifies a result row's shape, whatever its mode."""
    return (r["preset"], r["dtype"], r["kv_cache_dtype"], r["block_size"], r["batch"],
            r["context"], r["kernel"])


def row_mode(r: ShapeRow) -> str:
    """A row's mode as the tables show it: ``cold`` for graph replay (and rows from before the
    timing was recorded), ``cold eager`` for an eager row. In vLLM's call a graph run holds
    eager rows too (steps past the capture length or the largest bucket, which vLLM runs
    eagerly), and they must not share a table row with the graph replays."""
    timing = r.get("timing") or "graph"
    return r["mode"] if timing == "graph" else f"{r['mode']} {timing}"
