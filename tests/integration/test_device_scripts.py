"""The H200 scripts (scripts/device/), run for real with bash on this machine, where no GPU
step can run: every script parses; run end to end with stand-ins for python3 and the GPU
tools, every kvprefetch command it issues is one the CLI accepts (its subcommand and options
exist) and every other module and test path it names exists; and the shared preamble
(lib.sh, begin_run) stops with exit 2 and a message naming the fix when the pinned sdist was
not carried, still handing back a results.tgz with the device record and the log (what the
device tool brings back)."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEVICE = ROOT / "scripts" / "device"
SCRIPTS = sorted(p.name for p in DEVICE.glob("*.sh") if p.name != "lib.sh")
USERS = sorted(name for name in SCRIPTS if "\nbegin_run " in (DEVICE / name).read_text())
# The CLIs built with click: `--help` after the arguments exits 0 only when every option
# before it exists (click parses them all before its eager --help).
CLICK_MODULES = ("kvprefetch", "kvprefetch.cli.bench")


def test_the_scripts_that_share_the_preamble_are_found() -> None:
    assert {"default-matrix.sh", "long-context.sh", "gpu-tests.sh"} <= set(USERS)


@pytest.mark.parametrize("script", ["lib.sh", *SCRIPTS])
def test_every_script_parses(script: str) -> None:
    bash = shutil.which("bash")
    assert bash is not None
    res = subprocess.run([bash, "-n", str(DEVICE / script)], capture_output=True, text=True,
                         check=False)
    assert res.returncode == 0, res.stderr


_STUB = """#!/bin/bash
# a stand-in: records its arguments (one record per call, written at once: calls made in
# parallel, as sass-identity.sh's builds, must not interleave) and succeeds doing nothing
rec=""
for a in "$@"; do rec+="$a"$'\\037'; done
printf '%s\\036' "$rec" >> "$STUB_CALLS"
exit 0
"""


def _carry_before_kit(tar: Path) -> None:
    """sass-identity.sh's .carry/before.tar, as `git archive` of a commit holds the kit: here
    the checkout's own src/kvprefetch, csrc/kvprefetch and patches."""
    with tarfile.open(tar, "w") as archive:
        for sub in ("src/kvprefetch", "csrc/kvprefetch", "patches"):
            archive.add(ROOT / sub, arcname=sub,
                        filter=lambda info: None if "__pycache__" in info.name else info)


def _calls_of(script: str, tmp_path: Path, **env_extra: str) -> list[list[str]]:
    """Run ``script`` in a copy of the checkout's scripts with the sdist "carried" (an empty
    file) and python3, nvidia-smi, nvcc and ncu replaced by a stub that records its argv;
    ``env_extra``: the script's own switches."""
    bash = shutil.which("bash")
    assert bash is not None
    root = tmp_path / "checkout"
    shutil.copytree(DEVICE, root / "scripts" / "device")
    (root / ".carry").mkdir()
    (root / ".carry" / "vllm-0.10.2.tar.gz").write_bytes(b"")
    _carry_before_kit(root / ".carry" / "before.tar")
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    calls = tmp_path / "calls"
    for tool in ("python3", "nvidia-smi", "nvcc", "ncu"):
        (stubs / tool).write_text(_STUB)
        (stubs / tool).chmod(0o755)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "KVPREFETCH_WORKDIR": str(tmp_path / "w"),
           "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}", "STUB_CALLS": str(calls),
           "BUDGET_S": "100000", **env_extra}
    res = subprocess.run([bash, f"scripts/device/{script}", str(tmp_path / "w")], cwd=root,
                         env=env, capture_output=True, text=True, timeout=120, check=False)
    assert calls.exists(), res.stdout[-2000:] + res.stderr[-2000:]
    return [rec.split("\x1f")[:-1] for rec in calls.read_text().split("\x1e") if rec]


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_issue_only_commands_the_cli_accepts(tmp_path: Path, script: str) -> None:
    calls = _calls_of(script, tmp_path)
    modules = [c for c in calls if len(c) >= 2 and c[0] == "-m"]
    assert any(c[1].startswith("kvprefetch") for c in modules), calls  # it does run the kit
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NO_COLOR": "1"}
    checked: set[tuple[str, ...]] = set()
    for _, module, *args in modules:
        if module == "pytest":
            for arg in args:
                if arg.startswith("tests/"):
                    assert glob.glob(str(ROOT / arg.split("::")[0])), (script, arg)
            continue
        assert importlib.util.find_spec(module) is not None, (script, module)
        if module not in CLICK_MODULES or (module, *args) in checked:
            continue
        checked.add((module, *args))
        res = subprocess.run([sys.executable, "-m", module, *args, "--help"], env=env,
                             capture_output=True, text=True, timeout=120, check=False)
        assert res.returncode == 0, (script, args, res.stderr[-1000:])


