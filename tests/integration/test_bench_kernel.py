"""kvprefetch.bench.kernel's whole per-shape procedure run on the CPU (eager calls instead of
CUDA graphs, float64 reference ops registered in-process): inputs, per-variant replays, rotated
rounds, poisoning, bitwise comparison, the result row, and the graphs' hold on their tensors;
and the refusals and skips that need torch to be reached (no GPU, a missing instantiation, a
shape over free memory or past a vLLM launch limit). Real arithmetic over real layer pools takes
seconds per test, and the unit layer has no torch, which is why these are not in
tests/unit/test_bench_kernel.py."""

from __future__ import annotations

import math

import pytest

from kvprefetch.bench import kernel as k
from kvprefetch.bench.matrix import BenchMatrix
from kvprefetch.errors import BenchError

COPY_BW = 4.3e12


_REF: dict[str, object] = {}


def _reference_ops(namespace: str, name: str, transform=None):
    """Stand-in builds (no GPU here): in-process ops that write the float64 reference."""
    from kvprefetch.kernels import ops
    from kvprefetch.verify.reference import register_reference_ops

    if namespace not in _REF:
        _REF[namespace] = register_reference_ops(namespace, transform)
    return ops.ops_from_namespace(namespace, name=name)


@pytest.mark.parametrize("mode", ["cold", "hot", "aliased"])
def test_bench_shape_control_flow_on_cpu(mode: str) -> None:
    """The whole per-shape procedure (inputs, per-variant replays, rotated rounds, poisoning,
    bitwise comparison, result row) with eager calls instead of CUDA graphs."""
    from kvprefetch.bench.matrix import shapes_from_specs

    shape = shapes_from_specs(["2x600"], preset="tinyllama-1.1b")[0]
    variants = [_reference_ops("kvp_bk_a", "baseline"), _reference_ops("kvp_bk_b", "patched")]
    cfg = k.KernelBenchConfig(mode=mode, rounds=3, target_sample_ms=0.0, min_launches=2)
    r = k.bench_shape(variants, shape, cfg, l2_bytes=2 * 2**20, copy_bw=COPY_BW, device="cpu")
    assert r.error == "" and r.plan is not None
    expected_layers = 1 if mode != "cold" else math.ceil(4 * 2 * 2**20 / r.plan.bytes_per_layer)
    assert r.plan.layers == expected_layers
    # tinyllama: 4 kv heads x 2 KiB chunks; 2 x 38 blocks needed, a quarter of the 2 MiB L2 holds 32
    per_block = 2 * 4 * 2048
    assert r.plan.bytes_per_layer == (32 if mode == "aliased" else 76) * per_block
    assert r.plan.launches >= r.plan.layers
    assert [v.name for v in r.variants] == ["baseline", "patched"]
    assert all(v.time_us.n == 3 for v in r.variants)
    assert r.bitwise_equal is True and all(v.nan_free for v in r.variants)


def test_bench_shape_catches_a_variant_that_differs_on_cpu() -> None:
    import torch

    from kvprefetch.bench.matrix import shapes_from_specs

    def bump(out: torch.Tensor) -> None:
        out.view(-1)[0] += 1

    shape = shapes_from_specs(["1x100"], preset="tinyllama-1.1b")[0]
    variants = [_reference_ops("kvp_bk_a", "baseline"), _reference_ops("kvp_bk_bad", "bad", bump)]
    r = k.bench_shape(variants, shape, k.KernelBenchConfig(rounds=3, target_sample_ms=0.0),
                      l2_bytes=2**20, copy_bw=COPY_BW, device="cpu")
    assert r.bitwise_equal is False and r.variants[1].equal_to_baseline is False


