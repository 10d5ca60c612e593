"""The result documents' schema: what ``bench`` (kernel, sample, decode, ncu, e2e), ``report
--repeats``/``--merge`` and ``verify-kernel`` (identity) write, and what ``report``, ``--merge``,
``--repeats``, ``--readme`` and ``--index`` read. One ``TypedDict`` per document and per part of
one; writers build their documents as these types and readers are typed with them, and
the one loader (documents.py's ``load_document``) checks a parsed JSON value against the same
classes at run time, so the writer's and the reader's idea of a document cannot
drift apart. Past the ~500-line mark on purpose: the documents share their parts (device facts,
meta, rows), and one module of them is what writers, readers and the loader all import.

Why ``TypedDict`` and not dataclasses: a document is JSON, read as JSON and copied as JSON.
``--merge`` copies rows verbatim into the merged document and ``--repeats`` keeps device facts as
they were; a key this kit does not know (written by a later version within the same schema) must
survive a merge, and the committed results under docs/results must render byte-identically. A
dataclass would convert (dropping unknown keys, reordering the rest) at every read and write; a
``TypedDict`` is the parsed ``dict`` itself with a static type, so nothing is converted.

Required and optional keys. Each class with optional keys is two: ``_XKeys`` holds the keys every
document has (the readers index them), ``X(_XKeys, total=False)`` adds those a document may lack
(the readers ``.get`` them with a default). A ``total=False`` split rather than ``NotRequired``:
that needs Python 3.11 or typing_extensions, and the kit supports 3.10 without it.

Versions. Every document carries ``schema`` (``SCHEMA_VERSION``, 1: the only version written so
far); a document of another version is refused, naming it. Within version 1 fields were added
over time; the documents written before them (committed under docs/results, never rewritten) are
the legacy layouts, read through the same classes: each field added later is optional, and its
comment says what its absence means, which is what the readers apply (the legacy view):

- kernel rows before ``timing`` and ``kv_bytes`` (before the vLLM call, issue 40; 26 of the 30
  committed kernel results): timed from a CUDA graph, the KV read not recorded;
- kernel meta before ``kit`` (26 of 30): the kit's commit not recorded;
- kernel/sample meta before ``call`` (all but 3 samples): the exact call (``vllm_call.doc_call``);
- sample rows before ``launch``/``step``/``max_model_len``; decode config before
  ``max_seq_len_to_capture`` (3 of 9 committed decode results): 8192, vLLM's default;
- rows before ``status``: measured without an error, skipped with one;
- ``identity`` documents (written by verify-kernel) carry no ``schema``: they are version 1.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict, TypeGuard

# NOTE: past the ~500-line mark on purpose: one class per document part, every kind in one
# module, so that the schema is read (and changed) in one place, as the issue 45 asks.

SCHEMA_VERSION = 1
KINDS = ("kernel", "ncu", "e2e", "identity", "repeats", "decode", "sample")
UNVERSIONED_KINDS = ("identity",)  # verify-kernel's document has no `schema` field: version 1

# A part of a document the kit records for the record and no reader opens (a run's configs, a
# sample's distribution): any JSON object, carried as it is.
Opaque = dict[str, Any]


# ----------------------------------------------------------------------------- shared parts


class _StatsKeys(TypedDict):
    median: float
    p25: float
    p75: float
    min: float
    max: float


class Stats(_StatsKeys, total=False):
    """bench/stats.py's ``Stats`` as JSON: a median and spread over rounds or repeats."""

    n: int


class _DeviceKeys(TypedDict):
    name: str
    l2_bytes: int


class Device(_DeviceKeys, total=False):
    """bench/device.py's ``device_facts``."""

    sm_count: int
    torch: str
    cuda: str | None  # None: a torch without CUDA
    capability: str
    total_memory: int
    smem_optin_bytes: int
    l2_reported: bool
    smem_reported: bool
    stand_in: str  # a CPU stand-in's reason (slurm/standin.py): nothing was timed


class Kit(TypedDict, total=False):
    """kitinfo.py's ``KitInfo``: the kit that ran (absent before it was recorded)."""

    version: str
    root: str
    commit: str | None
    dirty: bool | None


class _ShapeKeys(TypedDict):
    preset: str
    batch: int
    context: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int
    dtype: str
    kv_cache_dtype: str
    kernel: str
    kernel_forced: bool


class ShapeFields(_ShapeKeys, total=False):
    """bench/matrix.py's ``BenchShape.to_dict``: one decode call's shape; a sampled step's
    sequence lengths too."""

    seq_lens: list[int]
    family: str
    mean_seq_len: float
    max_model_len: int


