"""``bench e2e``: ``vllm bench throughput`` in each overlay or full-build environment, through the
V0 engine and the XFORMERS backend (``VLLM_USE_V1=0``, ``VLLM_ATTENTION_BACKEND=XFORMERS``), so
decode goes through ``PagedAttention.forward_decode`` and the paged_attention kernels. Without those
two variables vLLM 0.10.2 runs V1, which never calls the patched kernel (research notes section 3).

Nothing is downloaded: the model is a Llama-3.1-8B-shaped ``config.json`` written by
``write_model_dir`` with ``--load-format dummy`` (random weights), and a word-level tokenizer
generated beside it (one token per id, the model's full vocabulary, so any sampled id decodes).
``--tokenizer PATH`` uses a real local tokenizer instead.

The sweep: for each ``--max-num-seqs``, ``repeats`` runs per environment, the environments'
order alternating between repeats. It refuses to run unless ``verify-kernel`` passed for those
environments (``<workdir>/verify/report.json`` with ``"passed": true``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BenchError
from ..reading import load_json
from .e2e_folders import refuse_foreign_vllm_folders
from .schema import SCHEMA_VERSION, E2EDocument, E2EEnvResult, E2ERow, E2ERunResult
from .stats import summarize

# meta-llama/Llama-3.1-8B config.json (the attention and model shape the seed benchmarked).
LLAMA_31_8B_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 128256,
}
SPECIAL_TOKENS = {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128002: "<unk>"}
E2E_ENV = {"VLLM_USE_V1": "0", "VLLM_ATTENTION_BACKEND": "XFORMERS"}
# Python's isolated mode for the environments' pythons: `-c` and `-m` put their working folder
# first on sys.path, and that folder is in the output folder (``<workdir>/bench`` by default),
# so a `vllm/` planted there was imported in place of the environment's vLLM, by the check
# that each imports vllm and by every run (issue 41, the twenty-third hostile pass). `-I` (any
# Python 3) leaves it out, with the user's site-packages and PYTHON* variables (PYTHONPATH and
# PYTHONHOME are stripped anyway).
PYTHON_ISOLATED = ("-I",)
# Stripped from the child: they break isolation or silently swap in other binaries.
STRIP_ENV = ("PYTHONPATH", "PYTHONHOME", "VLLM_USE_PRECOMPILED", "VLLM_PRECOMPILED_WHEEL_LOCATION",
             "VIRTUAL_ENV", "CONDA_PREFIX")


def tokenizer_json(vocab_size: int) -> dict[str, Any]:
    """A word-level tokenizer: id ``i`` is the word ``t<i>``, whitespace-split, so decoding a
    random id sequence and encoding it again gives the same ids (what vLLM's random dataset
    does, datasets.py ``generate_token_sequence``)."""
    vocab = {SPECIAL_TOKENS.get(i, f"t{i}"): i for i in range(vocab_size)}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i, s in sorted(SPECIAL_TOKENS.items()) if i < vocab_size],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": SPECIAL_TOKENS[128002]
                  if vocab_size > 128002 else "t0"},
    }


def write_model_dir(dest: Path, config: Mapping[str, Any] = LLAMA_31_8B_CONFIG) -> Path:
    """Write ``config.json``, ``tokenizer.json``, ``tokenizer_config.json`` and
    ``generation_config.json`` (files rewritten only when their content changes)."""
    from ..workspace.confine import root_of, write_if_changed
    from .plan import make_dir

    make_dir(dest)  # in the work directory (models/): from it down, never through a link
    vocab = int(config["vocab_size"])
    unk = SPECIAL_TOKENS[128002] if vocab > 128002 else "t0"
    files = {
        "config.json": dict(config),
        "tokenizer.json": tokenizer_json(vocab),
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": SPECIAL_TOKENS[128000] if vocab > 128000 else None,
            "eos_token": SPECIAL_TOKENS[128001] if vocab > 128001 else None,
            "unk_token": unk, "model_max_length": int(config.get("max_position_embeddings", 8192)),
            "clean_up_tokenization_spaces": False,
        },
        "generation_config.json": {"bos_token_id": config.get("bos_token_id"),
                                   "eos_token_id": config.get("eos_token_id")},
    }
    for name, content in files.items():
        text = json.dumps(content, indent=1 if name != "tokenizer.json" else None) + "\n"
        write_if_changed(dest / name, text, root=root_of(dest), family=BenchError)
    return dest


@dataclass(frozen=True)
class E2EEnv:
    name: str
    python: Path


@dataclass(frozen=True)
class E2EPlan:
    envs: tuple[E2EEnv, ...]
    model_dir: Path
    out_dir: Path
    tokenizer: Path | None = None
    max_num_seqs: tuple[int, ...] = (8, 32, 128)
    repeats: int = 3
    input_len: int = 512
    output_len: int = 512
    prompts_per_seq: int = 2
    min_prompts: int = 8
    dtype: str = "float16"
    max_model_len: int | None = None
    extra_args: tuple[str, ...] = field(default=())

    def num_prompts(self, max_num_seqs: int) -> int:
        return max(self.min_prompts, self.prompts_per_seq * max_num_seqs)


@dataclass(frozen=True)
class E2ERun:
    env: E2EEnv
    max_num_seqs: int
    repeat: int
    json_path: Path
    argv: tuple[str, ...]


def e2e_environ(base: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in STRIP_ENV}
    env.update(E2E_ENV)
    return env


def throughput_argv(plan: E2EPlan, env: E2EEnv, max_num_seqs: int, json_path: Path) -> list[str]:
    # -I: the run's folder (its cwd, in the output folder) is not put on sys.path (PYTHON_ISOLATED)
    argv = [str(env.python), *PYTHON_ISOLATED, "-m", "vllm.entrypoints.cli.main", "bench",
            "throughput",
            "--model", str(plan.model_dir), "--tokenizer", str(plan.tokenizer or plan.model_dir),
            "--load-format", "dummy", "--dataset-name", "random",
            "--input-len", str(plan.input_len), "--output-len", str(plan.output_len),
            "--num-prompts", str(plan.num_prompts(max_num_seqs)),
            "--max-num-seqs", str(max_num_seqs), "--dtype", plan.dtype, "--seed", "0",
            "--output-json", str(json_path)]
    if plan.max_model_len:
        argv += ["--max-model-len", str(plan.max_model_len)]
    return argv + list(plan.extra_args)


def plan_runs(plan: E2EPlan) -> list[E2ERun]:
    """Every run in execution order: per max-num-seqs, per repeat, all envs, the order of the
    envs reversed on every other repeat (ABBA) so drift does not favour one env."""
    runs = []
    for m in plan.max_num_seqs:
        for r in range(plan.repeats):
            order = list(plan.envs) if r % 2 == 0 else list(reversed(plan.envs))
            for env in order:
                path = plan.out_dir / "runs" / f"{env.name}-seqs{m}-r{r}.json"
                runs.append(E2ERun(env, m, r, path, tuple(throughput_argv(plan, env, m, path))))
    return runs


def verified_envs(report: Mapping[str, Any], path: Path | str = "the verify-kernel report"
                  ) -> dict[str, str | None]:
    """Names (and pythons, where recorded) of the envs a verify report covers. verify-kernel
    writes ``envs`` as tree -> provenance probe (``executable``), plus non-env notes such as a
    ``warning`` string, which are skipped; lists of names or of ``{name|tree, python}`` work too.

    The report is data read back from the work directory (or ``--verify-report``): ``envs``
    that is no object or list, or a python that is no plain path (a number, a list, a NUL),
    is a BenchError naming the report. They were a TypeError traceback (``for e in 5``,
    ``Path(5)``) or subprocess's ValueError (embedded null byte) in `bench e2e`, its dry run
    too (issue 41, the seventeenth hostile pass)."""
    envs = report.get("envs") or {}
    out: dict[str, str | None] = {}
    if isinstance(envs, Mapping):
        for name, info in envs.items():
            if isinstance(info, Mapping):
                out[_env_name(name, path)] = _python_of(info.get("python")
                                                        or info.get("executable"), path)
    elif isinstance(envs, list):
        for e in envs:
            if isinstance(e, Mapping):
                name = e.get("name") or e.get("tree")
                if name:
                    out[_env_name(name, path)] = _python_of(e.get("python"), path)
            else:
                out[_env_name(e, path)] = None
    else:
        raise _malformed(path, f"its `envs` is {type(envs).__name__}, not an object or a list")
    return out


def _malformed(path: Path | str, why: str) -> BenchError:
    return BenchError(f"the verify-kernel report {path} is malformed: {why}",
                      "run `kvprefetch verify-kernel` again to rewrite it (or pass the "
                      "--verify-report it wrote)")


def _env_name(name: Any, path: Path | str) -> str:
    """An environment's name as listed: text (a number is taken as its digits)."""
    if isinstance(name, bool) or not isinstance(name, (str, int)):
        raise _malformed(path, f"an environment's name is {type(name).__name__}, not text")
    # the name begins the file names of its runs (runs/<name>-seqs<M>-r<R>.json and .log):
    # `../../../../x` had the kit make folders and append its log outside the output folder,
    # and hand vLLM an --output-json there (issue 41, the twenty-third hostile pass)
    if not _plain_name(str(name)):
        raise _malformed(path, f"an environment's name {_shown(str(name))} is not a plain name "
                         "(it names files of its runs: no folders, no control characters, at "
                         f"most {MAX_NAME_BYTES} bytes)")
    return str(name)


