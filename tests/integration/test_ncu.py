"""kvprefetch.bench.ncu's run with a stand-in ncu (a Python script that checks its command line
and copies a saved CSV sample to the log file, since ncu cannot run here); the recipe and the CSV
parsing are in tests/unit/test_ncu.py."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

from kvprefetch.bench import ncu
from kvprefetch.bench.matrix import shapes_from_specs

SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def _fake_ncu(tmp_path: Path) -> Path:
    """A stand-in for the ncu executable (none here): it checks the recipe flags, writes a saved
    sample to --log-file, and runs nothing."""
    script = tmp_path / "ncu"
    script.write_text(f"""#!{sys.executable}
import sys, shutil
a = sys.argv[1:]
assert a[a.index("--replay-mode") + 1] == "application"
assert a[a.index("--cache-control") + 1] == "all"
ns = a[a.index("--namespace") + 1]
src = {str(SAMPLES)!r} + ("/ncu_raw_baseline.csv" if ns.endswith("baseline") else "/ncu_raw_patched.csv")
shutil.copy(src, a[a.index("--log-file") + 1])
print("==PROF== Disconnected")
""")  # noqa: E501
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_run_ncu_bench_with_a_stand_in_ncu(tmp_path: Path) -> None:
    from kvprefetch.kernels.ops import BuiltOps

    builds = [BuiltOps(tree=t, variant=t, namespace=f"kvprefetch_{t}", so_path=tmp_path / f"{t}.so",
                       so_sha256="0", head_sizes=(128,), block_sizes=(16,), kv_dtypes=("fp16",),
                       manifest_path=tmp_path) for t in ("baseline", "patched")]
    shapes = shapes_from_specs(["1x4k"])
    doc = ncu.run_ncu_bench(builds, shapes, tmp_path / "out",
                            ncu.NcuOptions(ncu=str(_fake_ncu(tmp_path))))
    assert doc["kind"] == "ncu" and doc["meta"]["baseline"] == "baseline"
    s = doc["shapes"][0]
    assert s["csv"] == {"baseline": "ncu-1-baseline.csv", "patched": "ncu-1-patched.csv"}
    assert (tmp_path / "out" / "ncu-1-patched.csv").is_file()
    assert s["deltas"]["patched"][0]["speedup"] > 1.4
    assert {k["kernel"] for k in s["variants"]["baseline"]} == {
        "paged_attention_v2_kernel", "paged_attention_v2_reduce_kernel"}