# ----------------------------------------------------------------------------- kernel, sample


class LaunchPlanFields(TypedDict):
    """bench/kernel_results.py's ``LaunchPlan``."""

    layers: int
    launches: int
    replays: int
    bytes_per_layer: int
    est_launch_us: float


class _LaunchKeys(TypedDict):
    call: str
    timing: str
    eager_reason: str
    real_batch: int
    num_seqs: int
    pad_rows: int
    max_seq_len: int
    table_width: int
    kernel: str


class LaunchFields(_LaunchKeys, total=False):
    """bench/vllm_call.py's ``Launch.to_dict``: what the kernel was given for one step (a legacy
    row's, rebuilt by ``vllm_call.row_launch``, has no ``kernel_forced``)."""

    kernel_forced: bool


class _VariantResultKeys(TypedDict):
    time_us: Stats
    speedup: Stats | None  # None: the baseline
    bw_fraction: float


class VariantResult(_VariantResultKeys, total=False):
    """One variant's numbers in one row."""

    equal_to_baseline: bool | None
    nan_free: bool


class _ShapeRowKeys(ShapeFields):
    label: str
    mode: str


class ShapeRow(_ShapeRowKeys, total=False):
    """One shape (or sampled step) in one mode and timing: a ``kernel`` or ``sample`` row
    (bench/kernel_results.py's ``ShapeResult.to_dict``)."""

    timing: str  # absent in legacy rows: graph
    bytes_moved: int
    kv_bytes: int  # absent in legacy rows: not recorded
    bitwise_equal: bool | None
    status: str  # absent in legacy rows: measured, or skipped when there is an error
    error: str
    launch: LaunchFields
    step: int
    plan: LaunchPlanFields | None
    variants: dict[str, VariantResult]  # each variant's numbers; {} in a row without them


class _VariantMetaKeys(TypedDict):
    name: str


class VariantMeta(_VariantMetaKeys, total=False):
    """One timed library (a build's namespace and sha256; in-process when absent)."""

    namespace: str
    so_sha256: str
    so_path: str


class CallFields(TypedDict, total=False):
    """bench/vllm_call.py's ``VllmCall.to_dict`` (``meta.call``; the exact call when absent)."""

    call: str
    max_model_len: int | None
    max_seq_len_to_capture: int
    capture_len: int
    max_num_seqs: int
    buckets: list[int]
    enforce_eager: bool
    doc: str
    per_step_max_model_len: bool


class MatrixFields(TypedDict, total=False):
    """bench/matrix.py's ``BenchMatrix.to_dict``."""

    name: str
    presets: list[str]
    batches: list[int]
    contexts: list[int]
    block_sizes: list[int]
    dtypes: list[str]
    kv_cache_dtypes: list[str]
    force: str | None
    extra_grids: list[list[list[int]]]


class NotMeasured(TypedDict):
    """A row without numbers, as ``meta.not_measured`` lists it."""

    label: str
    mode: str
    timing: str
    status: str
    reason: str


class MergeShard(TypedDict):
    file: str
    started: str | None
    rows: int


class MergeInfo(TypedDict):
    """``report --merge``: the shards merged and what differed between them (``--force-merge``)."""

    shards: list[MergeShard]
    forced: list[str]


class _KernelMetaKeys(TypedDict):
    started: str
    device: Device
    copy_bw_bytes_per_s: float
    baseline: str
    variants: list[VariantMeta]


class KernelMeta(_KernelMetaKeys, total=False):
    seconds: float
    configs: list[Opaque]
    call: CallFields  # absent in legacy documents: the exact call
    matrix: MatrixFields | None
    command: list[str]
    aborted: str
    not_measured: list[NotMeasured]
    kit: Kit  # absent in legacy documents
    merge: MergeInfo


class SampleInfo(TypedDict):
    """bench/sample.py's ``SampleSpec``: the draw a sampled run timed."""

    n: int
    seed: int
    max_kv_bytes: int
    distribution: Opaque
    instantiations: Opaque


class _SampleMetaKeys(KernelMeta):
    sample: SampleInfo


class SampleMeta(_SampleMetaKeys, total=False):
    twin_at: list[tuple[int, int, bool]]  # (head size, block size, in v1 too)
    twin_partial_groups: bool
    twin_least_guard: bool
    wave_guard: bool


class KernelDocument(TypedDict):
    """``bench kernel`` (and ``report --merge``)."""

    kind: Literal["kernel"]
    schema: int
    meta: KernelMeta
    results: list[ShapeRow]


