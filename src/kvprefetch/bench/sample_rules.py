"""The steps of a sampled run that the launcher's rule explains: at the instantiations with GQA
twins compiled, which twin `auto` runs (``twin_steps``), and at the v1 steps of a
launch-bounded instantiation, which code runs (``bound_steps``), each beside what the variants
measured there.

The rule is its Python statement in kernels/policy.py, given the launch the kernel saw
(bench/vllm_call.py ``row_launch``: under vLLM's call a graph step's padded batch and capture
length), never the step's real values; a document made before the kit recorded launches was
made with the exact call, whose launch is the step itself.
"""

from __future__ import annotations

from typing import Any

from .sample_stats import measured, step_ratio
from .schema import SampleDocument, ShapeRow
from .vllm_call import row_launch


def run_twin_at(doc: SampleDocument) -> tuple[tuple[int, int, bool], ...]:
    """The (head size, block size, v1 too) a sampled run had twins at: its ``meta.twin_at``, or
    for a run made before the kit recorded it, the one instantiation the twins had then."""
    from ..kernels.policy import TWIN_AT_BEFORE_LIST

    at = doc["meta"].get("twin_at")
    return (TWIN_AT_BEFORE_LIST if at is None
            else tuple((int(h), int(b), bool(v1)) for h, b, v1 in at))


def run_partial_groups(doc: SampleDocument) -> bool:
    """Whether a sampled run's twins took models whose G does not divide the query heads per
    kv head (``meta.twin_partial_groups``; runs made before the kit recorded it did not)."""
    return bool(doc["meta"].get("twin_partial_groups", False))


def run_least_guard(doc: SampleDocument) -> bool:
    """Whether a sampled run's `auto` declined twins whose grid could outlast stock's code if
    the other sequences were short (``meta.twin_least_guard``; runs made before the kit
    recorded it checked v1 short chains only)."""
    return bool(doc["meta"].get("twin_least_guard", False))


def run_wave_guard(doc: SampleDocument) -> bool:
    """Whether a sampled run's launcher declined the bound and the twins wherever some number
    of long sequences would give them more waves than stock's code (``meta.wave_guard``; runs
    made before it did not)."""
    return bool(doc["meta"].get("wave_guard", False))


def checked_launch(r: ShapeRow) -> Any:
    """``row_launch(r)``, its batch a count the kernel takes (1 to gridDim.y's 65535), else a
    ValueError (``documents.reading`` names the file): the rule's mirror searches every count
    of long sequences up to the batch (``policy.more_waves_for_some``), and a recorded batch of
    400 digits made `report` search for ever (issue 41, the nineteenth hostile pass)."""
    from .limits import MAX_GRID_YZ

    launch = row_launch(r)
    seqs = launch["num_seqs"]
    if not isinstance(seqs, int) or isinstance(seqs, bool) or not 1 <= seqs <= MAX_GRID_YZ:
        raise ValueError(f"step {r.get('label', '?')!r} records a launch of {seqs!r} "
                         f"sequences, not 1 to {MAX_GRID_YZ}")
    return launch


def _mirror_pick(doc: SampleDocument, r: ShapeRow, sms: int,
                 least_guard: bool) -> tuple[int, int] | None:
    """The twin `auto` runs at sampled step ``r`` of run ``doc`` by the rule's mirror, on ``sms``
    SMs, under the run's partial-group rule and with or without the short-CTA guard."""
    from ..kernels.policy import twin_pick
    from .sample import cache_kind

    launch = checked_launch(r)  # the launcher sees the launch, not the step's real values
    return twin_pick(r["num_heads"], r["num_kv_heads"], batch=launch["num_seqs"],
                     context=launch["max_seq_len"], kernel=r["kernel"], sm_count=sms,
                     head_size=r["head_size"], block_size=r["block_size"],
                     dtype=cache_kind(r["kv_cache_dtype"], r["dtype"]),
                     partial_groups=run_partial_groups(doc), least_guard=least_guard,
                     wave_guard=run_wave_guard(doc))