# An environment's name begins each run's file names (``<name>-seqs<M>-r<R>.json``/``.log``),
# which must fit Linux's 255 bytes in one name: a 250-byte name in the verify report ran the
# first environment's benchmark, then failed on the next one's log with "File name too long /
# use a shorter path ... (the --workdir, -o/--out or campaign folder that named it)", the
# user sent to the folder they typed (issue 41, the twenty-fourth hostile pass).
MAX_NAME_BYTES = 200


def _plain_name(name: str) -> bool:
    """Whether ``name`` can begin a file name in the runs' folder (``plan.check_output_name``'s
    rule: no folder, no control character; and at most ``MAX_NAME_BYTES``)."""
    from ..errors import OptionError
    from .plan import check_output_name

    try:
        check_output_name(name)
    except OptionError:
        return False
    return len(name.encode("utf-8", "surrogatepass")) <= MAX_NAME_BYTES


def _python_of(python: Any, path: Path | str) -> str | None:
    """An environment's python as recorded: none, or a path with no NUL or control character
    (a path bench e2e runs)."""
    if python is None:
        return None
    if not isinstance(python, str) or any(ord(c) < 32 or ord(c) == 127 for c in python):
        raise _malformed(path, f"an environment's python is {_shown(python)}, not a path")
    return python