class _GraphModel(k.HostBackend):
    """A CPU model of what a CUDA graph is, because no CUDA graph can be captured on this machine:
    capture records the ops the step issues, holding their tensors only by weak reference (a CUDA
    graph holds raw pointers, no references), and keeps no reference to the step; a replay
    re-issues exactly those ops on exactly those tensors and fails, as a real replay faults with
    an illegal memory access, if one of them has been freed since the capture."""

    def capture(self, step):
        import weakref

        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        calls: list = []

        class Record(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                calls.append((func, [weakref.ref(a) if isinstance(a, torch.Tensor) else a
                                     for a in args], kwargs or {}))
                return func(*args, **(kwargs or {}))

        with Record():
            step()

        def replay() -> None:
            for func, refs, kwargs in calls:
                args = [a() if isinstance(a, weakref.ref) else a for a in refs]
                if any(a is None and isinstance(r, weakref.ref)
                       for a, r in zip(args, refs, strict=True)):
                    raise RuntimeError(f"illegal memory access: {func} replays a freed tensor")
                func(*args, **kwargs)

        return replay


def test_graphs_keep_every_tensor_they_address_alive() -> None:
    """The H200 crash at b32 ctx32k (v2): a variant's v2 workspace was held only by its step's
    closure, freed when the next variant's step replaced it, and unmapped by the next capture's
    empty_cache while the first graph still wrote to it. Three variants, v2, graph semantics."""
    from kvprefetch.bench.matrix import shapes_from_specs

    shape = shapes_from_specs(["2x600"], preset="tinyllama-1.1b", force="v2")[0]
    variants = [_reference_ops("kvp_bk_a", "baseline"), _reference_ops("kvp_bk_b", "patched"),
                _reference_ops("kvp_bk_c", "seed")]
    cfg = k.KernelBenchConfig(mode="cold", rounds=3, target_sample_ms=0.0, min_launches=2)
    r = k.bench_shape(variants, shape, cfg, l2_bytes=2**20, copy_bw=COPY_BW, device="cpu",
                      backend=_GraphModel())
    assert r.status == "measured" and r.bitwise_equal is True
    assert all(v.time_us.n == 3 and v.nan_free for v in r.variants)


def test_run_kernel_bench_refuses_without_gpu() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(BenchError, match="needs a CUDA GPU"):
        k.run_kernel_bench([], BenchMatrix(), [k.KernelBenchConfig()])


def test_bench_shape_skips_missing_instantiations(tmp_path) -> None:
    from kvprefetch.bench.matrix import shapes_from_specs
    from kvprefetch.kernels.ops import BuiltOps, PagedOps

    base = _reference_ops("kvp_bku_a", "baseline")
    no64 = BuiltOps(tree="seed", variant="seed", namespace="x", so_path=tmp_path, so_sha256="",
                    head_sizes=(128,), block_sizes=(16,), kv_dtypes=("fp16",),
                    manifest_path=tmp_path)
    seed = PagedOps(name="seed", namespace="x", v1=base.v1, v2=base.v2, build=no64)
    shape = shapes_from_specs(["1x100"], preset="tinyllama-1.1b")[0]
    r = k.bench_shape([base, seed], shape, k.KernelBenchConfig(), 2**20, COPY_BW, device="cpu")
    assert r.error == "instantiation not in build(s): seed" and r.variants == ()


class _SmallDevice(k.HostBackend):
    def free_bytes(self) -> int:
        return 16 * 2**20


def _no_allocation(*args, **kwargs):
    raise AssertionError("inputs were allocated for a shape that must be skipped")


def test_shape_over_free_memory_is_skipped_before_allocating(monkeypatch) -> None:
    from kvprefetch.bench.matrix import shapes_from_specs

    monkeypatch.setattr(k, "make_inputs", _no_allocation)
    shape = shapes_from_specs(["8x4k"], preset="tinyllama-1.1b")[0]  # 32 MiB of KV per layer
    base = _reference_ops("kvp_bku_a", "baseline")
    r = k.bench_shape([base, _reference_ops("kvp_bku_b", "patched")], shape,
                      k.KernelBenchConfig(mode="hot"), 2**20, COPY_BW, device="cpu",
                      backend=_SmallDevice())
    assert r.status == "skipped" and r.variants == ()
    assert "GiB of device memory" in r.error and "0.02 GiB free" in r.error
    assert r.to_dict()["status"] == "skipped" and r.to_dict()["error"] == r.error


def test_shape_beyond_a_vllm_launch_limit_is_skipped(monkeypatch) -> None:
    """v1 forced at 64k tokens needs 256 KiB of shared memory per block; vLLM's launcher cannot
    launch it on any current GPU, so the bench must not either."""
    from kvprefetch.bench.limits import VLLM_LIMIT_PREFIX
    from kvprefetch.bench.matrix import shapes_from_specs

    monkeypatch.setattr(k, "make_inputs", _no_allocation)
    shape = shapes_from_specs(["1x64k"], preset="tinyllama-1.1b", force="v1")[0]
    base = _reference_ops("kvp_bku_a", "baseline")
    r = k.bench_shape([base, _reference_ops("kvp_bku_b", "patched")], shape,
                      k.KernelBenchConfig(mode="hot"), 2**20, COPY_BW, device="cpu")
    assert r.status == "skipped"
    assert r.error.startswith(VLLM_LIMIT_PREFIX) and "262144 B of shared memory" in r.error
