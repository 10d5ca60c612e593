"""What the twenty-ninth hostile pass left open, closed by the lead afterwards (the job's own
log and the processes below a stopped child have their own files: test_job_log.py and
test_runner_below.py). Each test failed before its fix."""

from __future__ import annotations

import os

import pytest

from tests.integration.test_reliability import cli


def test_a_model_config_that_waits_for_data_is_named_as_such_not_bad_json() -> None:
    """``bench decode --config /proc/kmsg``: a regular file of no bytes whose non-blocking read
    gives nothing yet. The read ended as if at the end of the file, and the message was JSON's
    "Expecting value", as if the file held bad JSON. Now the file is named as one that has
    nothing to read without waiting."""
    if not os.path.isfile("/proc/kmsg") or not os.access("/proc/kmsg", os.R_OK):
        pytest.skip("needs a readable /proc/kmsg (root)")
    res = cli("bench", "decode", "--config", "/proc/kmsg", "--dry-run")
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
    assert "has nothing to read without waiting" in res.stderr, res.stderr
    assert "Expecting value" not in res.stderr
