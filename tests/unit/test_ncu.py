"""kvprefetch.bench.ncu: the seed's ncu recipe as a command line, and the parsing of ncu's CSV (a
run with a stand-in ncu is in tests/integration/test_ncu.py).

The CSV samples in tests/samples/ are HAND-MADE in the exact layout ``ncu --csv`` writes (ncu
cannot run on this machine); their numbers are invented. Replace them with a real capture from
the H200 once ``bench ncu`` has run there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvprefetch.bench import ncu
from kvprefetch.bench.matrix import shapes_from_specs
from kvprefetch.errors import BenchError

SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def test_ncu_command_is_the_seed_recipe(tmp_path: Path) -> None:
    cmd = ncu.ncu_command(["python3", "-m", "x"], tmp_path / "o.csv",
                          ncu.NcuOptions(launch_skip=200, launch_count=40))
    flat = " ".join(cmd)
    for part in ("--replay-mode application", "--cache-control all", "--clock-control none",
                 "-k regex:paged_attention", "--launch-skip 200", "--launch-count 40",
                 "--csv", "--page raw", "--print-units base", f"--log-file {tmp_path / 'o.csv'}"):
        assert part in flat
    metrics = cmd[cmd.index("--metrics") + 1].split(",")
    assert metrics == list(ncu.METRICS)
    assert set(ncu.METRICS) == {
        "gpu__time_duration.sum", "dram__bytes_read.sum", "lts__t_sector_op_read_hit_rate.pct",
        "smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed"}
    assert cmd[-3:] == ["python3", "-m", "x"] and cmd[0] == "ncu"


def test_target_command_and_launch_count() -> None:
    s = shapes_from_specs(["8x16k"])[0]
    cmd = ncu.target_command("py", Path("/b/k.so"), "kvprefetch_patched", s.to_dict(), 17)
    assert cmd[:3] == ["py", "-m", "kvprefetch.bench.ncu"]
    args = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert args["--context"] == "16384" and args["--batch"] == "8"
    assert args["--kernel"] == s.kernel and args["--launches"] == "17"
    opts = ncu.NcuOptions(launch_skip=20, launch_count=10)
    assert ncu.launches_needed("v1", opts) >= 30
    assert ncu.launches_needed("v2", opts) * 2 >= 30  # v2 + reduce both match the regex


def test_parse_raw_page_sample() -> None:
    launches = ncu.parse_ncu_csv((SAMPLES / "ncu_raw_baseline.csv").read_text())
    assert [x.id for x in launches] == list(range(6))
    fams = [ncu.kernel_family(x.kernel) for x in launches]
    assert fams == ["paged_attention_v2_kernel", "paged_attention_v2_reduce_kernel"] * 3
    first = launches[0]
    assert first.get("gpu__time_duration.sum") == 24576.0          # "24,576" nsecond
    assert first.get("dram__bytes_read.sum") == 2101248.0
    assert first.get("lts__t_sector_op_read_hit_rate.pct") == pytest.approx(14.6)
    assert first.grid == "(32, 1, 8)"


def test_parse_details_page_sample_normalises_units() -> None:
    launches = ncu.parse_ncu_csv((SAMPLES / "ncu_details_v1.csv").read_text())
    assert len(launches) == 2
    x = launches[0]
    assert ncu.kernel_family(x.kernel) == "paged_attention_v1_kernel"
    assert x.get("gpu__time_duration.sum") == pytest.approx(21440.0)   # 21.44 usecond -> ns
    assert x.get("dram__bytes_read.sum") == pytest.approx(67.37e6)     # Mbyte -> bytes
    assert x.get("smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct") == 55.10


def test_parse_without_a_table_says_why() -> None:
    with pytest.raises(BenchError, match="no ncu CSV table"):
        ncu.parse_ncu_csv("==PROF== Connected\n==ERROR== ERR_NVGPUCTRPERM\n")


@pytest.mark.parametrize(("text", "value"), [("1,234.5", 1234.5), ("n/a", None), ("", None),
                                             ("7", 7.0), ("abc", None)])
def test_parse_number(text: str, value: float | None) -> None:
    assert ncu.parse_number(text) == value


def test_aggregate_and_deltas_on_samples() -> None:
    base = ncu.aggregate(ncu.parse_ncu_csv((SAMPLES / "ncu_raw_baseline.csv").read_text()))
    pat = ncu.aggregate(ncu.parse_ncu_csv((SAMPLES / "ncu_raw_patched.csv").read_text()))
    assert [s.family for s in base] == ["paged_attention_v2_kernel",
                                        "paged_attention_v2_reduce_kernel"]
    assert base[0].launches == 3
    assert base[0].get("gpu__time_duration.sum") == pytest.approx((24576 + 24608 + 24640) / 3)
    rows = {r["kernel"]: r for r in ncu.deltas(base, pat)}
    main = rows["paged_attention_v2_kernel"]
    t_b = (24576 + 24608 + 24640) / 3
    t_p = (16448 + 16480 + 16512) / 3
    assert main["speedup"] == pytest.approx(t_b / t_p)
    assert main["time"]["change"] == pytest.approx(t_p / t_b)
    assert main["long_sb_stall"]["change"] == pytest.approx(41.5 - 62.2)   # points
    assert main["l2_hit"]["change"] == pytest.approx(15.2 - 14.7)
    assert main["dram_read"]["change"] == pytest.approx(
        (2101376 + 64) / (2101248 + 64))


def test_kernel_family_fallback() -> None:
    assert ncu.kernel_family("void at::native::elementwise_kernel<128, 4>(int)") == \
        "at::native::elementwise_kernel"


def test_run_ncu_bench_without_ncu(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="Nsight Compute"):
        ncu.run_ncu_bench([], [], tmp_path, ncu.NcuOptions(ncu=os.fspath(tmp_path / "no-ncu")))
