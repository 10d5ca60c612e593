"""Issue 41, class 5 (tracebacks on bad input), the bench side: a result JSON that is not what
the kit writes (fields missing or null, wrong types, nested 200k deep, a gzip bomb, a FIFO),
read by `report FILE`, `--merge`, `--repeats`, `--readme` and `--index`; a model config that
is no model (0 heads, negative or missing sizes, not JSON, nested too deep) for
`bench decode --config`; and `bench kernel`/`bench decode` on a python without torch.

Each case runs the real command in a subprocess and checks ``refused``: the family's exit
code, one message with "To fix", no traceback; the autouse ``outside`` fixture (shared with
test_reliability.py) checks that nothing outside the test's folders changed. Every test here
fails on the code before this file (tracebacks: KeyError, TypeError, RecursionError,
ZeroDivisionError, OverflowError, ValueError, ImportError; the FIFO one hangs)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvprefetch.errors import BenchError, ConfigError
from tests.integration.test_reliability import _env, cli, outside, refused
from tests.unit.test_report import kernel_doc

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

DEEP = "[" * 200_000 + "]" * 200_000


def _set(path: str, value: Any) -> Callable[[dict], None]:
    """Set (or, with value ``...``, delete) the field at a dotted path; digits index lists."""
    def edit(doc: dict) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        key: Any = int(last) if last.isdigit() else last
        if value is ...:
            del node[key]
        else:
            node[key] = value
    return edit


# (what the file holds, the words the message must name)
BAD_RESULTS: dict[str, tuple[Any, str]] = {
    "meta-missing": (_set("meta", ...), "`meta` is missing"),
    "meta-null": (_set("meta", None), "`meta` is null, not an object"),
    "results-null": (_set("results", None), "`results` is null, not a list"),
    "variants-a-string": (_set("meta.variants", "baseline"), "`meta.variants` is a string"),
    "row-a-number": (_set("results.0", 5), "`results[0]` is a whole number, not an object"),
    "batch-a-string": (_set("results.1.batch", "64"), "`results[1].batch` is a string"),
    "batch-a-bool": (_set("results.1.batch", True), "`results[1].batch` is true or false"),
    "l2-missing": (_set("meta.device.l2_bytes", ...), "`meta.device.l2_bytes` is missing"),
    # deeper than the shape check: a null where a timing belongs
    "speedup-null": (_set("results.0.variants.patched.speedup.median", None),
                     "a field the report reads is missing"),
    "time-null": (_set("results.0.variants.baseline.time_us", None),
                  "a field the report reads is missing"),
    "nested-200k": (DEEP, "nested too deep"),
    "not-json": ("{\"kind\": \"kernel\", ", "cannot read"),
}


def _write_bad(path: Path, case: str) -> str:
    content, needle = BAD_RESULTS[case]
    if callable(content):
        doc = kernel_doc()
        content(doc)
        path.write_text(json.dumps(doc))
    else:
        path.write_text(content)
    return needle


@pytest.mark.parametrize("case", list(BAD_RESULTS))
def test_a_malformed_result_is_one_message_naming_the_field(tmp_path: Path, case: str) -> None:
    bad = tmp_path / "bad.json"
    needle = _write_bad(bad, case)
    res = cli("report", str(bad), "--formats", "md", "--out", str(tmp_path / "r"), timeout=120)
    refused(res, BenchError.exit_code, str(bad), needle)


@pytest.mark.parametrize("case", ["meta-null", "batch-a-string", "speedup-null", "nested-200k"])
def test_merge_repeats_readme_and_index_refuse_a_malformed_result(
        tmp_path: Path, case: str) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(kernel_doc()))
    _write_bad(bad, case)
    # --merge of one shard (two shards of the same shapes are refused as duplicates first)
    for files in (("--merge", str(bad)), ("--repeats=rep", str(good), str(bad))):
        res = cli("report", *files, "--formats", "md", "--out", str(tmp_path / "r"),
                  timeout=120)
        refused(res, BenchError.exit_code, str(bad))
        assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())
    readme = tmp_path / "README.md"
    readme.write_text("<!-- report bad.json summary -->\n<!-- /report -->\n")
    refused(cli("report", "--readme", str(readme), timeout=120), BenchError.exit_code,
            str(bad))
    run = tmp_path / "runs" / "2026-12-03-x"
    run.mkdir(parents=True)
    (run / "bad.json").write_bytes(bad.read_bytes())
    (run / "provenance.json").write_text(json.dumps({
        "title": "t", "date": "2026-12-03", "gpu": "H200", "measures": "m", "commit": "c",
        "tree": "t", "command": "c", "headline": {"result": "bad.json", "variant": "patched"}}))
    refused(cli("report", "--index", str(tmp_path / "runs"), timeout=120),
            BenchError.exit_code, "bad.json")


def test_a_result_that_is_too_big_deep_or_a_fifo_is_refused_without_reading_it(
        tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.json.gz"  # 80 MiB of spaces in about 80 KiB
    with gzip.open(bomb, "wb") as f:
        for _ in range(80):
            f.write(b" " * (1 << 20))
    refused(cli("report", str(bomb), "--formats", "md", "--out", str(tmp_path / "r")),
            BenchError.exit_code, "MiB decompressed")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # opening it for reading the usual way blocks forever
    refused(cli("report", str(fifo), "--formats", "md", "--out", str(tmp_path / "r"),
                timeout=60), BenchError.exit_code, "not a regular file")
    prov = tmp_path / "runs" / "x" / "provenance.json"
    prov.parent.mkdir(parents=True)
    prov.write_text(DEEP)
    refused(cli("report", "--index", str(tmp_path / "runs")), BenchError.exit_code,
            "nested too deep")


SIZES = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
         "intermediate_size": 14336, "num_hidden_layers": 2, "vocab_size": 1000}


@pytest.mark.parametrize(("text", "needle"), [
    (json.dumps({**SIZES, "num_attention_heads": 0}), "'num_attention_heads' (0"),
    (json.dumps({**SIZES, "num_hidden_layers": -2}), "'num_hidden_layers' (-2"),
    (json.dumps({k: v for k, v in SIZES.items() if k != "hidden_size"}), "'hidden_size'"),
    (json.dumps({**SIZES, "num_attention_heads": "32"}), "'num_attention_heads' ('32'"),
    (json.dumps({**SIZES, "num_attention_heads": None}), "'num_attention_heads'"),
    (json.dumps({**SIZES, "num_attention_heads": 1e400}), "'num_attention_heads' (inf"),
    (json.dumps({**SIZES, "vocab_size": 10**30}), "'vocab_size'"),
    (json.dumps({**SIZES, "rope_theta": "x"}), "'rope_theta' ('x'"),
    (json.dumps({**SIZES, "rms_norm_eps": -1}), "'rms_norm_eps' (-1"),
    ("{not json", "cannot read model config"),
    (DEEP, "nested too deep"),
], ids=["zero-heads", "negative-layers", "missing-hidden", "heads-a-string", "heads-null",
        "heads-infinite", "vocab-huge", "rope-a-string", "eps-negative", "not-json",
        "nested-200k"])
def test_a_model_config_that_is_no_model_is_one_message(
        tmp_path: Path, text: str, needle: str) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(text)
    res = cli("bench", "decode", "--workdir", str(tmp_path / "w"), "--config", str(cfg),
              "--dry-run", timeout=120)
    refused(res, ConfigError.exit_code, needle)
    assert not (tmp_path / "w").exists()


def _fake_build(wd: Path) -> None:
    """A kernels-only build manifest whose library exists and matches its sha256: enough for
    `bench kernel`/`decode` to get past finding builds to where they load them with torch."""
    import hashlib

    d = wd / "build" / "baseline" / "kernels"
    d.mkdir(parents=True)
    (d / "lib.so").write_bytes(b"not really a library")
    (d / "manifest.json").write_text(json.dumps({
        "tree": "baseline", "variant": "baseline", "namespace": "kvprefetch_baseline",
        "so_path": "lib.so", "so_sha256": hashlib.sha256(b"not really a library").hexdigest(),
        "head_sizes": [128], "block_sizes": [16], "kv_dtypes": ["auto"]}))


@pytest.mark.parametrize("argv", [("kernel", "--batch", "1", "--context", "512"),
                                  ("decode", "--batch", "1", "--context", "1k",
                                   "--layers", "1")], ids=["kernel", "decode"])
def test_bench_without_torch_names_torch_and_how_to_install_it(
        tmp_path: Path, argv: tuple[str, ...]) -> None:
    """torch is installed in the venv the tests run in (the kit's own, from
    scripts/setup-venv.sh; the other tests and engineers need it), and there is no network to
    build a second venv without it, so the only honest way to run the real command without
    torch is a subprocess whose ``sys.modules['torch'] = None`` makes every ``import torch``
    raise ImportError, exactly as on a python where it is not installed. --dry-run needs no
    torch and still plans."""
    wd = tmp_path / "w"
    _fake_build(wd)
    shim = ("import sys; sys.modules['torch'] = None; from kvprefetch.cli import main; "
            "main(sys.argv[1:], prog_name='kvprefetch')")
    args = ["bench", argv[0], "--workdir", str(wd), "--out", str(tmp_path / "o"), *argv[1:]]
    run = [sys.executable, "-c", shim, *args]
    res = subprocess.run(run, env=_env(), capture_output=True, text=True, timeout=120,
                         check=False)
    refused(res, BenchError.exit_code, "needs torch", "scripts/setup-venv.sh")
    assert not (tmp_path / "o").exists()
    planned = subprocess.run([*run, "--dry-run"], env=_env(), capture_output=True, text=True,
                             timeout=120, check=False)
    assert planned.returncode == 0, planned.stderr
