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
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass24_c import _env, _kit

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
    mpl = tmp_path / "mpl"
    mpl.mkdir()
    made = subprocess.run([sys.executable, "-c", "import matplotlib.font_manager"],
                          env=_env(tmp_path, MPLCONFIGDIR=str(mpl)), capture_output=True,
                          text=True, timeout=120, check=False)
    [cache] = mpl.glob("fontlist-*.json") or [None]
    if cache is None:
        pytest.skip(f"matplotlib made no font cache: {made.stderr[-300:]}")
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
