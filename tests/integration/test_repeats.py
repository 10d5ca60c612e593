"""`kvprefetch report --repeats` as a user runs it, in a child process: one combined document,
and a refusal with the bench family's exit code (the combining itself is in
tests/unit/test_repeats.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from click.testing import CliRunner

from kvprefetch.bench import kernel as k
from kvprefetch.bench import report
from kvprefetch.bench.matrix import BenchMatrix
from kvprefetch.cli.report import report as report_cmd
from kvprefetch.errors import BenchError
from tests.integration.helpers import kvprefetch_cli_split

L2 = 60 * 2**20
NAMES = ("baseline", "patched", "control")


def run_doc(ratio: Callable[[str, int, int], float], modes: tuple[str, ...] = ("cold",),
            per_layer: Callable[[int, int], int] = lambda b, c: 1,
            hot_factor: float = 1.0) -> dict:
    """One bench kernel document over batch {1, 64} x context {512, 16k}; ``ratio(variant,
    batch, context)`` is the variant's speedup (stock time / variant time) in every round."""
    results = []
    for mode in modes:
        for s in BenchMatrix(batches=(1, 64), contexts=(512, 16384)).shapes():
            b, c = s.attn.num_seqs, s.attn.max_seq_len
            base = [t * (1.0 if mode == "cold" else hot_factor) for t in (20.0, 20.2, 20.4)]
            samples = {n: [t / (1.0 if n == "baseline" else ratio(n, b, c)) for t in base]
                       for n in NAMES}
            plan = k.LaunchPlan(layers=1, launches=8, replays=3,
                                bytes_per_layer=per_layer(b, c), est_launch_us=1)
            r = k.build_results(s, mode, plan, 1_000_000, list(NAMES), samples, 4e12,
                                {"patched": True, "control": True}, dict.fromkeys(NAMES, True))
            results.append(r.to_dict())
    return {"kind": "kernel", "schema": 1,
            "meta": {"started": "2026-11-29T18:00:00Z", "seconds": 3.0,
                     "device": {"name": "NVIDIA H200", "sm_count": 132, "l2_bytes": L2},
                     "copy_bw_bytes_per_s": 4e12, "baseline": "baseline",
                     "variants": [{"name": n} for n in NAMES], "command": ["bench", "kernel"]},
            "results": results}


def three_runs() -> list[dict]:
    """b1 512: patched 0.98 in every run, beyond the A/A band (a real loss);
    b64 512: patched 0.995 like the control there (the A/A band is 0.005: not beyond it);
    b1 16k: patched slower in one run only; b64 16k: a steady 1.2x win."""
    docs = []
    for run, jitter in enumerate((0.0, 0.002, -0.002)):
        def ratio(n: str, b: int, c: int, run: int = run, jitter: float = jitter) -> float:
            if n == "control":
                return 0.995 if (b, c) == (64, 512) else 1.0 + jitter
            return {(1, 512): 0.98, (64, 512): 0.995, (1, 16384): 0.999 if run == 1 else 1.01,
                    (64, 16384): 1.2 + jitter}[(b, c)]
        docs.append(run_doc(ratio))
    return docs


def test_report_repeats_command_writes_one_document(tmp_path: Path) -> None:
    files = []
    for i, d in enumerate(three_runs()):
        files.append(tmp_path / f"repeat-{i}.json")
        files[-1].write_text(json.dumps(d))
    res = CliRunner().invoke(report_cmd, ["--repeats", "combined", "--out", str(tmp_path / "o"),
                                          "--json", *map(str, files)])
    assert res.exit_code == 0, res.output
    written = [Path(p).name for p in json.loads(res.stdout)["repeats"]]
    assert written == ["combined.json", "combined.md"]
    doc = report.load_document(tmp_path / "o" / "combined.json")
    assert doc["meta"]["sources"] == [f.name for f in files]
    # the combined document renders again like any other result file
    res = CliRunner().invoke(report_cmd, [str(tmp_path / "o" / "combined.json"), "--formats",
                                          "md", "--out", str(tmp_path / "again")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "again" / "combined.md").read_text() == \
        (tmp_path / "o" / "combined.md").read_text()
    bad = kvprefetch_cli_split("report", "--repeats", "x", str(files[0]))
    assert bad.returncode == BenchError.exit_code
    assert "at least two" in bad.stderr and "To fix:" in bad.stderr
    assert not (files[0].parent / "x.json").exists()
    # a path as NAME is refused before anything is combined or written (it used to crash)
    pathy = CliRunner().invoke(report_cmd, ["--repeats", str(tmp_path / "sub" / "r"),
                                            *map(str, files)])
    assert pathy.exit_code == 2 and "without folders" in pathy.output and "--out" in pathy.output
    assert not (tmp_path / "sub").exists()
