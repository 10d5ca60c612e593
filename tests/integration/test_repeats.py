"""`kvprefetch report --repeats` as a user runs it, in a child process: one combined document,
and a refusal with the bench family's exit code (the combining itself is in
tests/unit/test_repeats.py)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from kvprefetch.bench import documents
from kvprefetch.cli.report import report as report_cmd
from kvprefetch.errors import BenchError
from tests.integration.helpers import kvprefetch_cli_split
from tests.unit.test_repeats import three_runs  # the same three synthetic runs


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
    doc = documents.load_document(tmp_path / "o" / "combined.json")
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
