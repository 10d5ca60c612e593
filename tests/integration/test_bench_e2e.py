"""kvprefetch.bench.e2e's orchestration with stand-in environments: a full vLLM build cannot
exist on this machine, so a stand-in "python" answers like `vllm bench throughput --output-json`
(format: tests/samples/vllm_throughput.json) and checks the environment it was given; the sweep
runs it for real. The pure parts are in tests/unit/test_bench_e2e.py."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from kvprefetch.bench import e2e
from kvprefetch.errors import BenchError
from tests.unit.test_bench_e2e import _plan  # the same two-environment plan

SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def _fake_python(path: Path) -> Path:
    """Stand-in for a full-build env's python: checks the V0/XFORMERS environment and the cwd,
    then writes an --output-json like vllm bench throughput does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"""#!{sys.executable}
import json, os, sys
assert os.environ["VLLM_USE_V1"] == "0", "V1 would bypass the kernel"
assert os.environ["VLLM_ATTENTION_BACKEND"] == "XFORMERS"
assert "PYTHONPATH" not in os.environ
assert not os.path.isdir("vllm"), "a ./vllm folder would shadow the install"
assert sys.argv[1:2] == ["-I"], "isolated: the cwd (in the output folder) not on sys.path"
a = sys.argv[2:]
if a[:1] == ["-c"]:  # the "can it import vllm" check
    print("0.10.2")
    sys.exit(0)
seqs = int(a[a.index("--max-num-seqs") + 1])
fast = 1.25 if "/p/" in sys.argv[0] else 1.0
res = json.load(open({str(SAMPLES / "vllm_throughput.json")!r}))
res["tokens_per_second"] *= fast * seqs
json.dump(res, open(a[a.index("--output-json") + 1], "w"))
""")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_run_e2e_with_stand_in_envs(tmp_path: Path) -> None:
    plan = _plan(tmp_path, max_num_seqs=(1, 4), repeats=2)
    for env in plan.envs:
        _fake_python(env.python)
    doc = e2e.run_e2e(plan)
    assert doc["kind"] == "e2e" and len(doc["runs"]) == 8
    by = {r["max_num_seqs"]: r for r in doc["rows"]}
    assert by[4]["envs"]["patched"]["speedup"]["median"] == pytest.approx(1.25)
    assert by[4]["envs"]["baseline"]["tokens_per_second"]["median"] == pytest.approx(
        4 * 1587.98)
    assert doc["meta"]["environment"] == {"VLLM_USE_V1": "0",
                                          "VLLM_ATTENTION_BACKEND": "XFORMERS"}
    assert doc["meta"]["envs"][0]["vllm"] == "0.10.2"


def test_run_e2e_refuses_an_env_without_vllm(tmp_path: Path) -> None:
    """A kernels-only env (no vLLM) is caught before any benchmark starts."""
    plan = _plan(tmp_path)
    for env in plan.envs:
        env.python.parent.mkdir(parents=True)
        env.python.symlink_to(sys.executable)  # this python has no vllm
    with pytest.raises(BenchError, match="cannot import vllm"):
        e2e.run_e2e(plan)
