"""`report --merge`: shards of one bench kernel campaign into one document; refused, naming the
field, when the shards come from different GPUs, builds or kit commits (unless --force-merge);
a shape present in two shards always refused. Pure: hand-made shard documents, no GPU."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvprefetch.bench.merge import merge_kernel_docs
from kvprefetch.bench.report import render_markdown
from kvprefetch.cli import main
from kvprefetch.errors import BenchError


def _row(batch: int, speedup: float) -> dict[str, Any]:
    t = {"median": 10.0, "p25": 9.9, "p75": 10.1, "min": 9.8, "max": 10.2, "n": 3}
    s = {"median": speedup, "p25": speedup, "p75": speedup, "min": speedup - 0.01,
         "max": speedup + 0.01, "n": 3}
    return {"preset": "llama-3.1-8b", "batch": batch, "context": 1024, "num_heads": 32,
            "num_kv_heads": 8, "head_size": 128, "block_size": 16, "dtype": "float16",
            "kv_cache_dtype": "auto", "kernel": "v1", "kernel_forced": False,
            "label": f"llama-3.1-8b b{batch} ctx1k blk16 float16 v1", "mode": "cold",
            "bytes_moved": 1, "bitwise_equal": True, "status": "measured", "error": "",
            "plan": {"layers": 4, "launches": 8, "replays": 1, "bytes_per_layer": 1,
                     "est_launch_us": 1.0},
            "variants": {"baseline": {"time_us": t, "speedup": None, "bw_fraction": 0.5,
                                      "equal_to_baseline": None, "nan_free": True},
                         "patched": {"time_us": t, "speedup": s, "bw_fraction": 0.6,
                                     "equal_to_baseline": True, "nan_free": True}}}


def _shard(batch: int, speedup: float = 1.5) -> dict[str, Any]:
    return {"kind": "kernel", "schema": 1, "meta": {
        "started": "2026-12-01T00:00:00Z", "seconds": 2.0,
        "device": {"name": "NVIDIA H200", "l2_bytes": 60 * 2**20, "sm_count": 132},
        "copy_bw_bytes_per_s": 4e12, "baseline": "baseline",
        "variants": [{"name": "baseline", "so_sha256": "aa" * 32},
                     {"name": "patched", "so_sha256": "bb" * 32}],
        "configs": [], "matrix": {}, "command": [], "aborted": "", "not_measured": [],
        "kit": {"version": "0.1.0", "commit": "c0ffee"}},
        "results": [_row(batch, speedup)]}


def test_shards_of_one_campaign_merge_into_one_report() -> None:
    doc = merge_kernel_docs([_shard(1, 1.5), _shard(8, 1.2)], ["a.json", "b.json"])
    assert [r["batch"] for r in doc["results"]] == [1, 8]
    assert doc["meta"]["seconds"] == 4.0
    assert doc["meta"]["merge"] == {"shards": [
        {"file": "a.json", "started": "2026-12-01T00:00:00Z", "rows": 1},
        {"file": "b.json", "started": "2026-12-01T00:00:00Z", "rows": 1}], "forced": []}
    md = render_markdown(doc)
    assert "merged from 2 shard(s): a.json (1 rows), b.json (1 rows)" in md
    assert "| 1 | 1k |" in md and "| 8 | 1k |" in md


@pytest.mark.parametrize(("field", "edit", "shown"), [
    ("device", lambda d: d["meta"]["device"].update(name="NVIDIA A100"), "'NVIDIA A100'"),
    ("builds", lambda d: d["meta"]["variants"][1].update(so_sha256="cc" * 32), "cc" * 32),
    ("kit commit", lambda d: d["meta"]["kit"].update(commit="deadbeef"), "'deadbeef'"),
    ("kit commit", lambda d: d["meta"].pop("kit"), "'not recorded'"),
])
def test_shards_that_differ_are_refused_naming_the_field(field: str, edit: Any,
                                                         shown: str) -> None:
    other = _shard(8)
    edit(other)
    with pytest.raises(BenchError) as exc:
        merge_kernel_docs([_shard(1), other], ["a.json", "b.json"])
    msg = exc.value.message
    assert f"{field} (meta." in msg and shown in msg and "b.json" in msg
    assert "--force-merge" in msg
    # the other fields are not blamed
    assert msg.count(" differs: ") == 1
    forced = merge_kernel_docs([_shard(1), other], ["a.json", "b.json"], force=True)
    assert len(forced["meta"]["merge"]["forced"]) == 1
    assert "merged with --force-merge although" in render_markdown(forced)


def test_a_shape_in_two_shards_is_refused_even_when_forced() -> None:
    with pytest.raises(BenchError, match=r"in both a\.json and b\.json"):
        merge_kernel_docs([_shard(1), _shard(1)], ["a.json", "b.json"], force=True)


def test_report_merge_cli(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    a.write_text(json.dumps(_shard(1)))
    b.write_text(json.dumps(_shard(8)))
    bad = copy.deepcopy(_shard(32))
    bad["meta"]["device"]["name"] = "NVIDIA A100"
    c.write_text(json.dumps(bad))
    runner = CliRunner()
    res = runner.invoke(main, ["report", "--merge", str(a), str(b), "--out",
                               str(tmp_path / "out"), "--formats", "md"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "out" / "merged.json").read_text())["results"][1]["batch"] == 8
    assert "merged from 2 shard(s)" in (tmp_path / "out" / "merged.md").read_text()
    res = runner.invoke(main, ["report", "--merge", str(a), str(c), "--out",
                               str(tmp_path / "out2"), "--formats", "md"])
    assert res.exit_code == 7
    assert "device (meta.device.name) differs" in res.output and "To fix:" in res.output
    assert not (tmp_path / "out2").exists()
    res = runner.invoke(main, ["report", "--force-merge", str(a)])
    assert res.exit_code == 2 and "--force-merge goes with --merge" in res.output
