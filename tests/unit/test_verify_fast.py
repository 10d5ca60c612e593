"""verify-kernel's orchestration, cache and summary, on the CPU and without starting a process:
the probes, the disassembly worker's cuobjdump and the GPU identity passes are replaced by
recorders that answer from the saved SASS samples, so what is tested is what verify does with
their answers -- the order-independent judging, the sha256-keyed cache, the summary.

The real end-to-end run on real builds is test_verify.py (slow)."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvprefetch.hashing import sha256_file
from kvprefetch.machine.toolchain import DisasmTools
from kvprefetch.runner import Completed
from kvprefetch.verify import facts as F
from kvprefetch.verify import kernel as K
from kvprefetch.verify.numerics import NO_CUDA_DEVICE

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "sass"
SASS = {"baseline": (SAMPLES / "kw_baseline.sass").read_text(),
        "patched": (SAMPLES / "kw_patched.sass").read_text()}


def _elf_listing(sass: str) -> str:
    """A ``cuobjdump -elf`` listing of one sm_90 module holding the sample's functions."""
    names = [ln.split("Function : ")[1].strip() for ln in sass.splitlines()
             if "Function : " in ln]
    return ("\nFatbin elf code:\n================\narch = sm_90\ncode version = [1,8]\n\n"
            + "".join(f"  [{i}] .text.{n}\n" for i, n in enumerate(names)))


def _tools(tmp_path: Path) -> DisasmTools:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name in ("cuobjdump", "nvdisasm"):
        (bindir / name).write_text(f"not run: {name}\n")
    return DisasmTools(bindir / "cuobjdump", bindir / "nvdisasm")


