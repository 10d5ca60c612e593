"""Page arithmetic of the VMM cache for both layouts (pure logic, no GPU, no mocks)."""

from __future__ import annotations

import pytest

from kvprefetch.errors import KvprefetchError
from kvprefetch.vmm.errors import VmmUsageError
from kvprefetch.vmm.layout import KVCacheSpec, Layout, make_geometry

MiB = 1 << 20


def llama(layout: Layout = Layout.PER_LAYER, **kw: int) -> KVCacheSpec:
    args = {"num_layers": 32, "num_kv_heads": 8, "head_dim": 128, "max_batch": 4,
            "max_context": 16384}
    args.update(kw)
    return KVCacheSpec(layout=layout, **args)  # type: ignore[arg-type]


def test_per_layer_llama_geometry() -> None:
    g = make_geometry(llama(), 2 * MiB)
    assert g.token_bytes == 8 * 128 * 2 == 2048
    assert g.page_size // g.token_bytes == 1024          # tokens per 2 MB page
    assert g.n_tensors == 64                              # K and V for 32 layers
    assert g.group_bytes == 64 * 2 * MiB                  # 128 MB per page group
    assert g.slot_bytes == 16384 * 2048 and g.contiguous
    assert g.pages_per_slot == 16
    assert g.tensor_bytes == 4 * g.slot_bytes
    assert g.shape == (4, 16384, 8, 128)
    assert g.strides_elems == (16384 * 1024, 1024, 128, 1)
    assert g.va_bytes == 64 * 4 * 32 * MiB


def test_tensor_slicing_llama_geometry() -> None:
    g = make_geometry(llama(Layout.TENSOR_SLICING), 2 * MiB)
    assert g.token_bytes == 32 * 2048
    assert g.page_size // g.token_bytes == 32             # 32 tokens of all layers per page
    assert g.n_tensors == 2 and g.group_bytes == 4 * MiB
    assert g.shape == (4, 16384, 32, 8, 128)
    assert g.strides_elems == (16384 * 32 * 1024, 32 * 1024, 1024, 128, 1)
    assert g.pages_per_slot == 16384 // 32


@pytest.mark.parametrize("layout", list(Layout))
def test_groups_for_tokens_edges(layout: Layout) -> None:
    g = make_geometry(llama(layout), 2 * MiB)
    tpp = g.page_size // g.token_bytes
    assert g.groups_for_tokens(0) == 0
    assert g.groups_for_tokens(1) == 1
    assert g.groups_for_tokens(tpp) == 1
    assert g.groups_for_tokens(tpp + 1) == 2
    assert g.groups_for_tokens(16384) == g.pages_per_slot
    for n in (1, tpp - 1, tpp, 3 * tpp + 5):
        assert g.tokens_in_groups(g.groups_for_tokens(n)) >= n


def test_token_straddling_a_page_boundary_needs_the_next_page() -> None:
    # 3 heads x 128 x 2 B = 768 B per token does not divide 2 MB: token 2730 spans two pages.
    g = make_geometry(llama(num_kv_heads=3, max_context=8192), 2 * MiB)
    per_page = (2 * MiB) // 768                           # 2730 whole tokens
    assert g.groups_for_tokens(per_page) == 1
    assert g.groups_for_tokens(per_page + 1) == 2
    assert g.tokens_in_groups(1) == per_page


def test_padding_when_context_is_not_page_aligned() -> None:
    g = make_geometry(llama(max_context=512), 2 * MiB)    # 1 MB per slot, rounded to 2 MB
    assert g.slot_bytes == 2 * MiB and not g.contiguous
    assert g.strides_elems[0] == MiB                      # 2 MB / 2 B: batch stride in elements
    assert g.group_offset(3, 0) == 3 * 2 * MiB


def test_offsets_and_runs() -> None:
    g = make_geometry(llama(), 2 * MiB)
    assert g.group_offset(0, 0) == 0
    assert g.group_offset(2, 5) == 2 * g.slot_bytes + 5 * 2 * MiB
    assert g.run_span(1, 2, 6) == (g.slot_bytes + 4 * MiB, 8 * MiB)
    with pytest.raises(VmmUsageError):
        g.group_offset(0, g.pages_per_slot)


def test_tensor_index_order_is_all_k_then_all_v() -> None:
    g = make_geometry(llama(num_layers=3), 2 * MiB)
    assert [g.tensor_index(0, i) for i in range(3)] == [0, 1, 2]
    assert [g.tensor_index(1, i) for i in range(3)] == [3, 4, 5]
    s = make_geometry(llama(Layout.TENSOR_SLICING, num_layers=3), 2 * MiB)
    assert (s.tensor_index(0, 2), s.tensor_index(1, 2)) == (0, 1)
    with pytest.raises(VmmUsageError, match="layer 3 does not exist"):
        g.tensor_index(0, 3)


def test_context_beyond_s_max_is_a_clear_usage_error() -> None:
    g = make_geometry(llama(), 2 * MiB)
    with pytest.raises(VmmUsageError) as ei:
        g.groups_for_tokens(16385)
    assert "beyond the cache's S_max=16384" in str(ei.value)
    assert "To fix:" in str(ei.value)
    assert isinstance(ei.value, KvprefetchError)
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(VmmUsageError):
            g.groups_for_tokens(bad)  # type: ignore[arg-type]


def test_page_size_must_be_a_multiple_of_the_queried_granularity() -> None:
    assert make_geometry(llama(), 2 * MiB, 4 * MiB).page_size == 4 * MiB
    assert make_geometry(llama(), 64 * 1024).page_size == 64 * 1024  # whatever the driver says
    with pytest.raises(VmmUsageError, match="not a positive multiple"):
        make_geometry(llama(), 2 * MiB, 64 * 1024)
    with pytest.raises(VmmUsageError):
        make_geometry(llama(), 0)


@pytest.mark.parametrize(("field", "value"), [("num_layers", 0), ("max_batch", -1),
                                         ("head_dim", 1.5), ("max_context", True)])
def test_spec_rejects_bad_numbers(field: str, value: object) -> None:
    args: dict[str, object] = {"num_layers": 2, "num_kv_heads": 8, "head_dim": 128,
                               "max_batch": 2, "max_context": 1024}
    args[field] = value
    with pytest.raises(VmmUsageError, match=field):
        KVCacheSpec(**args)  # type: ignore[arg-type]


def test_spec_rejects_unknown_dtype_and_layout() -> None:
    with pytest.raises(VmmUsageError, match="unsupported KV dtype"):
        KVCacheSpec(1, 1, 128, 1, 16, dtype="float64")
    with pytest.raises(VmmUsageError, match="unknown layout 'paged'"):
        KVCacheSpec(1, 1, 128, 1, 16, layout="paged")  # type: ignore[arg-type]
    assert KVCacheSpec(1, 1, 128, 1, 16, layout="tensor-slicing").layout is Layout.TENSOR_SLICING  # type: ignore[arg-type]