@pytest.mark.parametrize("script", USERS)
def test_missing_sdist_stops_with_the_fix_and_returns_the_log(tmp_path: Path, script: str) -> None:
    bash = shutil.which("bash")
    assert bash is not None
    root = tmp_path / "checkout"  # a checkout without .carry/
    shutil.copytree(DEVICE, root / "scripts" / "device")
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "KVPREFETCH_WORKDIR": str(tmp_path / "work")}
    res = subprocess.run([bash, f"scripts/device/{script}"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "missing .carry/vllm-0.10.2.tar.gz (carry it)" in res.stdout
    assert not (out / "results").exists()  # packed, then removed
    with tarfile.open(out / "results.tgz") as tgz:
        names = set(tgz.getnames())
        assert {"results/env.txt", "results/run.log"} <= names
        log = tgz.extractfile("results/run.log").read().decode()  # type: ignore[union-attr]
    assert "missing .carry" in log and log.rstrip().endswith("done")
    assert not (tmp_path / "work").exists()  # nothing was fetched or built


ALT_TREES = (("NOPDL", "nopdl", "KVPREFETCH_TWIN_PDL=0"),
             ("NOSTAGE", "nostage", "KVPREFETCH_TWIN_STAGE=0"),
             ("NOFUSE", "nofuse", "KVPREFETCH_TWIN_FUSE=0"),
             ("NOSPLIT", "nosplit", "KVPREFETCH_TWIN_STAGE_SPLIT=0"))


@pytest.mark.parametrize("on", [(), ("NOPDL",), ("NOSTAGE",), ("NOFUSE",), ("NOSPLIT",),
                                ("NOPDL", "NOSPLIT"), ("NOPDL", "NOSTAGE", "NOFUSE", "NOSPLIT")])
def test_alt_trees_add_each_tree_its_variant_and_its_define(on: tuple[str, ...]) -> None:
    """lib.sh's alt_trees (prefetch-repeat.sh and default-matrix.sh): each switch set to 1 times
    one earlier design beside the default (NOPDL=1 without programmatic dependent launch,
    NOSTAGE=1 without the twins' shared-memory ring, NOFUSE=1 without v2's reduction in the
    twin, NOSPLIT=1 with each staged warp's ring requested at once), each as one more tree built
    with its one define; without them nothing is added and the build gets no define."""
    bash = shutil.which("bash")
    assert bash is not None
    script = (f'source "{DEVICE / "lib.sh"}"; V=(--tree baseline); FETCH=(--with-paper); '
              "alt_trees; printf '%s\\n' \"${V[*]}\" \"${FETCH[*]}\" \"${ALT_DEF[*]}\"")
    env = {k: v for k, v in os.environ.items() if k not in {s for s, _, _ in ALT_TREES}}
    env.update({switch: "1" for switch in on})
    res = subprocess.run([bash, "-c", script], capture_output=True, text=True, check=True,
                         env=env)
    v, fetch, define = res.stdout.split("\n")[:3]
    want_v, want_fetch, want_def = ["--tree baseline"], ["--with-paper"], []
    for switch, tree, macro in ALT_TREES:
        if switch in on:
            want_v.append(f"--tree {tree}")
            want_fetch.append(f"--extra-tree {tree}")
            want_def.append(f"--tree-define {tree}:{macro}")
    assert (v, fetch, define) == (" ".join(want_v), " ".join(want_fetch), " ".join(want_def))


@pytest.mark.parametrize("script", ["prefetch-repeat.sh", "default-matrix.sh"])
def test_alt_trees_are_patched_and_built_with_their_define(
        tmp_path: Path, script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run for real with every switch on (and the trees "fetched"): each alternative tree gets
    the `prefetch` patch applied and the build gets its define."""
    for switch, _, _ in ALT_TREES:
        monkeypatch.setenv(switch, "1")
    for _, tree, _ in ALT_TREES:
        (tmp_path / "w" / "trees" / tree).mkdir(parents=True)
    calls = _calls_of(script, tmp_path)
    kit = [c[2:] for c in calls if c[:2] == ["-m", "kvprefetch"]]
    for _, tree, macro in ALT_TREES:
        assert ["apply", "--workdir", str(tmp_path / "w"), "--variant", "prefetch", "--tree",
                tree] in kit, tree
        (build,) = [c for c in kit if c[0] == "build"]
        assert f"{tree}:{macro}" in build, build


def test_summarize_prints_the_tables_or_says_none_was_measured(tmp_path: Path) -> None:
    """lib.sh's last step: the summary rows of the tables, or exit 6 naming BUDGET_S when the
    budget let no table run (a run cut short used to end with grep's bare exit 1)."""
    bash = shutil.which("bash")
    assert bash is not None
    results = tmp_path / "results"
    results.mkdir()
    script = (f'source "{DEVICE / "lib.sh"}"; R="{results}"; LOG="{tmp_path / "run.log"}"; '
              "BUDGET_S=235; summarize")
    none = subprocess.run([bash, "-c", script], capture_output=True, text=True, check=False)
    assert none.returncode == 6
    assert "no table measured: BUDGET_S=235" in none.stdout and "raise it" in none.stdout
    (results / "matrix.md").write_text("# bench\n\n## Summary\n\n| mode | variant |\n"
                                       "| cold | patched | 1.124x |\n")
    one = subprocess.run([bash, "-c", script], capture_output=True, text=True, check=False)
    assert one.returncode == 0 and "| cold | patched | 1.124x |" in one.stdout


def test_device_record_names_the_files_that_ran(tmp_path: Path) -> None:
    """env.txt's `tree` line: the git tree id of the checkout's files as copied (tracked and
    untracked, not ignored), in a REAL git repository. Clean, it is the commit's own tree; with
    an edit and a new file on top, it is the tree a commit of exactly those files gets; the
    repository's index and status are left as they were."""
    bash, git = shutil.which("bash"), shutil.which("git")
    assert bash is not None and git is not None
    repo = tmp_path / "repo"
    repo.mkdir()

    def g(*args: str) -> str:
        return subprocess.run([git, "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t",
                               *args], capture_output=True, text=True, check=True).stdout.strip()

    def tree_line() -> str:
        res = subprocess.run([bash, "-c", f'source "{DEVICE / "lib.sh"}"; device_env'], cwd=repo,
                             capture_output=True, text=True, check=False)
        (line,) = [ln for ln in res.stdout.splitlines() if ln.startswith("tree ")]
        return line.split()[1]

    g("init", "-q")
    (repo / ".gitignore").write_text("ignored/\n")
    (repo / "a.txt").write_text("a\n")
    g("add", "-A")
    g("commit", "-qm", "a")
    assert tree_line() == g("rev-parse", "HEAD^{tree}")

    (repo / "a.txt").write_text("a, edited\n")
    (repo / "b.txt").write_text("b\n")
    (repo / "ignored").mkdir()
    (repo / "ignored" / "big.bin").write_text("not part of the record\n")
    status = g("status", "--porcelain")
    got = tree_line()
    assert got != g("rev-parse", "HEAD^{tree}")
    assert g("status", "--porcelain") == status  # the index was not touched
    g("add", "-A")
    g("commit", "-qm", "b")
    assert got == g("rev-parse", "HEAD^{tree}")


def test_res_usage_records_each_trees_registers(tmp_path: Path) -> None:
    """lib.sh's res_usage on a REAL object: nvcc compiles a sample kernel for sm_90, a build
    manifest names it as a tree's library, and the results get that tree's
    `cuobjdump -res-usage` (registers per kernel), what decides how many CTAs fit an SM."""
    from kvprefetch.machine.toolchain import find_nvcc

    bash, nvcc = shutil.which("bash"), find_nvcc()
    assert bash is not None and nvcc is not None
    sample = Path(__file__).resolve().parents[1] / "samples" / "sass" / "pdl_order.cu"
    obj = tmp_path / "pdl_order.o"
    subprocess.run([str(nvcc), "-std=c++17", "-O2", "-gencode=arch=compute_90,code=sm_90", "-c",
                    "-o", str(obj), str(sample)], check=True, capture_output=True)
    build = tmp_path / "work" / "build" / "pdl" / "0123abcd"
    build.mkdir(parents=True)
    (build / "manifest.json").write_text(json.dumps({"build_so_path": str(obj)}))
    results = tmp_path / "results"
    results.mkdir()
    src = Path(__file__).resolve().parent.parent / "src"
    # lib.sh's python3 is the device's (torch, the nvidia wheels); here, this test's own
    env = {**os.environ, "PYTHONPATH": str(src),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    script = (f'source "{DEVICE / "lib.sh"}"; W="{tmp_path / "work"}"; R="{results}"; '
              f'LOG="{tmp_path / "run.log"}"; res_usage')
    res = subprocess.run([bash, "-c", script], env=env, capture_output=True, text=True,
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    text = (results / "res-usage-pdl.txt").read_text()
    assert "Function" in text and re.search(r"REG:\d+", text), text


def test_sample_without_attribution_times_three_trees(tmp_path: Path) -> None:
    """sample.sh with ATTRIBUTION=0 wants builds of baseline, patched and control only (what
    its build check asks for; the stub says they exist, so fetch, apply and build are skipped)
    and times those three on the seed it runs, with no launch or gqa_off tree, the last seed
    (which otherwise times all five) included."""
    calls = _calls_of("sample.sh", tmp_path, ATTRIBUTION="0", SAMPLE_SEEDS="7")
    ready = next(c for c in calls if c[:1] == ["-"])  # builds_ready's python3 - W TREES ...
    assert ready[2] == "baseline,patched,control"
    bench = [c for c in calls if c[:3] == ["-m", "kvprefetch.cli.bench", "kernel"]]
    assert len(bench) == 1 and bench[0][bench[0].index("--sample-seed") + 1] == "7"
    variants = [bench[0][i + 1] for i, a in enumerate(bench[0]) if a == "--variant"]
    assert variants == ["baseline", "patched", "control"]


def test_sass_identity_without_the_before_kit_stops_with_the_fix(tmp_path: Path) -> None:
    """sass-identity.sh with the sdist carried but not .carry/before.tar: exit 2 naming how to
    make it, nothing fetched or built, the log handed back."""
    bash = shutil.which("bash")
    assert bash is not None
    root = tmp_path / "checkout"
    shutil.copytree(DEVICE, root / "scripts" / "device")
    (root / ".carry").mkdir()
    (root / ".carry" / "vllm-0.10.2.tar.gz").write_bytes(b"")
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "KVPREFETCH_WORKDIR": str(tmp_path / "work")}
    res = subprocess.run([bash, "scripts/device/sass-identity.sh"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "missing .carry/before.tar (git archive -o .carry/before.tar BEFORE_COMMIT" \
        in res.stdout
    with tarfile.open(out / "results.tgz") as tgz:
        log = tgz.extractfile("results/run.log").read().decode()  # type: ignore[union-attr]
    assert "missing .carry/before.tar" in log and log.rstrip().endswith("done")
    assert not (tmp_path / "work").exists()


def test_sass_identity_builds_every_part_before_and_after(tmp_path: Path) -> None:
    """sass-identity.sh's builds (python3 a stand-in): each part is fetched, patched and built
    in its own work dir once with the BEFORE kit (PYTHONPATH: the unpacked before.tar) and once
    with the checkout's, and the default parts cover the full set, each (head, block) once."""
    calls = _calls_of("sass-identity.sh", tmp_path)
    builds = [c for c in calls if c[:3] == ["-m", "kvprefetch", "build"] and "--dry-run" not in c]
    parts = {(c[c.index("--head-sizes") + 1], c[c.index("--block-sizes") + 1]) for c in builds}
    assert len(builds) == 2 * len(parts)
    covered = [(h, b) for heads, blocks in parts for h in heads.split(",")
               for b in blocks.split(",")]
    from kvprefetch.kernels.selection import BLOCK_SIZES, HEAD_SIZES

    assert sorted(covered) == sorted((str(h), str(b)) for h in HEAD_SIZES for b in BLOCK_SIZES)
    workdirs = {c[c.index("--workdir") + 1] for c in builds}
    assert len(workdirs) == len(builds)  # one work dir each, so that they run at once


_SASS = """
Fatbin elf code:
================
arch = sm_90
code version = [1,8]
host = linux
compile_size = 64bit

\tcode for sm_90
\t.target\tsm_90

\t\tFunction : _ZN10kvprefetch54_GLOBAL__N__{id}_21_paged_attention_v1_cu_{id2}17gqa_decode_kernelILi1EEEvv
\t.headerflags\t@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;          /* 0x00000a00ff017b82 */
                                                                   /* 0x000ff00000000800 */
        /*0010*/                   {insn} ;                        /* 0x000000000000794d */
\t\t..........

\t\tFunction : _ZN4vllm25paged_attention_v1_kernelIttLi128EEEvv
\t.headerflags\t@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   EXIT ;                          /* 0x000000000000794d */
"""  # noqa: E501
_RES = """
Resource usage:
 Common:
  GLOBAL:0
 Function _ZN10kvprefetch54_GLOBAL__N__{id}_21_paged_attention_v1_cu_{id2}17gqa_decode_kernelILi1EEEvv:
  REG:{reg} STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:600 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _ZN4vllm25paged_attention_v1_kernelIttLi128EEEvv:
  REG:96 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:600 TEXTURE:0 SURFACE:0 SAMPLER:0
"""  # noqa: E501


def _identity(tmp_path: Path, after: dict[str, str], baseline: str = "k:k") -> tuple[int, dict]:
    """scripts/device/sass_identity.py on two fake libraries (a stand-in cuobjdump prints the
    saved dumps): BEFORE with one anonymous-namespace id, AFTER with another and ``after``'s
    changes."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    libs = {}
    for side, fields in (("before", {}), ("after", after)):
        f = {"id": "050cff80", "id2": "d115ef7d", "insn": "EXIT", "reg": "40"}
        if side == "after":
            f.update({"id": "17b9506e", "id2": "fcde414e"}, **fields)
        so = tmp_path / f"{side}.so"
        so.write_text("")
        (tmp_path / f"{side}.so.sass").write_text(_SASS.format(**f))
        (tmp_path / f"{side}.so.res").write_text(_RES.format(**f))
        libs[side] = so
    tool = tmp_path / "cuobjdump"
    tool.write_text('#!/bin/bash\ncase "$1" in -sass) cat "$2.sass";; '
                    '-res-usage) cat "$2.res";; *) exit 9;; esac\n')
    tool.chmod(0o755)
    results = tmp_path / "results"
    res = subprocess.run([sys.executable, str(DEVICE / "sass_identity.py"), "--results",
                          str(results), "--dumps", str(tmp_path / "dumps"), "--cuobjdump",
                          str(tool), "--kv", "fp16", "--full-heads", "128", "--full-blocks", "16",
                          "--full-kv", "fp16", "--baseline-keys", baseline,
                          f"h128_b16=128:16:{libs['before']}:{libs['after']}"],
                         capture_output=True, text=True, check=False, timeout=60)
    assert (results / "summary.md").is_file(), res.stderr
    return res.returncode, json.loads((results / "summary.json").read_text())


def test_sass_identity_compares_every_function_and_names_each_difference(tmp_path: Path) -> None:
    """The comparison: builds whose code is the same are identical although cudafe++ gave their
    anonymous namespaces different ids (exit 0, the full set when the parts cover it); a changed
    instruction, a changed register count or a changed baseline build key is listed and exits 1;
    a part without its library is "not built", exit 3."""
    rc, same = _identity(tmp_path / "same", {})
    assert rc == 0 and same["full_set"] and not same["differences"]
    assert (same["functions_compared"], same["identical"]) == (2, 2)
    assert (same["res_usage_compared"], same["res_usage_identical"]) == (3, 3)
    rc, insn = _identity(tmp_path / "insn", {"insn": "NOP"})
    assert rc == 1 and [d["what"] for d in insn["differences"]] == ["sass"]
    assert "gqa_decode_kernel" in insn["differences"][0]["function"]
    assert "EXIT" in insn["differences"][0]["detail"] and "NOP" in insn["differences"][0]["detail"]
    rc, reg = _identity(tmp_path / "reg", {"reg": "41"})
    assert rc == 1 and [d["what"] for d in reg["differences"]] == ["res-usage"]
    rc, base = _identity(tmp_path / "base", {}, baseline="k1:k2")
    assert rc == 1 and [d["what"] for d in base["differences"]] == ["build key"]
    rc, _ = _identity(tmp_path / "gone", {})
    assert rc == 0
    (tmp_path / "gone" / "after.so").unlink()
    res = subprocess.run([sys.executable, str(DEVICE / "sass_identity.py"), "--results",
                          str(tmp_path / "gone" / "r2"), "--cuobjdump", "cuobjdump", "--kv",
                          "fp16", "--full-heads", "128", "--full-blocks", "16", "--full-kv",
                          "fp16", (f"h128_b16=128:16:{tmp_path / 'gone' / 'before.so'}:"
                                   f"{tmp_path / 'gone' / 'after.so'}")],
                         capture_output=True, text=True, check=False, timeout=60)
    assert res.returncode == 3
    assert json.loads((tmp_path / "gone" / "r2" / "summary.json").read_text())["not_built"] == [
        "h128_b16"]
