"""vLLM 0.10.2's call of the paged-attention decode kernel: what a decode *step* (its real
sequence lengths) becomes as the *launch* the kernel sees. Every benchmark that times the kernels
as vLLM runs them (``bench kernel``, its matrix and ``--sample``, and ``bench decode``) takes the
launch from here, and every report that explains a step by the launcher's rule reads the launch's
values back from here (``row_launch``).

What vLLM 0.10.2's V0 engine does (``VLLM_USE_V1=0``, the XFORMERS backend), file:line in the
released sdist:

- **Capture sizes.** V0 captures CUDA graphs at ``[1, 2, 4] + [8 * i for i in 1..1024]`` up to
  the first size >= ``max_num_seqs`` (vllm/config/__init__.py:3625-3647, ``_set_cudagraph_sizes``,
  the ``not envs.VLLM_USE_V1`` branch); ``max_num_seqs`` defaults to 256 in V0
  (vllm/engine/arg_utils.py:1611-1613), so the largest bucket is 256. (``min(2 x max_num_seqs,
  512)`` is V1's rule, vllm/config/scheduler.py:239-244, not V0's.)
- **Bucket.** A decode batch of ``n`` is padded to the smallest capture size >= n
  (``pad_for_cudagraph``, vllm/config/__init__.py:3266-3271 over
  ``bs_to_padded_graph_size``, vllm/config/compilation.py:519-534).
- **Pad rows.** Each pad row has sequence length 1 (vllm/worker/model_runner.py:886; the capture
  buffer starts as ones, vllm/attention/backends/utils.py:307), slot ``PAD_SLOT_ID``
  (utils.py:233) and a block-table row the runner never writes (utils.py:239-242 write the real
  rows only): zeros until a larger batch has used that row, i.e. block 0, a real block in V0.
  So a pad row reads one real block. (A row a larger batch once used keeps that batch's block
  numbers; this model takes the zeros.)
- **Capture length.** The graph is captured with ``max_decode_seq_len =
  max_seq_len_to_capture`` (utils.py:339), which is ``min(max_seq_len_to_capture,
  max_model_len)`` (vllm/config/__init__.py:365 default 8192, clamped at :1233). Replay reuses the
  captured launch (only ``seq_lens`` and ``block_tables`` are copied in,
  utils.py:380-388), so v1/v2 (paged_attn.py L122-135, ``kernels.ops.choose_kernel``), the
  partition count and the shared memory all follow the capture length and the padded batch.
- **Block table.** Graph steps pass the captured table: ``graph_block_tables[:batch]`` of
  ``ceil(max_seq_len_to_capture / block_size)`` columns (vllm/worker/model_runner.py:988-990,
  ``get_max_block_per_batch`` :1126-1128).
- **Eager steps.** A decode step runs eagerly (``_use_captured_graph``,
  vllm/worker/model_runner.py:723-731) where ``enforce_eager`` is set, where its longest sequence
  exceeds the capture length, or where its batch exceeds the largest capture size. It passes its
  real ``max(seq_lens)``, its exact batch and a block table of its own width
  (``make_tensor_with_pad(..., pad=0)``, utils.py:246).

The ``exact`` call is the one the kit's kernel benchmarks made before issue 40: every step at its
real ``max(seq_lens)`` and exact batch, graph-timed or not. It is kept for research only; result
documents without ``meta.call`` were made with it.

Pure Python: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..errors import ConfigError
from ..kernels.kvinputs import AttnShape
from ..kernels.ops import choose_kernel
from .schema import CallFields, KernelLike, LaunchFields, ShapeRow

CALLS = ("vllm", "exact")
TIMINGS = ("graph", "eager")
MAX_SEQ_LEN_TO_CAPTURE = 8192  # vllm/config/__init__.py:365
MAX_NUM_SEQS = 256             # V0's default, vllm/engine/arg_utils.py:1611-1613
# V0's candidate capture sizes (vllm/config/__init__.py:3625).
POSSIBLE_SIZES = (1, 2, 4, *range(8, 8 * 1024 + 1, 8))


def capture_sizes(max_num_seqs: int = MAX_NUM_SEQS) -> tuple[int, ...]:
    """V0's CUDA-graph batch sizes: 1, 2, 4, 8, 16, 24, ... up to the first that holds
    ``max_num_seqs`` sequences (256 for V0's default)."""
    if max_num_seqs < 1:
        raise ConfigError(f"max_num_seqs {max_num_seqs} is below 1", "pass a positive batch")
    out: list[int] = []
    for size in POSSIBLE_SIZES:
        out.append(size)
        if size >= max_num_seqs:
            break
    return tuple(out)


def graph_bucket(batch: int, sizes: Sequence[int]) -> int | None:
    """The capture size a batch of ``batch`` sequences is padded to, or None (it runs eagerly)."""
    return next((s for s in sizes if s >= batch), None)


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


@dataclass(frozen=True, kw_only=True)
class VllmCall:
    """How vLLM is configured, as far as the kernel's launch depends on it. ``call``: ``vllm``
    (the model above) or ``exact`` (the pre-issue-40 call, research only). ``max_model_len``
    None: the model's own length, taken to be at least the capture length (every model the
    presets name allows 8192 tokens or more)."""

    call: str = "vllm"
    max_model_len: int | None = None
    max_seq_len_to_capture: int = MAX_SEQ_LEN_TO_CAPTURE
    max_num_seqs: int = MAX_NUM_SEQS
    enforce_eager: bool = False

    def __post_init__(self) -> None:
        if self.call not in CALLS:
            raise ConfigError(f"unknown call '{self.call}'",
                              "pass --call vllm (vLLM's own call) or --call exact (research)")
        for name, value in (("--max-model-len", self.max_model_len),
                            ("--max-seq-len-to-capture", self.max_seq_len_to_capture),
                            ("max_num_seqs", self.max_num_seqs)):
            if value is not None and value < 1:
                raise ConfigError(f"{name} {value} is below 1", f"pass {name} 1 or more")

    @property
    def capture_len(self) -> int:
        """The ``max_seq_len`` every graph is captured with: min(max_seq_len_to_capture,
        max_model_len)."""
        if self.max_model_len is None:
            return self.max_seq_len_to_capture
        return min(self.max_seq_len_to_capture, self.max_model_len)

    @property
    def buckets(self) -> tuple[int, ...]:
        return capture_sizes(self.max_num_seqs)

    def for_model_len(self, max_model_len: int | None) -> VllmCall:
        """The same call for a model of ``max_model_len`` tokens (a sampled step's own); None
        keeps this call's."""
        return self if max_model_len is None else replace(self, max_model_len=max_model_len)

    def eager_reason(self, batch: int, max_len: int) -> str:
        """Why vLLM runs a step of ``batch`` sequences, the longest ``max_len`` tokens, eagerly
        ("" where it replays a captured graph)."""
        if self.enforce_eager:
            return "enforce_eager (--eager)"
        if max_len > self.capture_len:
            return (f"longest sequence {max_len} > capture length {self.capture_len}")
        if batch > self.buckets[-1]:
            return f"batch {batch} > largest capture size {self.buckets[-1]}"
        return ""

    def to_dict(self) -> CallFields:
        return {"call": self.call, "max_model_len": self.max_model_len,
                "max_seq_len_to_capture": self.max_seq_len_to_capture,
                "capture_len": self.capture_len, "max_num_seqs": self.max_num_seqs,
                "buckets": list(self.buckets), "enforce_eager": self.enforce_eager,
                "doc": "kvprefetch/bench/vllm_call.py"}


EXACT = VllmCall(call="exact")


@dataclass(frozen=True, kw_only=True)
class Launch:
    """What the kernel is given for one step: ``num_seqs`` rows (the real ones, then
    ``pad_rows`` rows of length 1 reading block 0), ``max_seq_len``, a block table of
    ``table_width`` columns, and the kernel vLLM's rule picks for them (or the forced one).
    ``graph``: replayed from a captured graph; else run eagerly, ``eager_reason`` saying why."""

    call: str
    graph: bool
    eager_reason: str
    real_batch: int
    num_seqs: int
    max_seq_len: int
    seq_lens: tuple[int, ...]
    table_width: int
    kernel: str
    forced: bool = False

    @property
    def pad_rows(self) -> int:
        return self.num_seqs - self.real_batch

    @property
    def timing(self) -> str:
        return "graph" if self.graph else "eager"

    def to_dict(self) -> LaunchFields:
        return {"call": self.call, "timing": self.timing, "eager_reason": self.eager_reason,
                "real_batch": self.real_batch, "num_seqs": self.num_seqs,
                "pad_rows": self.pad_rows, "max_seq_len": self.max_seq_len,
                "table_width": self.table_width, "kernel": self.kernel,
                "kernel_forced": self.forced}


def launch_for(seq_lens: Sequence[int], *, num_heads: int, block_size: int, call: VllmCall,
               timing: str, force: str | None = None) -> Launch:
    """The launch of a step whose sequences have ``seq_lens`` tokens, under ``call`` and
    ``timing`` (``graph``: CUDA graphs on, as vLLM runs by default; ``eager``: every step eager,
    as ``enforce_eager``). Under the vLLM call a graph-timed step that vLLM would run eagerly
    (see VllmCall.eager_reason) gets the eager launch."""
    lens = tuple(int(n) for n in seq_lens)
    if not lens or min(lens) < 1:
        raise ConfigError("a decode step needs at least one sequence of at least one token",
                          "give one length >= 1 per sequence")
    if timing not in TIMINGS:
        raise ConfigError(f"timing must be graph or eager, not '{timing}'",
                          "pass --timing graph, eager or graph,eager")
    batch, longest = len(lens), max(lens)
    if call.max_model_len is not None and longest > call.max_model_len:
        raise ConfigError(f"a sequence of {longest} tokens does not fit max_model_len "
                          f"{call.max_model_len}", "raise --max-model-len or shorten the step")
    if call.call == "exact":
        rows, max_len, reason = batch, longest, "" if timing == "graph" else "eager timing"
    else:
        reason = "eager timing" if timing == "eager" else call.eager_reason(batch, longest)
        if reason:
            rows, max_len = batch, longest
        else:
            bucket = graph_bucket(batch, call.buckets)
            assert bucket is not None  # eager_reason caught a batch above every bucket
            rows, max_len = bucket, call.capture_len
    kernel = force or choose_kernel(max_len, rows, num_heads)
    return Launch(call=call.call, graph=not reason, eager_reason=reason, real_batch=batch,
                  num_seqs=rows, max_seq_len=max_len, seq_lens=lens + (1,) * (rows - batch),
                  table_width=blocks_for(max_len, block_size), kernel=kernel,
                  forced=force is not None)


def launch_attn(attn: AttnShape, launch: Launch) -> AttnShape:
    """The step's attention shape as the kernel sees it: the launch's rows and max_seq_len
    (its block table ``ceil(max_seq_len / block_size)`` columns wide, ``AttnShape.blocks_per_seq``,
    which is the captured width on a graph launch)."""
    return replace(attn, num_seqs=launch.num_seqs, max_seq_len=launch.max_seq_len)


# ----------------------------------------------------------------------------- reading results


def doc_call(doc: KernelLike) -> CallFields:
    """A result document's call (``meta.call``); documents made before it was recorded were made
    with the exact call."""
    return doc.get("meta", {}).get("call") or {"call": "exact"}


def describe_call(call: CallFields) -> str:
    """One line for a report's header."""
    if call.get("call") != "vllm":
        return ("exact (every step at its real max_seq_len and exact batch, graph-timed or "
                "not: the pre-issue-40 call, research only)")
    mml = call.get("max_model_len")
    cap = call.get("capture_len")
    buckets = call.get("buckets") or []
    text = ("vLLM 0.10.2 V0's (graph steps: batch padded to its capture size with length-1 "
            f"rows, max_seq_len = capture length {cap}")
    text += (f" = min({call.get('max_seq_len_to_capture')}, max_model_len {mml})" if mml
             else f" (max_seq_len_to_capture {call.get('max_seq_len_to_capture')})")
    if call.get("per_step_max_model_len"):
        text += ", max_model_len drawn per step"
    text += f"; capture sizes 1..{buckets[-1] if buckets else '?'}"
    text += "; every step eager (--eager)" if call.get("enforce_eager") else (
        "; longer or larger steps eager at their real values")
    return text + "; bench/vllm_call.py)"


def row_launch(r: ShapeRow) -> LaunchFields:
    """The launch a result row ran (``num_seqs``, ``max_seq_len``, ``table_width``,
    ``kernel``, ``timing``): its ``launch`` record, or for a row made before the kit recorded
    it (the exact call) its real batch and longest sequence."""
    launch = r.get("launch")
    if launch:
        return launch
    return {"call": "exact", "num_seqs": r["batch"], "max_seq_len": r["context"],
            "real_batch": r["batch"], "pad_rows": 0,
            "table_width": blocks_for(r["context"], r.get("block_size") or 16),
            "kernel": r["kernel"], "timing": r.get("timing", "graph"), "eager_reason": ""}