def _shown(value: Any) -> str:
    """A bad value as a message shows it: its type, or the text escaped and cut."""
    if not isinstance(value, str):
        return f"{type(value).__name__}"
    return repr(value[:80]) + ("..." if len(value) > 80 else "")


def require_verified(report_path: Path, env_names: Sequence[str]) -> dict[str, str | None]:
    """Refuse unless ``report_path`` says verify-kernel passed for every one of ``env_names``."""
    fix = "run `kvprefetch verify-kernel` for these environments and fix what it reports"
    try:
        report = load_json(report_path)
    except FileNotFoundError:
        raise BenchError(f"no verify-kernel report at {report_path}", fix) from None
    except (OSError, ValueError) as exc:
        raise BenchError(f"cannot read the verify-kernel report {report_path}: {exc}", fix) from exc
    if not isinstance(report, dict):
        raise BenchError(f"the verify-kernel report {report_path} is not a JSON object", fix)
    if report.get("passed") is not True:
        raise BenchError(f"the verify-kernel report {report_path} does not say passed", fix)
    covered = verified_envs(report, report_path)
    missing = [n for n in env_names if n not in covered]
    if missing:
        raise BenchError(f"verify-kernel did not check environment(s) {', '.join(missing)} "
                         f"(it covers: {', '.join(covered) or 'none'})", fix)
    return covered


def parse_env_specs(specs: Sequence[str], verified: Mapping[str, str | None],
                    workdir: Path | None = None) -> tuple[E2EEnv, ...]:
    """``NAME=PYTHON`` options; without any, the envs (with pythons) the verify report lists,
    each of which must be one of ``workdir``'s own environments: the report is data read back,
    and one naming ``/tmp/x/evil`` had `bench e2e` run it (issue 41, the thirty-first hostile
    pass). A python the user names with ``--env`` is the user's instruction."""
    envs: list[E2EEnv] = []
    for spec in specs:
        name, sep, py = spec.partition("=")
        if not sep or not name or not py:
            raise BenchError(f"--env '{spec}' is not NAME=PYTHON",
                             "e.g. --env baseline=kvprefetch-work/envs/baseline/bin/python")
        envs.append(E2EEnv(name, Path(py)))
    if not envs:
        from ..verify.manifests import python_problem

        for n, p in verified.items():
            problem = (python_problem(p, Path(os.path.abspath(workdir)))
                       if p and workdir is not None else None)
            if problem is not None:
                raise BenchError(f"the verify-kernel report's environment {n!r} {problem}; "
                                 "kvprefetch runs no program a record names outside its "
                                 "environments",
                                 "run `kvprefetch verify-kernel` on this work directory again, "
                                 "or name the environments yourself with --env NAME=PYTHON")
        envs = [E2EEnv(n, Path(p)) for n, p in verified.items() if p]
    if len(envs) < 2:
        raise BenchError("bench e2e needs two environments (baseline first)",
                         "pass --env baseline=PYTHON --env patched=PYTHON")
    return tuple(envs)


