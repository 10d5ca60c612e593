"""Issue 41, the twenty-ninth hostile pass (tester b: campaigns in place, exit records, reports
from the H200's results). Each test fails without its fix (checked by reverting ``src`` and
running it):

- Traceback: a kernels-only build manifest in a campaign's ``work/`` whose ``so_path`` names
  ``/proc/kmsg`` (a regular file of no bytes whose O_NONBLOCK read gives None, or what the kernel
  queued) made ``slurm stand-in`` end in ``TypeError: object supporting the buffer API
  required`` in ``hashing.sha256_file``, which hashed until a read gave ``b""``; had the kernel
  held messages, the hash would have drained its log. The hash now reads the size fstat gives
  (none here), and a read that would wait is an OSError naming the file; stand-in then says
  the library's sha256 is not its manifest's, with the rebuild to run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass24_c import _kit


def test_a_manifest_naming_proc_kmsg_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    if not os.path.isfile("/proc/kmsg") or not os.access("/proc/kmsg", os.R_OK):
        pytest.skip("needs a readable /proc/kmsg (root)")
    camp = tmp_path / "camp"
    made = _kit(tmp_path, "slurm", "plan", "--stand-in", "--no-gpu", "--batch", "1", str(camp))
    assert made.returncode == 0, made.stdout + made.stderr
    for tree in ("baseline", "patched"):
        folder = camp / "work" / "build" / tree / "k1"
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text(json.dumps({
            "tree": tree, "variant": tree, "namespace": f"ns_{tree}", "so_path": "/proc/kmsg",
            "so_sha256": "0" * 64, "head_sizes": [128], "block_sizes": [16],
            "kv_dtypes": ["auto"]}))
    res = _kit(tmp_path, "slurm", "stand-in", str(camp), "--task", "0", timeout=60)
    err = res.stdout + res.stderr
    # without the fix: TypeError: object supporting the buffer API required
    assert "Traceback" not in err, err
    assert res.returncode not in (0, 1), err
    # since the thirty-second pass a library outside the work directory is refused before it
    # is hashed (kernels.ops.find_builds): /proc/kmsg is one
    assert "names the library '/proc/kmsg', outside the work directory" in err \
        and "To fix: rebuild the tree" in err, err
    assert not (camp / "results" / "bench-0.json").exists()
