"""Issue 41, the twenty-eighth hostile pass (tester b: campaigns, reports, outputs, every option
value; here campaign.json and result files fuzzed at every field, and matplotlib's font cache).
Each test fails without its fix (checked by reverting ``src`` and running it):

- Traceback: a campaign.json whose plan names a job by a list or an object (``"name": []`` in
  ``plan.jobs``, an edited or newer kit's record) was ``TypeError: unhashable type: 'list'`` in
  every command that reads the record (``slurm status``, ``submit``, ``resubmit``, and
  ``plan`` again into its folder): ``campaign.load_record`` put the names into a set before
  the plan's own checks ran. Names that are not text are now left out of that set, and the
  plan's check (``Campaign``) reports the record as corrupt.
- Hang: a matplotlib font cache (``fontlist-*.json`` in ``$MPLCONFIGDIR``) naming
  ``/proc/kmsg`` as a font (a regular file of no bytes whose read waits for the kernel's next
  message) hung ``report`` for ever in FreeType's read, before the font check pass 27 added
  could say anything. A font of no bytes in the cache is now refused with the cache to remove
  (``bench.render._check_font``), after which the rerun draws.
- Wrong-way message: under GBK (Big5 and GB18030 alike), ``slurm plan --scratch`` naming a
  folder whose name is already UTF-8 (``中``, ``e4 b8 ad``), which that locale cannot decode,
  was told "is not UTF-8 text / To fix: rename the folder ... to a UTF-8 name", which it is;
  the fix that works is a UTF-8 locale. ``slurm.values.check_utf8`` now asks first whether
  the locale gives other bytes than the UTF-8 text, and says so.
- Wrong-way message: ``slurm plan`` into an empty folder on a read-only file system (a
  read-only tmpfs mounted there) said "scripts: Read-only file system / To fix: . is on a file
  system mounted read-only": the current folder, not the campaign. ``confine.ensure_dir`` makes
  each folder relative to its parent's descriptor, and its error named the part alone; it now
  names the folder whole, so the fix names the campaign's file system.
- Wrong-way message: ``slurm plan /path/café`` was refused as having "characters that cannot
  go into an sbatch script safely (spaces, quotes, $, `, \\, %, control characters) / To fix:
  plan into a folder whose path uses only letters, digits and ...": ``é`` is none of the kinds
  named, and is a letter. The message now names the character refused (``'\\xe9'``) and asks
  for ASCII letters (``slurm.values.check_campaign_path``).
- Wrong-way message: under GBK, ``report --readme R.md`` whose block names ``中.json`` (the
  README's UTF-8 text; the file lies beside it) said "cannot read .../<other name>.json: No
  such file / To fix: pass a JSON file written by kvprefetch bench or verify": the name was
  looked up as GBK, another file (one of that name would have been read into the block). A
  block's name that this locale gives other bytes is now refused first with "run under a UTF-8
  locale" (``bench.readme_blocks.check_block_names``, report and timings blocks).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass24_c import _env, _kit
from tests.integration.test_hostile_pass27_b import _locale, font_cache

_REPO = Path(__file__).resolve().parents[2]


def test_a_campaign_job_named_by_a_list_or_object_is_corrupt_not_a_traceback(
        tmp_path: Path) -> None:
    camp = tmp_path / "camp"
    made = _kit(tmp_path, "slurm", "plan", "--stand-in", "--no-gpu", str(camp))
    assert made.returncode == 0, made.stdout + made.stderr
    record = camp / "campaign.json"
    good = json.loads(record.read_text())
    for name in ([], {}, ["prepare"]):
        doc = json.loads(json.dumps(good))
        doc["plan"]["jobs"][0]["name"] = name
        record.write_text(json.dumps(doc))
        for args in (("status",), ("submit",), ("resubmit", "merge")):
            res = _kit(tmp_path, "slurm", args[0], str(camp), *args[1:])
            err = res.stdout + res.stderr
            # without the fix: TypeError: unhashable type: 'list' (or 'dict')
            assert "Traceback" not in err, (name, args, err)
            assert res.returncode not in (0, 1), (name, args, err)
            assert "error:" in err and "To fix:" in err, (name, args, err)


def test_a_font_cache_naming_proc_kmsg_is_refused_not_a_hang(tmp_path: Path) -> None:
    if not os.path.isfile("/proc/kmsg") or os.path.getsize("/proc/kmsg") != 0:
        pytest.skip("needs /proc/kmsg (a regular file of no bytes) on this system")
    mpl, cache = font_cache(tmp_path)
    doc = json.loads(cache.read_text())
    for font in doc["ttflist"]:
        font["fname"] = "/proc/kmsg"
    cache.write_text(json.dumps(doc))
    result = _REPO / "docs" / "results" / "2026-12-01-h200-headline" / "default-matrix.json"
    out = tmp_path / "out"
    try:
        res = _kit(tmp_path, "report", str(result), "--out", str(out), "--formats", "png",
                   MPLCONFIGDIR=str(mpl), timeout=45)
    except subprocess.TimeoutExpired:
        pytest.fail("report hung reading /proc/kmsg as a font")  # without the fix
    err = res.stdout + res.stderr
    assert "Traceback" not in err, err
    assert res.returncode == 7, err
    assert "'/proc/kmsg', a file of no bytes" in err, err
    assert "To fix: remove matplotlib's font cache" in err, err
    cache.unlink()  # what the fix says
    again = _kit(tmp_path, "report", str(result), "--out", str(out), "--formats", "png",
                 MPLCONFIGDIR=str(mpl))
    assert again.returncode == 0, again.stdout + again.stderr
    assert (out / "default-matrix.png").is_file()


def test_a_utf8_scratch_under_gbk_is_sent_to_a_utf8_locale_not_told_to_rename(
        tmp_path: Path) -> None:
    locales = _locale(tmp_path, "zh_CN", "GBK", "zh_CN.GBK")
    scratch = os.fsencode(tmp_path) + "/中".encode()  # e4 b8 ad: UTF-8, and not GBK
    os.mkdir(scratch)
    argv = [b"slurm", b"plan", b"--stand-in", b"--no-gpu", b"--scratch", scratch,
            os.fsencode(tmp_path / "camp")]
    env = _env(tmp_path, LOCPATH=str(locales), LC_ALL="zh_CN.GBK")
    res = subprocess.run([sys.executable.encode(), b"-m", b"kvprefetch", *argv], env=env,
                         capture_output=True, timeout=120, check=False)
    err = (res.stdout + res.stderr).decode("utf-8", "replace")
    assert "Traceback" not in err, err
    assert res.returncode != 0 and not (tmp_path / "camp").exists(), err
    assert "(gbk), other bytes than its UTF-8 text" in err, err
    # without the fix: "is not UTF-8 text ... To fix: rename the folder ... to a UTF-8 name"
    assert "To fix: run kvprefetch under a UTF-8 locale" in err and "rename" not in err, err
    env["LC_ALL"] = "C.UTF-8"  # what the fix says
    again = subprocess.run([sys.executable.encode(), b"-m", b"kvprefetch", *argv], env=env,
                           capture_output=True, timeout=120, check=False)
    assert again.returncode == 0, (again.stdout + again.stderr).decode("utf-8", "replace")
    script = next((tmp_path / "camp" / "scripts").glob("10-build-baseline*"))
    assert scratch in script.read_bytes()


def test_a_plan_into_a_read_only_mount_names_that_mount_not_the_current_folder(
        tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "none", str(ro)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"needs to mount a read-only tmpfs (root): {mounted.stderr[-200:]}")
    try:
        res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan", "--stand-in",
                              "--no-gpu", str(ro)], env=_env(tmp_path), cwd=tmp_path,
                             capture_output=True, text=True, timeout=120, check=False)
    finally:
        subprocess.run(["umount", str(ro)], check=False)
    err = res.stdout + res.stderr
    assert "Traceback" not in err and res.returncode != 0, err
    # without the fix: "scripts: Read-only file system / To fix: . is on a file system ..."
    # (the plan's first write is its lock since the thirty-sixth pass, then scripts/)
    assert f"{ro}/.kvprefetch-campaign.lock: Read-only file system" in err, err
    assert f"To fix: {ro} is on a file system mounted read-only" in err, err


def test_a_campaign_folder_with_a_letter_outside_ascii_is_told_which_and_why(
        tmp_path: Path) -> None:
    res = _kit(tmp_path, "slurm", "plan", "--stand-in", "--no-gpu", str(tmp_path / "café"))
    err = res.stdout + res.stderr
    assert "Traceback" not in err and res.returncode != 0, err
    assert not (tmp_path / "café").exists()
    # without the fix: "(spaces, quotes, $, `, \\, %, control characters) / To fix: ... only
    # letters, digits and ...", naming neither the character nor that é is not allowed
    assert "letters outside ASCII; here '\\xe9'" in err, err
    assert "To fix: plan into a folder whose path uses only ASCII letters" in err, err
    again = _kit(tmp_path, "slurm", "plan", "--stand-in", "--no-gpu", str(tmp_path / "cafe"))
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_readme_block_naming_a_utf8_file_under_gbk_is_sent_to_a_utf8_locale(
        tmp_path: Path) -> None:
    locales = _locale(tmp_path, "zh_CN", "GBK", "zh_CN.GBK")
    result = _REPO / "docs" / "results" / "2026-12-01-h200-headline" / "default-matrix.json"
    (tmp_path / "中.json").write_bytes(result.read_bytes())
    readme = tmp_path / "R.md"
    readme.write_text("<!-- report 中.json summary -->\n<!-- /report -->\n", encoding="utf-8")
    before = readme.read_bytes()
    res = _kit(tmp_path, "report", "--readme", str(readme), LOCPATH=str(locales),
               LC_ALL="zh_CN.GBK")
    err = res.stdout + res.stderr
    assert "Traceback" not in err and res.returncode != 0, err
    # without the fix: "cannot read ...: No such file ... To fix: pass a JSON file written by
    # kvprefetch bench or verify, unedited"
    assert "(gbk), another file name than the file's UTF-8 text" in err, err
    assert "To fix: run kvprefetch under a UTF-8 locale" in err, err
    assert readme.read_bytes() == before
    again = _kit(tmp_path, "report", "--readme", str(readme), LC_ALL="C.UTF-8")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "| " in readme.read_text(encoding="utf-8")