def collect(results: Sequence[tuple[E2ERun, Mapping[str, Any]]], plan: E2EPlan) -> list[E2ERow]:
    """One row per max-num-seqs: per env the median (and spread) of tokens/s and output
    tokens/s over repeats, and each env's speedup over the first env, paired per repeat."""
    rows: list[E2ERow] = []
    base = plan.envs[0].name
    for m in plan.max_num_seqs:
        per_env: dict[str, dict[int, Mapping[str, Any]]] = {}
        for run, res in results:
            if run.max_num_seqs == m:
                per_env.setdefault(run.env.name, {})[run.repeat] = res
        row: E2ERow = {"max_num_seqs": m, "num_prompts": plan.num_prompts(m), "envs": {}}
        for env in plan.envs:
            reps = per_env.get(env.name, {})
            if not reps:
                continue
            tps = [float(r["tokens_per_second"]) for r in reps.values()]
            out_tps = [float(r["num_requests"]) * plan.output_len / float(r["elapsed_time"])
                       for r in reps.values()]
            entry: E2EEnvResult = {"tokens_per_second": summarize(tps).to_dict(),
                                   "output_tokens_per_second": summarize(out_tps).to_dict()}
            if env.name != base and base in per_env:
                common = sorted(set(reps) & set(per_env[base]))
                ratios = [float(reps[i]["tokens_per_second"])
                          / float(per_env[base][i]["tokens_per_second"]) for i in common]
                entry["speedup"] = summarize(ratios).to_dict() if ratios else None
            row["envs"][env.name] = entry
        rows.append(row)
    return rows


def check_envs_have_vllm(envs: Sequence[E2EEnv], cwd: Path) -> dict[str, str]:
    """Each env's python must import vllm (from a neutral cwd); returns name -> vLLM version."""
    from ..runner import run

    versions = {}
    for env in envs:
        res = run([str(env.python), *PYTHON_ISOLATED, "-c",
                   "import vllm; print(vllm.__version__)"], cwd=cwd,
                  env=e2e_environ(os.environ), echo=False, check=False)
        if res.returncode != 0:
            raise BenchError(f"{env.name}: {env.python} cannot import vllm: "
                             f"{res.output.strip().splitlines()[-1:] or ''}",
                             "bench e2e needs environments with vLLM: `kvprefetch build --mode "
                             "overlay` (or a full build), not --kernels-only; pass --env "
                             "NAME=PYTHON of those environments")
        versions[env.name] = res.output.strip().splitlines()[-1]
    return versions


def run_e2e(plan: E2EPlan, *, progress: Callable[[str], None] | None = None,
            command: Sequence[str] = ()) -> E2EDocument:
    """Execute the plan (each run from a neutral working directory) and build the document."""
    from ..runner import run

    say = progress or (lambda m: None)
    if os.environ.get("KVPREFETCH_OVERLAY", "").strip().lower() in ("off", "0", "false", "no"):
        raise BenchError("KVPREFETCH_OVERLAY is off: every overlay environment would run vLLM's "
                         "own kernels, so the A/B would compare stock with stock",
                         "unset KVPREFETCH_OVERLAY (it is for an A/B inside one environment)")
    from .plan import make_dir

    env = e2e_environ(os.environ)
    refuse_foreign_vllm_folders(env)
    make_dir(plan.out_dir)
    versions = check_envs_have_vllm(plan.envs, plan.out_dir)
    results = []
    runs = plan_runs(plan)
    from ..workspace.confine import root_of
    from ..workspace.ownership import private_dir

    # vLLM writes --output-json by path, following a link there: a link (or hard link) planted
    # at runs/<env>-seqs<M>-r<R>.json in the work directory had vLLM write its result into the
    # file outside it names (issue 41, the thirty-third hostile pass, as for ncu's CSV). So
    # vLLM writes into a private folder, and the kit copies the result into place
    with private_dir("e2e", outside=root_of(plan.out_dir)) as priv:
        for i, r in enumerate(runs, 1):
            make_dir(r.json_path.parent)
            t0 = time.monotonic()
            argv = list(r.argv)
            written = priv / r.json_path.name
            argv[argv.index("--output-json") + 1] = str(written)
            run(argv, env=env, cwd=r.json_path.parent, log=r.json_path.with_suffix(".log"))
            _keep(written, r.json_path)
            res = _throughput(r.json_path)
            results.append((r, res))
            say(f"[{i}/{len(runs)}] {r.env.name} max-num-seqs {r.max_num_seqs} repeat "
                f"{r.repeat}: {float(res['tokens_per_second']):.0f} tok/s "
                f"({time.monotonic() - t0:.0f} s)")
    return {
        "kind": "e2e", "schema": SCHEMA_VERSION,
        "meta": {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "baseline": plan.envs[0].name,
                 "envs": [{"name": e.name, "python": str(e.python),
                           "vllm": versions.get(e.name)} for e in plan.envs],
                 "environment": E2E_ENV, "input_len": plan.input_len,
                 "output_len": plan.output_len, "repeats": plan.repeats,
                 "model_dir": str(plan.model_dir), "dtype": plan.dtype,
                 "example_argv": list(runs[0].argv) if runs else [], "command": list(command)},
        "rows": collect(results, plan),
        "runs": [_run_result(r, res) for r, res in results],
    }