def twin_steps(doc: SampleDocument, timing: str) -> list[dict[str, Any]]:
    """The steps whose instantiation has GQA twins compiled beside it: which twin `auto` runs
    there by the launcher's rule (its mirror, ``policy.twin_pick``, on this run's SM count;
    "none": vLLM's kernel) and what ``patched`` (and ``gqa_off``, where it ran) measured. The
    rule's prediction beside the measurement, step by step; it is the rule as this kit has it,
    so it describes a run made with the same rules (a run's provenance names its commit), at
    the instantiations the run had twins at (run_twin_at) and for the models it had them for
    (run_partial_groups) and with the guard it had (run_least_guard)."""
    from ..kernels.policy import H200_SMS, twin_shapes
    from .sample import cache_kind

    sms = doc["meta"]["device"].get("sm_count") or H200_SMS
    at = run_twin_at(doc)
    out = []
    keys = ("dtype", "kernel", "kv_cache_dtype", "head_size", "block_size", "num_heads",
            "num_kv_heads")
    for i, r in measured(doc, timing):
        if any(k not in r for k in keys) or not twin_shapes(
                "prefetch", r["kernel"], r["kv_cache_dtype"], r["head_size"], r["block_size"],
                cache_kind(r["kv_cache_dtype"], r["dtype"]), at=at):
            continue
        pick = _mirror_pick(doc, r, sms, run_least_guard(doc))
        twin = f"{pick[0]}x{pick[1]}" if pick else "none"
        partial = pick is not None and (r["num_heads"] // r["num_kv_heads"]) % pick[0] != 0
        row = f"{twin}, last group partial" if partial else twin
        if pick is None and run_least_guard(doc) and _mirror_pick(doc, r, sms, False):
            row = "none: the short-CTA guard declined a twin"
        out.append({"step": i, "label": r["label"], "family": r.get("family", "uniform"),
                    "twin": twin, "row": row,
                    "patched": step_ratio(r, "patched"), "gqa_off": step_ratio(r, "gqa_off")})
    return out


def bound_steps(doc: SampleDocument, timing: str) -> list[dict[str, Any]]:
    """The v1 steps of a launch-bounded instantiation where no twin runs: which code the
    launcher runs by its rule (``policy.v1_code_pick``: the bounded kernel, or stock's
    unbounded copy where the bound would cost a wave) and what ``patched`` measured, and where
    both trees ran, the bound's own step (``gqa_off`` over ``launch``, whose kernels are
    stock's). Like twin_steps, the rule as this kit has it, at the run's twin_at."""
    from ..kernels.policy import H200_SMS, min_blocks, twin_shapes, v1_code_pick
    from .sample import cache_kind

    sms = doc["meta"]["device"].get("sm_count") or H200_SMS
    at = run_twin_at(doc)
    out = []
    keys = ("dtype", "kv_cache_dtype", "head_size", "block_size", "num_heads", "num_kv_heads",
            "batch", "context")
    for i, r in measured(doc, timing):
        if r.get("kernel") != "v1" or any(k not in r for k in keys):
            continue
        inst = ("prefetch", "v1", r["kv_cache_dtype"], r["head_size"], r["block_size"],
                cache_kind(r["kv_cache_dtype"], r["dtype"]))
        if not min_blocks(*inst) or (twin_shapes(*inst, at=at)
                                     and _mirror_pick(doc, r, sms, run_least_guard(doc))):
            continue
        launch, gqa_off = step_ratio(r, "launch"), step_ratio(r, "gqa_off")
        ran = checked_launch(r)
        out.append({"step": i, "label": r["label"],
                    "code": v1_code_pick(r["head_size"], ran["num_seqs"], r["num_heads"],
                                         ran["max_seq_len"], sm_count=sms,
                                         wave_guard=run_wave_guard(doc)),
                    "patched": step_ratio(r, "patched"),
                    "own": gqa_off / launch if launch and gqa_off else None})
    return out