class SampleDocument(TypedDict):
    """``bench kernel --sample N``: one row per sampled step, mode and timing."""

    kind: Literal["sample"]
    schema: int
    meta: SampleMeta
    results: list[ShapeRow]


# ----------------------------------------------------------------------------- repeats


class RepeatsVariant(TypedDict, total=False):
    run_medians: list[float]
    median: float
    min: float
    max: float
    slower_every_run: bool
    loss_beyond_aa: bool  # only with a control variant, and not for it


class RepeatsRow(TypedDict):
    mode: str
    preset: str
    dtype: str
    kv_cache_dtype: str
    block_size: int
    batch: int
    context: int
    kernel: str
    bitwise_equal_every_run: bool
    baseline_us: list[float]
    variants: dict[str, RepeatsVariant]


class RepeatsWorst(TypedDict):
    batch: int
    context: int
    median: float


class RepeatsSummary(TypedDict):
    variant: str
    shapes: int
    geomean_per_run: list[float | None]
    geomean_of_medians: float | None
    worst: RepeatsWorst
    slower_every_run: int
    loss_beyond_aa: int | None


class _RepeatsMetaKeys(TypedDict):
    runs: int
    baseline: str
    variants: list[str]
    started: list[str]
    device: Device


class RepeatsMeta(_RepeatsMetaKeys, total=False):
    sources: list[str]
    control: str | None
    aa_band: float | None  # None without a control variant
    command: list[str] | None


class RepeatsDocument(TypedDict):
    """``report --repeats``: repeated ``bench kernel`` runs of the same shapes read together."""

    kind: Literal["repeats"]
    schema: int
    meta: RepeatsMeta
    results: list[RepeatsRow]
    summary: list[RepeatsSummary]


# ----------------------------------------------------------------------------- decode


class StepMs(TypedDict, total=False):
    mean: float
    p50: float
    p99: float


class _DecodeTreeKeys(TypedDict):
    tokens_per_s: float
    ratio: Stats | None  # None: the baseline
    step_ms: StepMs
    attention_share: float | None
    bitwise_equal: bool | None  # None: the baseline


class DecodeTreeResult(_DecodeTreeKeys, total=False):
    time_ms: Stats


class _DecodeRowKeys(TypedDict):
    label: str
    batch: int
    context: int


class DecodeRow(_DecodeRowKeys, total=False):
    """One workload (a fixed batch x context point, or a serving trace); a skipped one has
    ``status`` skipped and its ``reason`` only."""

    steps: int
    requests: int
    dist: Opaque
    status: str
    reason: str
    steps_run: int
    tokens: int
    graph_steps: int
    kernels: dict[str, int]
    max_seq_len: int
    trees: dict[str, DecodeTreeResult]


class _DecodeModelKeys(TypedDict):
    name: str
    source: str
    layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype: str


class DecodeModel(_DecodeModelKeys, total=False):
    """bench/decode_model.py's ``DecoderConfig``."""

    tp: int
    qkv_bias: bool
    rms_eps: float
    rope_theta: float


class _DecodeConfigKeys(TypedDict):
    eager: bool
    repeats: int


class DecodeConfig(_DecodeConfigKeys, total=False):
    """bench/decode.py's ``DecodeBenchConfig``."""

    block_size: int
    max_model_len: int
    max_seq_len_to_capture: int  # absent in legacy documents: 8192
    memory_headroom: float
    profile_steps: int
    seed: int
    warmup_steps: int


class _DecodeMetaKeys(TypedDict):
    baseline: str
    trees: list[str]
    model: DecodeModel
    config: DecodeConfig
    device: Device
    started: str


class DecodeMeta(_DecodeMetaKeys, total=False):
    seconds: float
    command: list[str]


class DecodeDocument(TypedDict):
    """``bench decode``: whole-model decode throughput per workload and tree."""

    kind: Literal["decode"]
    schema: int
    meta: DecodeMeta
    results: list[DecodeRow]


# ----------------------------------------------------------------------------- ncu


class _NcuKernelKeys(TypedDict):
    kernel: str
    launches: int


class NcuKernel(_NcuKernelKeys, total=False):
    """One kernel family's mean metrics (bench/ncu.py's ``KernelSummary``; a metric ncu did not
    report is absent)."""

    time: float
    dram_read: float
    l2_hit: float
    long_sb_stall: float
    sm_throughput: float


class MetricChange(TypedDict):
    baseline: float | None
    variant: float | None
    change: float | None  # a ratio for time and bytes, a difference in points for percentages