_THROUGHPUT_FIELDS = ("tokens_per_second", "num_requests", "elapsed_time")
# tokens per second, requests and seconds of one run: far beyond any GPU's, and far below
_THROUGHPUT_MIN, _THROUGHPUT_MAX = 1e-9, 1e12


def _keep(written: Path, path: Path) -> None:
    """What vLLM wrote at ``written`` (a private folder), copied to ``path`` (``confine
    .write_file``: never through a link there); a BenchError naming ``path`` when it wrote
    nothing readable."""
    from ..reading import read_limited
    from ..workspace.confine import root_of, write_file

    try:
        data = read_limited(written)
    except (OSError, ValueError) as exc:
        raise BenchError(f"vLLM left no throughput result for {path} ({exc})",
                         f"read the run's log {path.with_suffix('.log')}; rerun bench e2e "
                         "once vLLM works") from None
    write_file(path, data, root=root_of(path), family=BenchError)


def _throughput(path: Path) -> dict[str, Any]:
    """What ``vllm bench throughput`` wrote (``--output-json``): a JSON object whose
    ``tokens_per_second``, ``num_requests`` and ``elapsed_time`` are numbers from 1e-9 to 1e12,
    read as every record is (a regular file, bounded), or a BenchError naming the file. The
    environment's vLLM, like the work directory it lives in, is data to this reader: a file
    lacking a field, with text or a list there, or an elapsed time of 0 was a KeyError,
    ValueError, TypeError or ZeroDivisionError traceback (issue 41, the seventeenth hostile
    pass)."""
    fix = f"read the run's log {path.with_suffix('.log')}; rerun bench e2e once vLLM works"
    try:
        res = load_json(path)
    except (OSError, ValueError) as exc:
        raise BenchError(f"cannot read vLLM's throughput result {path}: {exc}", fix) from None
    if not isinstance(res, dict):
        raise BenchError(f"vLLM's throughput result {path} is no JSON object", fix)
    for k in _THROUGHPUT_FIELDS:
        v = res.get(k)
        # compared, never converted: math.isfinite of a 400-digit integer was an
        # OverflowError traceback; NaN fails the comparison. The bounds keep the rates and
        # ratios made of these finite: 1.7e308 tokens over 5e-324 s was infinity, which the
        # plot refused with a message blaming matplotlib (issue 41, the eighteenth pass)
        if isinstance(v, bool) or not isinstance(v, (int, float)) \
                or not _THROUGHPUT_MIN <= v <= _THROUGHPUT_MAX:
            raise BenchError(f"vLLM's throughput result {path} has no number from "
                             f"{_THROUGHPUT_MIN:g} to {_THROUGHPUT_MAX:g} at `{k}` "
                             f"({json.dumps(v)[:40]})", fix)
    return res


def _run_result(run: E2ERun, res: Mapping[str, Any]) -> E2ERunResult:
    """One run's own numbers, as ``vllm bench throughput`` wrote them (None where it did not)."""
    return {"env": run.env.name, "max_num_seqs": run.max_num_seqs, "repeat": run.repeat,
            "elapsed_time": res.get("elapsed_time"), "num_requests": res.get("num_requests"),
            "total_num_tokens": res.get("total_num_tokens"),
            "requests_per_second": res.get("requests_per_second"),
            "tokens_per_second": res.get("tokens_per_second")}
