"""The kit's scratch space inside the work directory (ownership.scratch_dir) and the build's
progress line (machine/progress.py): pure, no process started, no network."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from kvprefetch.errors import ConfigError
from kvprefetch.machine.progress import CompileProgress, clock, heartbeat, previous_seconds
from kvprefetch.workspace import ownership


def test_scratch_is_in_the_work_directory_recorded_while_used_and_gone_after(
        tmp_path: Path) -> None:
    with ownership.scratch_dir(tmp_path, "apply") as d:
        assert d.is_dir() and d.parent == tmp_path / "tmp" and d.name.startswith(
            f"apply-{os.getpid()}-")
        entry = ownership.owned(tmp_path, d)
        # with this run's start time where /proc has it (the fifteenth hostile pass)
        assert entry == {"kind": "tmp", "pid": os.getpid(), **(
            {"started": ownership.start_time(os.getpid())} if os.path.exists("/proc/self/stat")
            else {})}
        (d / "t").write_text("x")
    assert not d.exists() and ownership.owned(tmp_path, d) is None
    assert not (tmp_path / "tmp").exists()  # the empty scratch folder goes too
    with pytest.raises(RuntimeError), ownership.scratch_dir(tmp_path, "apply") as d:
        raise RuntimeError("a failing step")
    assert not d.exists() and ownership.entries(tmp_path) == {}


def test_scratch_left_by_a_killed_run_is_an_orphan_that_is_removed(tmp_path: Path) -> None:
    dead = 2**22 + 12345  # above the default pid_max: no process has it
    left = tmp_path / "tmp" / f"apply-{dead}-0000"
    (left / "t").mkdir(parents=True)
    ownership.record(tmp_path, left, "tmp", pid=dead)
    assert ownership.orphans(tmp_path) == [left]
    assert ownership.remove_orphans(tmp_path) == [str(left)]
    assert not left.exists() and ownership.entries(tmp_path) == {}


def test_scratch_refuses_a_symlinked_tmp(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "work"
    root.mkdir()
    (root / "tmp").symlink_to(elsewhere)
    with pytest.raises(ConfigError, match="is a symlink"), \
            ownership.scratch_dir(root, "apply"):
        pass
    assert list(elsewhere.iterdir()) == []


def test_clock() -> None:
    assert [clock(s) for s in (0, 59.6, 200, 3723)] == ["0:00", "1:00", "3:20", "1:02:03"]


def test_progress_line_estimates_from_the_last_build_or_the_pace() -> None:
    p = CompileProgress(started=100.0)
    assert p.line(130.0) == "compiling [0/?] 0:30 elapsed, no estimate yet"
    p.update(1, 4)
    assert p.line(160.0) == "compiling [1/4] 1:00 elapsed, about 3:00 left (at this pace)"
    last = CompileProgress(started=100.0, expected_s=300.0)
    last.update(2, 4)
    assert last.line(220.0) == "compiling [2/4] 2:00 elapsed, about 3:00 left (as the last build)"
    assert last.line(500.0).endswith("past the last build's 5:00")


def test_pace_counts_only_the_nvcc_edges() -> None:
    """A tree of two nvcc edges (minutes each), then a C++ file and the link (seconds): one nvcc
    edge in, the pace of all four edges said three edges' worth were left (the "57:10 left"
    of a 22-minute tree, issue 42); the nvcc pace says one."""
    p = CompileProgress(started=0.0, heavy=2)
    p.update(1, 4)
    assert p.line(600.0) == "compiling [1/4] 10:00 elapsed, about 10:00 left (at this pace)"
    p.update(2, 4)
    assert p.line(1200.0).endswith("the nvcc compiles are done, linking")
    # several jobs at a time: the C++ edge finishes first and is no nvcc progress
    j = CompileProgress(started=0.0, heavy=2, light_first=True)
    j.update(1, 4)
    assert j.line(30.0).endswith("no estimate yet")
    j.update(2, 4)
    assert j.line(600.0).endswith("about 10:00 left (at this pace)")


def test_ninja_jobs_reads_the_command_line() -> None:
    from kvprefetch.builds.sequence import ninja_jobs

    assert ninja_jobs(["ninja", "-C", "d", "-j", "3"]) == 3
    assert ninja_jobs(("ninja", "-C", "d")) == 1


def test_previous_seconds_reads_the_newest_manifest_of_the_same_selection(tmp_path: Path) -> None:
    sel = {"head_sizes": [128], "block_sizes": [16], "kv_dtypes": ["fp16"], "full": False}
    assert previous_seconds(tmp_path, sel) is None
    for key, secs, heads in (("a", 250.0, [128]), ("b", 900.0, [64, 128]), ("c", "bad", [128])):
        (tmp_path / key).mkdir()
        (tmp_path / key / "manifest.json").write_text(json.dumps(
            {"seconds": secs, "head_sizes": heads, "block_sizes": [16], "kv_dtypes": ["fp16"]}))
    assert previous_seconds(tmp_path, sel) == 250.0


def test_heartbeat_calls_until_the_block_ends() -> None:
    calls: list[float] = []
    with heartbeat(lambda: calls.append(time.monotonic()), every=0.01):
        time.sleep(0.1)
    n = len(calls)
    time.sleep(0.05)
    assert n >= 2 and len(calls) == n