class NcuDelta(TypedDict):
    """One kernel family present in the baseline and a variant (bench/ncu.py's ``deltas``)."""

    kernel: str
    launches: list[int]
    time: MetricChange
    dram_read: MetricChange
    l2_hit: MetricChange
    long_sb_stall: MetricChange
    sm_throughput: MetricChange
    speedup: float | None


class _NcuShapeKeys(ShapeFields):
    label: str
    variants: dict[str, list[NcuKernel]]
    deltas: dict[str, list[NcuDelta]]


class NcuShape(_NcuShapeKeys, total=False):
    csv: dict[str, str]


class _NcuOptionsKeys(TypedDict):
    launch_skip: int
    launch_count: int
    kernel_regex: str


class NcuOptionsFields(_NcuOptionsKeys, total=False):
    metrics: list[str]


class _NcuMetaKeys(TypedDict):
    started: str
    variants: list[str]
    options: NcuOptionsFields


class NcuMeta(_NcuMetaKeys, total=False):
    baseline: str
    ncu_example: list[str]
    command: list[str]


class NcuDocument(TypedDict):
    """``bench ncu``: Nsight Compute's per-kernel metrics and their deltas."""

    kind: Literal["ncu"]
    schema: int
    meta: NcuMeta
    shapes: list[NcuShape]


# ----------------------------------------------------------------------------- e2e


class _E2EEnvResultKeys(TypedDict):
    tokens_per_second: Stats
    output_tokens_per_second: Stats


class E2EEnvResult(_E2EEnvResultKeys, total=False):
    speedup: Stats | None  # absent for the baseline


class E2ERow(TypedDict):
    max_num_seqs: int
    num_prompts: int
    envs: dict[str, E2EEnvResult]


class _E2EEnvMetaKeys(TypedDict):
    name: str


class E2EEnvMeta(_E2EEnvMetaKeys, total=False):
    python: str
    vllm: str | None


class _E2ERunKeys(TypedDict):
    env: str
    max_num_seqs: int
    repeat: int


class E2ERunResult(_E2ERunKeys, total=False):
    """One ``vllm bench throughput`` run's own numbers, as it wrote them."""

    elapsed_time: float | None
    num_requests: int | None
    total_num_tokens: int | None
    requests_per_second: float | None
    tokens_per_second: float | None


class _E2EMetaKeys(TypedDict):
    started: str
    envs: list[E2EEnvMeta]
    environment: dict[str, str]
    input_len: int
    output_len: int
    repeats: int
    model_dir: str
    dtype: str


class E2EMeta(_E2EMetaKeys, total=False):
    baseline: str
    example_argv: list[str]
    command: list[str]


class _E2EDocumentKeys(TypedDict):
    kind: Literal["e2e"]
    schema: int
    meta: E2EMeta
    rows: list[E2ERow]


class E2EDocument(_E2EDocumentKeys, total=False):
    """``bench e2e``: ``vllm bench throughput`` per environment and --max-num-seqs."""

    runs: list[E2ERunResult]


# ----------------------------------------------------------------------------- identity


class IdentityRow(TypedDict):
    label: str
    kernel: str
    vllm_choice: str
    status: str
    bitwise_equal: bool | None
    rel_err: dict[str, float]
    problems: list[str]


class _IdentityKeys(TypedDict):
    kind: Literal["identity"]
    status: str
    variants: list[str]
    device: str
    checked: int
    failed: int
    not_checked: int
    rows: list[IdentityRow]


class IdentityDocument(_IdentityKeys, total=False):
    """``verify-kernel``'s numerical identity (verify/numerics.py; no ``schema``: version 1)."""

    schema: int
    passed: bool
    reason: str
    seed: int
    seconds: float
    max_rel_err: dict[str, float]
    tolerances: dict[str, float]
    builds: list[Opaque]


Document = (KernelDocument | SampleDocument | RepeatsDocument | DecodeDocument | NcuDocument
            | E2EDocument | IdentityDocument)
KernelLike = KernelDocument | SampleDocument  # a kernel run's document, sampled or not

DOCUMENT_TYPES: dict[str, type] = {
    "kernel": KernelDocument, "sample": SampleDocument, "repeats": RepeatsDocument,
    "decode": DecodeDocument, "ncu": NcuDocument, "e2e": E2EDocument,
    "identity": IdentityDocument}


def is_kernel(doc: Document) -> TypeGuard[KernelDocument]:
    """``doc`` is a ``bench kernel`` result (what ``--merge`` and ``--repeats`` read)."""
    return doc["kind"] == "kernel"