@pytest.fixture
def fake_cuobjdump(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """cuobjdump (as the facts worker runs it) answering from the samples by the library's
    content: a library file holds the name of the sample it stands for. Counts its calls."""
    tools = _tools(tmp_path)
    calls: list[list[str]] = []

    def fake_run(argv: list[str], **_: Any) -> Completed:
        calls.append(list(argv))
        what, so = argv[1], argv[2]
        sample = Path(so).read_text().split()[0]
        text = SASS[sample] if what == "-sass" else _elf_listing(SASS[sample])
        return Completed(list(argv), 0, text, None)

    monkeypatch.setattr("kvprefetch.runner.run", fake_run)
    monkeypatch.setattr("kvprefetch.machine.toolchain.find_cuobjdump", lambda *a, **k: tools)
    return {"tools": tools, "calls": calls}


def _library(tmp_path: Path, sample: str, salt: str = "") -> Path:
    so = tmp_path / f"{sample}{salt}.so"
    so.write_text(f"{sample} {salt}\n")
    return so


# --------------------------------------------------------------------------- the facts cache


def test_facts_round_trip_through_json() -> None:
    """What the cache stores gives back the facts sass.py/cubin.py compute, field by field."""
    for text in SASS.values():
        sass, elf = F.sass_facts(text), F.elf_facts(_elf_listing(text))
        assert F.SassFacts.from_dict(json.loads(json.dumps(sass.to_dict()))) == sass
        assert F.ElfFacts.from_dict(json.loads(json.dumps(elf.to_dict()))) == elf
        assert len(sass.kernels) == 8 and len(elf.modules) == 1


def test_checks_judge_facts_as_they_judge_listings() -> None:
    """Each check gives the same record from the facts as from the listing text."""
    base, mine = SASS["baseline"], SASS["patched"]
    results = []
    for b, m in ((base, mine), (F.sass_facts(base), F.sass_facts(mine))):
        rep = K.VerifyReport("x")
        K.check_sass(rep, "patched", "so", "prefetch", m)
        K.check_identical_attention(rep, "patched", m, b, "prefetch")
        K.check_readonly_path(rep, "patched", "prefetch", m, b)
        K.check_gqa_twin(rep, "patched", "prefetch", m)
        results.append((rep.checks, rep.sass))
    assert results[0] == results[1]
    assert {"UBLKPF in SASS", "attention kernels identical to stock",
            "K/V loads keep the read-only path", "GQA twins where the rule puts them"
            } <= {c.name for c in results[0][0]}


def test_cache_is_keyed_by_the_library_sha256(tmp_path: Path, fake_cuobjdump: dict) -> None:
    """A worker run stores the facts under the library's sha256; the same bytes hit, a changed
    library (another sha256) misses, and other tools or another parser miss too."""
    cache = tmp_path / "cache"
    so = _library(tmp_path, "patched")
    assert F.main([str(so), "--out", str(tmp_path / "out.json"), "--cache", str(cache)]) == 0
    sha = sha256_file(so)
    assert [p.name for p in cache.iterdir()] == [f"{sha}.json"]
    tool_id = F.tool_identity(fake_cuobjdump["tools"])
    hit = F.load_cached(cache, sha, tool_id)
    assert hit is not None and hit.sass == F.sass_facts(SASS["patched"])

    so.write_text("patched but rebuilt\n")                       # the library changed
    assert F.load_cached(cache, sha256_file(so), tool_id) is None
    assert F.load_cached(cache, sha, {**tool_id, "cuobjdump": "0" * 64}) is None
    assert F.load_cached(cache, sha, {**tool_id, "kit": "0.0.0"}) is None
    F.parser_version.cache_clear()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(F, "parser_version", lambda: "another-parser")
            assert F.load_cached(cache, sha, tool_id) is None
    finally:
        F.parser_version.cache_clear()
    assert F.load_cached(cache, sha, tool_id) is not None


@pytest.mark.parametrize("damage", ["truncated", "not json", "payload edited", "wrong sha"])
def test_corrupt_cache_entry_is_ignored_and_rewritten(tmp_path: Path, fake_cuobjdump: dict,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      damage: str) -> None:
    """verify's _library_facts never trusts a damaged entry: it misses, the worker runs again
    (cuobjdump is called) and the entry is rewritten whole."""
    cache = tmp_path / "cache"
    so = _library(tmp_path, "patched")
    sha = sha256_file(so)
    tool_id = F.tool_identity(fake_cuobjdump["tools"])
    F.main([str(so), "--out", str(tmp_path / "first.json"), "--cache", str(cache)])
    entry = cache / f"{sha}.json"
    good = json.loads(entry.read_text())
    if damage == "truncated":
        entry.write_text(entry.read_text()[: len(entry.read_text()) // 2])
    elif damage == "not json":
        entry.write_text("\x00\x01garbage")
    elif damage == "payload edited":  # a kernel's UBLKPF count changed, digest left as it was
        bad = json.loads(entry.read_text())
        bad["payload"]["sass"]["kernels"][0]["ublkpf"] += 5
        entry.write_text(json.dumps(bad))
    else:
        bad = json.loads(entry.read_text())
        bad["sha256"] = "f" * 64
        entry.write_text(json.dumps(bad))
    assert F.load_cached(cache, sha, tool_id) is None

    def worker_in_process(argv: list[str], **_: Any) -> Completed:
        assert argv[1:3] == ["-m", "kvprefetch.verify.facts"]
        return Completed(argv, F.main(argv[3:]), "", None)

    monkeypatch.setattr(K, "run", worker_in_process)
    before = len(fake_cuobjdump["calls"])
    got, hit = K._library_facts(K._Library(str(so), sha), cache, tool_id)
    assert not hit and not isinstance(got, str)
    assert len(fake_cuobjdump["calls"]) == before + 2            # -sass and -elf again
    assert got.sass == F.sass_facts(SASS["patched"])
    assert json.loads(entry.read_text()) == good                 # rewritten whole
    got2, hit2 = K._library_facts(K._Library(str(so), sha), cache, tool_id)
    assert hit2 and got2 == got and len(fake_cuobjdump["calls"]) == before + 2


def test_failed_disassembly_is_reported_and_not_cached(tmp_path: Path, fake_cuobjdump: dict,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    so = _library(tmp_path, "patched")

    def failing(argv: list[str], **_: Any) -> Completed:
        return Completed(list(argv), 1, "cuobjdump fatal   : Could not open input file", None)

    monkeypatch.setattr("kvprefetch.runner.run", failing)
    out = tmp_path / "out.json"
    F.main([str(so), "--out", str(out), "--cache", str(cache)])
    assert not cache.exists() or not any(cache.iterdir())
    got = F.from_entry(json.loads(out.read_text()), sha256_file(so),
                       F.tool_identity(fake_cuobjdump["tools"]))
    assert got is not None and got.sass is None and not got.complete
    assert got.sass_error is not None and "Could not open input file" in got.sass_error


# --------------------------------------------------------------------------- verify, end to end


def _workdir(tmp_path: Path, trees: dict[str, str]) -> tuple[Path, dict[str, Path]]:
    """A work directory with a kernels-only manifest per tree; tree -> the sample it loads."""
    root = tmp_path / "work"
    libs = {}
    for tree, sample in trees.items():
        env = root / "envs" / tree
        so = env / "lib" / "kvprefetch_kernels" / "_C.so"
        so.parent.mkdir(parents=True)
        so.write_text(f"{sample} built-for-{tree}\n")
        libs[tree] = so
        m = {"tree": tree, "mode": "kernels-only", "key": f"key-{tree}",
             "variant": None if tree == "baseline" else "prefetch",
             "env": {"path": str(env), "python": str(env / "bin" / "python")},
             "so_path": str(so), "so_sha256": sha256_file(so)}
        (root / "build" / tree / "k").mkdir(parents=True)
        (root / "build" / tree / "k" / "manifest.json").write_text(json.dumps(m))
    return root, libs


@pytest.fixture
def fake_world(monkeypatch: pytest.MonkeyPatch, fake_cuobjdump: dict) -> dict[str, Any]:
    """Probes and identity passes that answer after a random short delay (so that completion
    order varies), and the disassembly worker run in-process."""
    record: dict[str, Any] = {"identity": [], "workers": 0}
    rng = random.Random(1)

    def probe(m: dict[str, Any]) -> dict[str, Any]:
        time.sleep(rng.random() * 0.05)
        so = m["so_path"]
        return {"prefix": m["env"]["path"], "mapped": [so],
                "kernels": {"so_file": so, "so_sha256": sha256_file(so),
                            "compiled_build_info": {"tree": m["tree"], "key": m["key"]}}}

    def identity(workdir: Path, trees: list[str], extra_env: dict[str, str] | None
                 ) -> K.IdentityResult:
        time.sleep(rng.random() * 0.05)
        record["identity"].append(extra_env)
        return record.get("identity_answer", {"status": "not checked",
                                              "reason": f"{NO_CUDA_DEVICE} (test)"}), "exit 0"

    def worker(argv: list[str], **_: Any) -> Completed:
        time.sleep(rng.random() * 0.05)
        record["workers"] += 1
        return Completed(argv, F.main(argv[3:]), "", None)

    monkeypatch.setattr(K, "_probe_tree", probe)
    monkeypatch.setattr(K, "_identity_run", identity)
    monkeypatch.setattr(K, "run", worker)
    return record


def _without_timing(rep: K.VerifyReport) -> dict[str, Any]:
    d = rep.to_dict()
    d.pop("timing")
    return d


def test_parallel_serial_and_cached_runs_give_the_same_report(tmp_path: Path,
                                                              fake_world: dict) -> None:
    root, _ = _workdir(tmp_path, {"baseline": "baseline", "patched": "patched",
                                  "seed": "patched"})
    reports = []
    for jobs in (1, 4, 4):   # serial and cold, then parallel from the cache
        reports.append(_without_timing(K.verify(root, jobs=jobs)))
    assert fake_world["workers"] == 3          # one per library, the later runs hit the cache
    for cache in (root / "verify" / "cache").iterdir():
        cache.unlink()
    reports.append(_without_timing(K.verify(root, jobs=3)))   # parallel, cold
    assert fake_world["workers"] == 6
    assert reports[0] == reports[1] == reports[2] == reports[3]
    names = [(c["name"], c["tree"]) for c in reports[0]["checks"]]
    assert names[:2] == [("interpreter inside its env", "baseline"),
                         ("loads its own library", "baseline")]
    assert ("attention kernels identical to stock", "seed") in names
    statuses = {c["status"] for c in reports[0]["checks"]}
    assert "pass" in statuses and "not checked" in statuses
    on_disk = json.loads((root / "verify" / "report.json").read_text())
    assert on_disk["checks"] == reports[3]["checks"]


def test_twin_passes_reuse_only_a_no_device_answer(tmp_path: Path, fake_world: dict,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """With twins in the SASS, the forced-twin identity passes run one by one after the plain
    pass -- unless that pass found no CUDA device, whose answer they would repeat."""
    from kvprefetch.kernels.policy import TWIN_SHAPES

    root, _ = _workdir(tmp_path, {"baseline": "baseline", "patched": "patched"})
    twin_name = ("_ZN10kvprefetch17gqa_decode_kernelIttLi128ELi16ELi128E"
                 "LN4vllm18Fp8KVCacheDataTypeE0ELi0ELi4ELi1EEEvv")
    SASS_twin = SASS["patched"] + f"\n\t\tFunction : {twin_name}\n\t\t/*0000*/ EXIT ; /* 0x0 */\n"
    monkeypatch.setitem(SASS, "patched", SASS_twin)
    rep = K.verify(root, jobs=2)
    assert fake_world["identity"] == [None]
    gpu = [c for c in rep.checks if c.name.startswith("bitwise-equal")]
    assert len(gpu) == 1 + len(TWIN_SHAPES)
    assert all(c.status == "not checked" and NO_CUDA_DEVICE in c.detail for c in gpu)

    fake_world["identity"].clear()
    fake_world["identity_answer"] = {"status": "passed", "checked": 3, "failed": 0}
    rep = K.verify(root, jobs=2)
    assert fake_world["identity"] == [None] + [{"KVPREFETCH_GQA": f"{g}x{s}"}
                                               for g, s, _ in TWIN_SHAPES]
    assert all(c.status == "pass" for c in rep.checks if c.name.startswith("bitwise-equal"))


def test_xformers_warning_only_where_vllm_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_USE_V1", raising=False)
    monkeypatch.delenv("VLLM_ATTENTION_BACKEND", raising=False)
    kernels_only = K.VerifyReport("x")
    K.check_hot_path(kernels_only, {"baseline": {"mode": "kernels-only"}})
    assert "warning" not in kernels_only.envs
    full = K.VerifyReport("x")
    K.check_hot_path(full, {"baseline": {"mode": "full"}})
    assert "VLLM_ATTENTION_BACKEND=XFORMERS" in full.envs["warning"]
    monkeypatch.setenv("VLLM_USE_V1", "0")
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "XFORMERS")
    set_right = K.VerifyReport("x")
    K.check_hot_path(set_right, {"baseline": {"mode": "full"}})
    assert "warning" not in set_right.envs


# --------------------------------------------------------------------------- the CLI's summary


def _report(tmp_path: Path, failing: bool) -> K.VerifyReport:
    rep = K.VerifyReport(str(tmp_path))
    rep.envs = {"baseline": {}, "patched": {}}
    rep.timing = {"total_s": 3.2}
    rep.sass = {"patched": {"library": "/x/_C.so", "table": [
        {"arch": "sm_90", "head_size": 128, "block_size": 16, "dtype": "fp16",
         "kv_cache": "auto", "kernels": 4, "ublkpf_min": 0, "ublkpf_max": 2}]}}
    for tree in ("baseline", "patched"):
        rep.add("loads its own library", tree, True, f"/x/{tree}/_C.so (mapped)")
    rep.add("UBLKPF in SASS", "patched", not failing,
            "4 kernels, 0 with UBLKPF; expected ≥2 UBLKPF (K and V) in every sm_90+ kernel; "
            "the full detail of this failure, to the end")
    rep.add("bitwise-equal outputs on the GPU", "all", None, "no GPU")
    rep.add("bitwise-equal outputs on the GPU, twin 2x2 forced (KVPREFETCH_GQA=2x2)", "all",
            None, "no GPU")
    return rep


@pytest.mark.parametrize("failing", [False, True])
def test_summary_puts_the_verdict_first_and_names_the_report(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             failing: bool) -> None:
    from kvprefetch.cli.verify import verify_kernel

    monkeypatch.setattr(K, "verify", lambda *a, **k: _report(tmp_path, failing))
    (tmp_path / "verify").mkdir()
    res = CliRunner().invoke(verify_kernel, ["--workdir", str(tmp_path)])
    assert res.exit_code == (6 if failing else 0), res.output
    lines = res.stdout.splitlines()
    assert lines[0].startswith("kvprefetch verify-kernel: " + ("FAILED" if failing else "PASSED"))
    assert "5 checks: " in lines[0]
    report_txt = tmp_path / "verify" / "report.txt"
    assert lines[-1] == f"full report: {report_txt} (JSON: {tmp_path / 'verify' / 'report.json'})"
    # one line per family: the two GPU checks are one family, 2 not checked
    assert any(ln.strip().startswith("– bitwise-equal outputs on the GPU")
               and ln.endswith("2 not checked") for ln in lines)
    assert any("loads its own library" in ln and ln.endswith("2 passed") for ln in lines)
    if failing:
        assert "✕ UBLKPF in SASS [patched]: 4 kernels, 0 with UBLKPF" in res.stdout
        assert "the full detail of this failure, to the end" in res.stdout
    assert "UBLKPF min" not in res.stdout          # the tables only with --verbose ...
    assert len(lines) < 15
    text = report_txt.read_text()                  # ... and in the report file
    assert "UBLKPF min" in text and "/x/baseline/_C.so (mapped)" in text
    assert "PASSED" in text or "FAILED" in text


def test_verbose_prints_the_details_and_json_stays_json(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from kvprefetch.cli.verify import verify_kernel

    monkeypatch.setattr(K, "verify", lambda *a, **k: _report(tmp_path, False))
    (tmp_path / "verify").mkdir()
    res = CliRunner().invoke(verify_kernel, ["--workdir", str(tmp_path), "--verbose"])
    assert res.exit_code == 0
    assert "UBLKPF min" in res.stdout and "/x/baseline/_C.so (mapped)" in res.stdout
    # the summary still comes last, verdict first within it
    tail = res.stdout[res.stdout.index("kvprefetch verify-kernel: PASSED  ("):]
    assert tail.splitlines()[-1].startswith("full report: ")
    res = CliRunner().invoke(verify_kernel, ["--workdir", str(tmp_path), "--json"])
    data = json.loads(res.stdout)
    assert data["passed"] is True and len(data["checks"]) == 5


def test_progress_is_plain_lines_without_a_terminal(tmp_path: Path, fake_world: dict,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from kvprefetch.cli.verify import _progress

    root, _ = _workdir(tmp_path, {"baseline": "baseline", "patched": "patched"})
    with _progress() as say:
        K.verify(root, jobs=2, progress=say)
    err = capsys.readouterr().err
    assert err.startswith("verify-kernel: 2 trees (baseline, patched)")
    assert "probed patched" in err and "machine code of baseline" in err
    assert "\x1b[" not in err


def test_unknown_tree_names_the_built_ones(tmp_path: Path, fake_world: dict) -> None:
    """A typo in --trees is called unknown and the built trees are listed (issue 42: it used to
    send the user to `kvprefetch build`, which was done); a fetched tree that was never built
    is sent to build."""
    from kvprefetch.errors import VerifyError

    root, _ = _workdir(tmp_path, {"baseline": "baseline", "patched": "patched"})
    with pytest.raises(VerifyError) as typo:
        K.verify(root, trees=["baseline", "nosuch"])
    assert "unknown tree 'nosuch'" in typo.value.message
    assert ("baseline, patched" in typo.value.message
            and "kvprefetch build" not in typo.value.message)
    (root / "trees" / "launch").mkdir(parents=True)
    with pytest.raises(VerifyError) as unbuilt:
        K.verify(root, trees=["baseline", "launch"])
    assert "launch was fetched but never built" in unbuilt.value.message
    assert "run `kvprefetch build`" in unbuilt.value.message
    assert fake_world["workers"] == 0  # refused before anything ran


@pytest.mark.parametrize("text", [
    "", "no state here\n",
    ("  [3] .nv.global kvprefetch_basesE\n _Z3kvprefetch_modeE "
     "x_ZN2ns15kvprefetch_basesE.kvprefetch_modeE y\nkvprefetch_modeEx akvprefetch_basesE\n"
     "\tkvprefetch_mode kvprefetch_modeE")])
def test_state_symbols_are_what_the_regex_finds_over_the_whole_listing(text: str) -> None:
    """The faster search of the prologue's state symbols (only in the lines that name
    kvprefetch_) finds exactly what the regex finds over the whole listing, in order."""
    from kvprefetch.verify import cubin

    assert cubin._state_symbols(text) == cubin._STATE.findall(text)
