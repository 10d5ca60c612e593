"""Issue 41, the seventeenth hostile pass (tester c: every command, option and input, for
tracebacks and wrong writes). Each test fails without its fix (checked by reverting ``src``
and running it):

- ``bench e2e`` reads the verify-kernel report (``<workdir>/verify/report.json`` or
  ``--verify-report``), data like every record in the work directory, and took its ``envs`` on
  trust: ``"envs": 5`` (or ``true``) was ``TypeError: 'int' object is not iterable``, a python
  recorded as a number or a list was ``Path()``'s TypeError, both tracebacks in the dry run
  too, and a python with a NUL in it was subprocess's ``ValueError: embedded null byte``
  traceback in the real run. Now such a report is "malformed", named, with a To fix (exit 7;
  a dry run shows the refusal it would make and exits 0, as for any other refusal).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvprefetch.errors import BenchError
from tests.integration.test_reliability import cli, outside, refused

__all__ = ["outside"]  # the autouse fixture: nothing outside the test's folders changes

# (the report's envs, the words the message must hold)
MALFORMED_ENVS: dict[str, tuple[Any, str]] = {
    "envs-a-number": (5, "its `envs` is int"),
    "envs-true": (True, "its `envs` is bool"),
    "python-a-number": ({"baseline": {"python": 5}, "patched": {"python": "/bin/true"}},
                        "python is int"),
    "python-a-list": ([{"name": "baseline", "python": ["x"]},
                       {"name": "patched", "python": "/bin/true"}], "python is list"),
    "python-with-a-nul": ({"baseline": {"python": "/bin/true\x00x"},
                           "patched": {"python": "/bin/true"}}, "python is '/bin/true\\x00x'"),
    "name-a-list": ([[1], {"name": "patched", "python": "/bin/true"}], "name is list"),
}


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
@pytest.mark.parametrize("case", sorted(MALFORMED_ENVS))
def test_a_verify_report_with_envs_of_the_wrong_type_is_malformed_not_a_traceback(
        tmp_path: Path, case: str, dry_run: bool) -> None:
    envs, needle = MALFORMED_ENVS[case]
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"passed": True, "envs": envs}))
    res = cli("bench", "e2e", "--workdir", str(tmp_path / "wd"), "--out", str(tmp_path / "out"),
              "--model-dir", str(tmp_path), "--verify-report", str(report),
              *(["--dry-run"] if dry_run else []), timeout=60)
    text = res.stdout + res.stderr
    assert "Traceback" not in text, text
    if dry_run:  # the plan, and the refusal the run would make
        assert res.returncode == 0, text
        assert "would refuse" in text and "is malformed" in text and needle in text, text
    else:
        refused(res, BenchError.exit_code, "is malformed", needle, str(report))
