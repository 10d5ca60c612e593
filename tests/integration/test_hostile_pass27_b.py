"""Issue 41, the twenty-seventh hostile pass (tester b: campaigns, reports, outputs, every option
and environment value; here ``slurm publish`` and ``prepare`` under renameat2 races, and the
Shift_JIS, GBK and Big5 locales). Each test fails without its fix (checked by reverting ``src``
and running it):

- Outside (a folder made where the user named none): under a locale whose encoding is not
  UTF-8 (``LC_ALL=ja_JP.SJIS``; GBK, Big5 and latin-1 alike), ``slurm plan --scratch`` naming a
  folder of that encoding's bytes (``テスト``, ``83 65 83 58 83 67``) decoded it to text that
  passed the plan's UTF-8 check, and wrote it into the build scripts as UTF-8 (``e3 83 86
  ...``): other bytes, another folder. The build job made that folder (``mkdir -p``) beside the
  one named and built there; ``--python`` ran another interpreter, ``PATH`` named other
  folders. A value bound for a script is now refused unless this locale gives the system the
  same bytes as its UTF-8 text (``slurm.values.check_utf8``), with "To fix: run under a UTF-8
  locale".
- Wrong-way message: a matplotlib font cache (``fontlist-*.json`` in ``$MPLCONFIGDIR``) naming a
  broken font file (a stale or planted cache; here 1 MiB of zeros) failed ``report`` with "the
  module matplotlib raised RuntimeError: FT_Open_Face ... broken file / To fix: ... repair or
  reinstall it", which leaves the cache as it is. Now the font is tried once matplotlib is
  imported (``bench.render._check_font``), and the message names the font and the cache to
  remove, after which the rerun draws.
- Outside, found by reading (b) and fixed by the lead: the same for a work directory, whose
  name the kit's files give in UTF-8 (build.ninja, logs: ``confine._encoded``), so under
  latin-1 a work directory ``wé`` (byte e9) would be ``w\xc3\xa9`` there, and a build would
  work beside it. A work directory such a locale gives other bytes is now refused by every
  command (``Workdir``, ``oserrors.other_bytes_on_disk``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass24_c import _env, _kit
from tests.integration.test_hostile_pass26_c import locale_env


def _locale(tmp_path: Path, source: str, charmap: str, name: str) -> Path:
    """The locale ``name`` compiled into tmp_path (no system locale is changed)."""
    localedef = shutil.which("localedef")
    if localedef is None:
        pytest.skip("needs localedef to compile a locale")
    where = tmp_path / "locales"
    where.mkdir(exist_ok=True)
    res = subprocess.run([localedef, "-i", source, "-f", charmap, str(where / name)],
                         capture_output=True, text=True, check=False, timeout=60)
    if not (where / name).is_dir():
        pytest.skip(f"localedef could not compile {name}: {res.stderr[-300:]}")
    return where


def test_a_scratch_named_in_a_non_utf8_locale_never_becomes_another_folder_in_the_scripts(
        tmp_path: Path) -> None:
    # one locale (GBK and Big5 behave alike, tried by hand): localedef takes seconds each
    name, encoded = "ja_JP.SJIS", b"\x83\x65\x83\x58\x83\x67"  # テスト
    locales = _locale(tmp_path, "ja_JP", "SHIFT_JIS", name)
    scratch = os.fsencode(tmp_path) + b"/" + encoded
    os.mkdir(scratch)
    camp = tmp_path / "camp"
    env = locale_env(tmp_path, locales, name)
    res = subprocess.run([os.fsencode(sys.executable), b"-m", b"kvprefetch", b"slurm", b"plan",
                          os.fsencode(camp), b"--stand-in", b"--batch", b"1", b"--scratch",
                          scratch, b"--python", os.fsencode(sys.executable)],
                         env=env, capture_output=True, timeout=120, check=False)
    err = res.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err, err
    # without the fix: exit 0, and 10-build-baseline.sbatch says SCRATCH_BASE="<tmp>/テスト" in
    # UTF-8, a folder the job makes beside the one named
    scripts = list(camp.glob("scripts/*.sbatch")) if camp.exists() else []
    assert not any(encoded.decode("shift_jis").encode("utf-8") in p.read_bytes()
                   for p in scripts), "another folder named"
    assert res.returncode == 2, err
    assert "To fix: run kvprefetch under a UTF-8 locale" in err, err
    assert os.listdir(scratch) == []


@pytest.mark.parametrize("command", [("clean", "--dry-run"), ("fetch", "--dry-run")],
                         ids=["clean", "fetch"])
def test_a_work_directory_a_latin1_locale_gives_other_bytes_is_refused(
        tmp_path: Path, command: tuple[str, ...]) -> None:
    """Under ``de_DE.ISO-8859-1`` a work directory ``wé`` (byte e9): refused, exit 2, naming
    the encoding, nothing made, where it went on before (exit 0; a build's files would have
    named ``w\xc3\xa9``)."""
    locales = _locale(tmp_path, "de_DE", "ISO-8859-1", "de_DE.ISO-8859-1")
    folder = os.fsencode(tmp_path) + b"/w\xe9"
    os.mkdir(folder)
    env = locale_env(tmp_path, locales, "de_DE.ISO-8859-1")
    res = subprocess.run([os.fsencode(sys.executable), b"-m", b"kvprefetch",
                          *(c.encode() for c in command), b"--workdir", folder + b"/work"],
                         env=env, capture_output=True, timeout=120, check=False)
    err = res.stderr.decode("latin-1")
    assert "Traceback" not in err, err
    assert res.returncode == 2, err
    assert "iso8859-1" in err and "To fix: run kvprefetch under a UTF-8 locale" in err, err
    assert os.listdir(folder) == []


def font_cache(tmp_path: Path) -> tuple[Path, Path]:
    """A matplotlib config folder of the test's own (``<tmp>/mpl``) and the font cache
    matplotlib made in it; skips where it made none."""
    mpl = tmp_path / "mpl"
    mpl.mkdir()
    made = subprocess.run([sys.executable, "-c", "import matplotlib.font_manager"],
                          env=_env(tmp_path, MPLCONFIGDIR=str(mpl)), capture_output=True,
                          text=True, timeout=120, check=False)
    [cache] = mpl.glob("fontlist-*.json") or [None]
    if cache is None:
        pytest.skip(f"matplotlib made no font cache: {made.stderr[-300:]}")
    return mpl, cache


def test_a_font_cache_naming_a_broken_font_sends_the_user_to_the_cache_not_matplotlib(
        tmp_path: Path) -> None:
    import json

    mpl, cache = font_cache(tmp_path)
    broken = tmp_path / "broken.ttf"
    broken.write_bytes(b"\0" * (1 << 20))
    doc = json.loads(cache.read_text())
    for font in doc["ttflist"]:
        font["fname"] = str(broken)
    cache.write_text(json.dumps(doc))
    result = Path(__file__).resolve().parents[2] / "docs" / "results" / \
        "2026-12-01-h200-headline" / "default-matrix.json"
    out = tmp_path / "out"
    res = _kit(tmp_path, "report", str(result), "--out", str(out), MPLCONFIGDIR=str(mpl))
    err = res.stdout + res.stderr
    assert "Traceback" not in err, err
    # without the fix: "the module matplotlib (...) raised RuntimeError: FT_Open_Face ...
    # To fix: ... repair or reinstall it"
    assert res.returncode == 7, err
    assert f"matplotlib's font {broken} cannot be opened" in err, err
    assert "To fix: remove matplotlib's font cache" in err and "reinstall" not in err, err
    cache.unlink()  # what the fix says
    again = _kit(tmp_path, "report", str(result), "--out", str(out), MPLCONFIGDIR=str(mpl))
    assert again.returncode == 0, again.stdout + again.stderr
    assert (out / "default-matrix.png").is_file()
