"""GPU tests of ``bench decode`` on the REAL kernels-only builds (baseline and patched, head 128,
block 16, fp16, under $KVPREFETCH_WORKDIR): a two-layer Llama-3.1-8B step through stock and
patched gives bitwise-equal logits, a CUDA-graph replay gives the eager step's logits, and a
small run of the whole bench (a fixed point and a serving trace) reports every tree bitwise
equal with a ratio and an attention share."""

from __future__ import annotations

import pytest

from tests.gpu.builds import load_stock_and_patched

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def trees():
    return load_stock_and_patched()


def _model_and_inputs(batch: int, context: int):
    from kvprefetch.bench.decode import StepInputs, Workload, plan_steps
    from kvprefetch.bench.decode_model import Decoder, preset
    from kvprefetch.bench.vllm_call import VllmCall

    cfg = preset("llama-3.1-8b", layers=2)
    steps, blocks = plan_steps(Workload(batch=batch, context=context, steps=2), 16)
    model = Decoder(cfg, blocks, 16, "cuda", seed=0, max_position=context + 16)
    call = VllmCall()  # vLLM's defaults: graphs captured at max_seq_len 8192
    assert call.capture_len == 8192
    inputs = StepInputs(steps, call, blocks - 1, 16, cfg.vocab, "cuda", 0)
    return model, inputs


@pytest.mark.parametrize(("batch", "context"), [(3, 1000), (40, 4096), (2, 9000)])
def test_step_is_bitwise_stock_and_graph_equals_eager(trees, batch: int, context: int) -> None:
    import torch

    from kvprefetch.bench.decode import TreeRunner

    stock, patched = trees
    model, inputs = _model_and_inputs(batch, context)
    item, mode, max_len = inputs.items[0], inputs.modes[0], inputs.max_lens[0]
    out = {}
    for ops in (stock, patched):
        model.fill_cache(0)
        runner = TreeRunner(model, ops, 8192, item[4].shape[1], "cuda")
        got = runner.run(item, mode, max_len)[:batch].clone()
        model.fill_cache(0)
        eager = model.step(ops, *item, max_seq_len=8192 if mode is not None else max_len)
        torch.cuda.synchronize()
        assert torch.equal(got, eager[:batch]), (ops.name, "graph replay differs from eager")
        out[ops.name] = got
    assert torch.isfinite(out[stock.name].float()).all()
    assert torch.equal(out[stock.name], out[patched.name])
    model.free()


@pytest.mark.filterwarnings("ignore:.*Profiler clears events")
def test_small_run_reports_equal_trees(trees) -> None:
    from kvprefetch.bench.decode import DecodeBenchConfig, Workload, run_decode_bench
    from kvprefetch.bench.decode_model import preset
    from kvprefetch.bench.decode_report import decode_markdown, decode_summary
    from kvprefetch.bench.decode_serve import LengthDist

    works = [Workload(batch=8, context=2048, steps=4),
             Workload(batch=6, requests=12, dist=LengthDist("longtail", 300, 6, 4096, seed=2))]
    doc = run_decode_bench(list(trees), preset("llama-3.1-8b", layers=2), works,
                           DecodeBenchConfig(repeats=2, max_model_len=4096), progress=print)
    assert [r["status"] for r in doc["results"]] == ["ok", "ok"]
    for r in doc["results"]:
        p = r["trees"]["patched"]
        assert p["bitwise_equal"] is True and p["ratio"]["median"] > 0
        assert 0 < r["trees"]["baseline"]["attention_share"] < 1
    trace = doc["results"][1]
    assert trace["tokens"] == sum(o for _, o in works[1].lengths())
    assert decode_summary(doc)[0]["bitwise_equal"]
    assert "## Workloads" in decode_markdown(doc)
