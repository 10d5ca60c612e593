"""`kvprefetch apply`, `diff-upstream` and `export-header` on the REAL vLLM 0.10.2 sources
(trees made by the real sdist fetch, see the ``fetched_workdir`` fixture)."""

from __future__ import annotations

import difflib
import json
import os
import re
from pathlib import Path

import pytest

from kvprefetch import upstream
from kvprefetch.errors import ConfigError, PatchError
from kvprefetch.hashing import sha256_file
from kvprefetch.kernels import policy
from kvprefetch.sources.fetch import tree_modifications
from kvprefetch.sources.patching import apply_patch, carried_variant, patch_sha256
from kvprefetch.workspace import ownership
from kvprefetch.workspace.workdir import Workdir
from tests.integration.helpers import copy_workdir, kvprefetch_cli_split, tree_bytes

KIT_DIR = Path(__file__).resolve().parents[2] / "csrc" / "kvprefetch"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "KVPREFETCH_WORKDIR"}


def cli(*args: str):
    return kvprefetch_cli_split(*args, env=_env())


def _patch_files_touched(variant: str) -> list[str]:
    """The upstream paths the variant's diffs name (read from the .patch files themselves)."""
    out = set()
    for p in upstream.patch_files(variant):
        for line in p.read_text().splitlines():
            if line.startswith("+++ b/"):
                out.add(line[len("+++ b/"):].strip())
    return sorted(out)


@pytest.fixture(scope="module")
def shared_fetched(tmp_path_factory: pytest.TempPathFactory, fetched_template: Path) -> Path:
    """A fetched work directory shared by the tests below that must not change it (each one
    proves that with a byte inventory, or writes only outside it)."""
    wd = tmp_path_factory.mktemp("shared") / "work"
    copy_workdir(fetched_template, wd)
    return wd


def _bytes(workdir: Path) -> dict[str, str]:
    """Every file of the work directory, byte for byte, except the (empty) lock files that
    `apply` takes next to a tree even when it then refuses or only dry-runs."""
    return {k: v for k, v in tree_bytes(workdir).items() if not k.endswith(".lock")}


def _plus_lines(variant: str) -> int:
    return sum(1 for p in upstream.patch_files(variant) for ln in p.read_text().splitlines()
               if ln.startswith("+") and not ln.startswith("+++"))


def test_apply_to_the_real_header_then_reapply_is_a_no_op(fetched_workdir: Path) -> None:
    wd = Workdir(fetched_workdir)
    tree = wd.tree("patched")
    pristine_inv = tree_bytes(tree)
    res = cli("apply", "--workdir", str(fetched_workdir), "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["tree"] == "patched" and data["variant"] == "prefetch"
    assert data["action"] == "applied" and data["patch_sha256"] == patch_sha256("prefetch")
    touched = _patch_files_touched("prefetch")
    assert upstream.ATTENTION_HEADER in touched
    assert sorted(data["files"]) == sorted(touched + list(upstream.KIT_HEADERS_IN_TREE))

    header = (tree / upstream.ATTENTION_HEADER).read_text()
    assert sha256_file(tree / upstream.ATTENTION_HEADER) != upstream.ATTENTION_HEADER_SHA256
    assert '#include "kvprefetch/prefetch.cuh"' in header
    assert header.count("kvprefetch::prefetch_prologue<") == 1  # one site, before the block loop
    for ours, in_tree in upstream.kit_headers():  # every one of the kit's headers, byte for byte
        assert (tree / in_tree).read_bytes() == ours.read_bytes()
    assert carried_variant(tree) == "prefetch"
    # only the patched files and the kit's headers changed; everything else is byte-identical
    after = tree_bytes(tree)
    changed = sorted(k for k in after if after.get(k) != pristine_inv.get(k))
    assert changed == sorted(touched + list(upstream.KIT_HEADERS_IN_TREE))
    state = wd.read_state("patched")
    assert state is not None and state["applied"]["variant"] == "prefetch"
    assert state["applied"]["patch_sha256"] == patch_sha256("prefetch")
    assert tree_modifications(wd, "patched") == []  # the record follows the tree
    # baseline untouched
    assert sha256_file(wd.tree("baseline") / upstream.ATTENTION_HEADER) == \
        upstream.ATTENTION_HEADER_SHA256

    before = _bytes(fetched_workdir)
    res = cli("apply", "--workdir", str(fetched_workdir), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["action"] == "already-applied"
    assert _bytes(fetched_workdir) == before


def test_a_header_with_one_changed_line_is_refused_untouched(fetched_workdir: Path) -> None:
    header = fetched_workdir / "trees" / "patched" / upstream.ATTENTION_HEADER
    lines = header.read_text().splitlines(keepends=True)
    i = next(n for n, ln in enumerate(lines) if "physical_block_number" in ln)
    lines[i] = lines[i].replace("physical_block_number", "physical_block_number ", 1)
    header.write_text("".join(lines))
    before = _bytes(fetched_workdir)
    res = cli("apply", "--workdir", str(fetched_workdir))
    assert res.returncode == PatchError.exit_code
    assert "an unknown modification" in res.stderr and upstream.ATTENTION_HEADER in res.stderr
    assert "left untouched" in res.stderr and "To fix:" in res.stderr
    assert _bytes(fetched_workdir) == before  # full inventory: trees, state, pristine, downloads


@pytest.mark.parametrize("rel", upstream.KIT_HEADERS_IN_TREE)
def test_a_hand_edited_kit_header_is_refused_untouched(fetched_workdir: Path, rel: str) -> None:
    """Re-applying over a tree whose copy of one of the kit's headers was edited would
    silently overwrite the edit: apply refuses, naming the file, and changes nothing."""
    apply_patch(fetched_workdir, "prefetch")
    installed = fetched_workdir / "trees" / "patched" / rel
    installed.write_text(installed.read_text() + "// a local experiment\n")
    before = _bytes(fetched_workdir)
    res = cli("apply", "--workdir", str(fetched_workdir))
    assert res.returncode == PatchError.exit_code
    assert f"{installed} was edited by hand" in res.stderr and "To fix:" in res.stderr
    assert _bytes(fetched_workdir) == before


def test_the_other_variant_is_refused_on_a_patched_tree(fetched_workdir: Path) -> None:
    apply_patch(fetched_workdir, "prefetch")
    before = _bytes(fetched_workdir)
    res = cli("apply", "--workdir", str(fetched_workdir), "--variant", "paper", "--tree", "patched")
    assert res.returncode == PatchError.exit_code
    assert "carries the prefetch variant" in res.stderr and "To fix:" in res.stderr
    assert _bytes(fetched_workdir) == before


def test_paper_variant_applies_to_the_paper_tree(fetched_workdir: Path) -> None:
    res = cli("fetch", "--workdir", str(fetched_workdir), "--with-paper", "--source", "sdist",
              "--json")
    assert res.returncode == 0, res.stderr
    assert [t["action"] for t in json.loads(res.stdout)["trees"]] == ["unchanged", "unchanged",
                                                                      "created"]
    res = cli("apply", "--workdir", str(fetched_workdir), "--variant", "paper", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert (data["tree"], data["variant"], data["action"]) == ("paper", "paper", "applied")
    tree = fetched_workdir / "trees" / "paper"
    assert carried_variant(tree) == "paper"
    header = (tree / upstream.ATTENTION_HEADER).read_text()
    assert "seed_prefetch_4096" in header
    assert "prefetch_prologue" not in header
    # the other two trees are untouched
    for name in ("baseline", "patched"):
        assert carried_variant(fetched_workdir / "trees" / name) is None
    # and the prefetch variant on the same paper tree is now refused
    res = cli("apply", "--workdir", str(fetched_workdir), "--variant", "prefetch",
              "--tree", "paper")
    assert res.returncode == PatchError.exit_code and "carries the paper variant" in res.stderr
    # the old spellings still work, each with a note: --with-seed and --variant seed are the
    # paper's, and `seed` names its tree
    res = cli("fetch", "--workdir", str(fetched_workdir), "--with-seed", "--source", "sdist",
              "--json")
    assert res.returncode == 0, res.stderr
    assert [t["name"] for t in json.loads(res.stdout)["trees"]] == ["baseline", "patched", "paper"]
    assert "--with-seed is deprecated" in res.stderr and "--with-paper" in res.stderr
    res = cli("apply", "--workdir", str(fetched_workdir), "--variant", "seed", "--tree", "seed",
              "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert (data["tree"], data["variant"], data["action"]) == ("paper", "paper", "already-applied")
    assert "--variant seed is deprecated" in res.stderr


def test_a_work_directory_from_before_the_rename_keeps_its_seed_tree(
        fetched_workdir: Path) -> None:
    """A tree fetched as `seed` and recorded as carrying the `seed` variant (the paper's
    variant's old name) is still found, recognised as applied, and named by either name."""
    res = cli("fetch", "--workdir", str(fetched_workdir), "--extra-tree", "seed", "--source",
              "sdist")
    assert res.returncode == 0, res.stderr
    res = cli("apply", "--workdir", str(fetched_workdir), "--variant", "paper", "--tree", "seed")
    assert res.returncode == 0, res.stderr
    state_file = fetched_workdir / "state" / "seed.json"
    state = json.loads(state_file.read_text())
    state["applied"]["variant"] = "seed"  # what the kit recorded before the rename
    state_file.write_text(json.dumps(state))
    res = cli("apply", "--workdir", str(fetched_workdir), "--variant", "paper", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert (data["tree"], data["action"]) == ("seed", "already-applied")
    res = cli("diff-upstream", "--workdir", str(fetched_workdir), "--tree", "paper", "--check",
              "--stat")
    assert res.returncode == 0, res.stderr


def test_control_variant_is_stock_rebuilt_in_an_extra_tree(fetched_workdir: Path) -> None:
    """The A/A reference: an extra tree whose diffs add only comments to the launchers."""
    res = cli("apply", "--workdir", str(fetched_workdir), "--variant", "control")
    assert res.returncode == PatchError.exit_code
    assert "fetch --extra-tree control" in res.stderr  # the fix names the missing tree
    res = cli("fetch", "--workdir", str(fetched_workdir), "--extra-tree", "control", "--source",
              "sdist", "--json")
    assert res.returncode == 0, res.stderr
    res = cli("apply", "--workdir", str(fetched_workdir), "--variant", "control", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert (data["tree"], data["variant"], data["action"]) == ("control", "control", "applied")
    tree = fetched_workdir / "trees" / "control"
    assert carried_variant(tree) == "control"
    added = [ln[1:] for p in upstream.patch_files("control") for ln in p.read_text().splitlines()
             if ln.startswith("+") and not ln.startswith("+++")]
    assert len(added) == 2 and all(a.startswith("// kvprefetch control") for a in added)
    assert not policy.prefetches_in("control", "v2", "auto", 128, 16, "fp16")
    res = cli("diff-upstream", "--workdir", str(fetched_workdir), "--tree", "control", "--check",
              "--json")
    assert res.returncode == 0, res.stderr
    files = {f["path"]: f for f in json.loads(res.stdout)["files"]}
    assert set(files) - set(upstream.KIT_HEADERS_IN_TREE) == set(_patch_files_touched("control"))
    assert upstream.ATTENTION_HEADER not in files  # the kernels' source is stock's


def test_baseline_is_never_patched(shared_fetched: Path) -> None:
    before = tree_bytes(shared_fetched)
    res = cli("apply", "--workdir", str(shared_fetched), "--tree", "baseline")
    assert res.returncode == ConfigError.exit_code
    assert "stock reference" in res.stderr and "To fix:" in res.stderr
    assert tree_bytes(shared_fetched) == before


def test_apply_dry_run_json(shared_fetched: Path) -> None:
    before = _bytes(shared_fetched)
    res = cli("apply", "--workdir", str(shared_fetched), "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["action"] == "would-apply" and data["patch_sha256"] == patch_sha256("prefetch")
    assert _bytes(shared_fetched) == before


def test_apply_without_a_tree_says_to_fetch(tmp_path: Path) -> None:
    res = cli("apply", "--workdir", str(tmp_path / "nothing"))
    assert res.returncode == PatchError.exit_code
    assert "To fix: run `kvprefetch fetch`" in res.stderr


# --------------------------------------------------------------------------- diff-upstream


def test_diff_upstream_check_passes_on_our_patch(fetched_workdir: Path) -> None:
    apply_patch(fetched_workdir, "prefetch")
    res = cli("diff-upstream", "--workdir", str(fetched_workdir), "--check")
    assert res.returncode == 0, res.stderr
    assert "check passed: the patch only adds lines" in res.stderr
    assert f"+++ b/{upstream.ATTENTION_HEADER}" in res.stdout
    assert "kvprefetch::prefetch_prologue" in res.stdout

    res = cli("diff-upstream", "--workdir", str(fetched_workdir), "--json")
    data = json.loads(res.stdout)
    assert data["additive"] is True and data["variant"] == "prefetch"
    files = {f["path"]: f for f in data["files"]}
    assert set(files) == set(_patch_files_touched("prefetch")) | set(upstream.KIT_HEADERS_IN_TREE)
    assert all(f["removed"] == 0 for f in files.values())
    # the diff against pristine adds exactly the patch's '+' lines (plus the kit's headers whole)
    assert sum(f["added"] for p, f in files.items()
               if p not in upstream.KIT_HEADERS_IN_TREE) == _plus_lines("prefetch")
    for ours, in_tree in upstream.kit_headers():
        assert files[in_tree]["added"] == len(ours.read_text().splitlines())

    res = cli("diff-upstream", "--workdir", str(fetched_workdir), "--stat")
    assert f"{upstream.ATTENTION_HEADER}: +" in res.stdout and " -0" in res.stdout


def test_diff_upstream_check_fails_on_a_destructive_change(fetched_workdir: Path) -> None:
    """A patched tree in which one upstream line was also edited: the diff now has a '-' line."""
    apply_patch(fetched_workdir, "prefetch")
    header = fetched_workdir / "trees" / "patched" / upstream.ATTENTION_HEADER
    text = header.read_text()
    assert '#include "attention_utils.cuh"' in text
    header.write_text(text.replace('#include "attention_utils.cuh"',
                                   '#include "attention_utils_v2.cuh"', 1))
    res = cli("diff-upstream", "--workdir", str(fetched_workdir), "--check")
    assert res.returncode == 1
    assert "check FAILED" in res.stderr and f"{upstream.ATTENTION_HEADER} (-1)" in res.stderr
    assert "To fix:" in res.stderr
    assert '-#include "attention_utils.cuh"' in res.stdout
    data = json.loads(cli("diff-upstream", "--workdir", str(fetched_workdir), "--json").stdout)
    assert data["additive"] is False


def test_diff_upstream_check_fails_on_a_pristine_tree(shared_fetched: Path) -> None:
    res = cli("diff-upstream", "--workdir", str(shared_fetched), "--check")
    assert res.returncode == 1 and "pristine" in res.stderr
    assert res.stdout == ""


# --------------------------------------------------------------------------- export-header


def _own_lines(name: str) -> list[str]:
    """A kit header's lines as export-header inlines them: no #pragma once, no kit include."""
    return [ln for ln in (KIT_DIR / name).read_text().splitlines()
            if ln != "#pragma once" and not re.match(r'#include "[A-Za-z0-9_/]+\.(cuh|inc)"', ln)]


def _inlined_blocks(text: str) -> dict[str, list[list[str]]]:
    """Each inlined header's own lines (nested inlined headers left out), by name, in order."""
    blocks: dict[str, list[list[str]]] = {}
    stack: list[list[str]] = []
    for ln in text.splitlines():
        begin = re.match(r"// ---- begin kvprefetch csrc/kvprefetch/(\S+) \(inlined\) ----$", ln)
        if begin:
            stack.append([])
            blocks.setdefault(begin.group(1), []).append(stack[-1])
        elif re.match(r"// ---- end kvprefetch csrc/kvprefetch/\S+ ----$", ln):
            stack.pop()
        elif stack:
            stack[-1].append(ln)
    assert not stack
    return blocks


def test_export_header_is_pristine_plus_added_lines_with_the_helper_inlined(
        shared_fetched: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "attention_kernels.cuh"
    res = cli("export-header", "--workdir", str(shared_fetched), "-o", str(out), "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["output"] == str(out) and data["sha256"] == sha256_file(out)
    text = out.read_text()
    assert '#include "kvprefetch/' not in text
    assert "namespace kvprefetch {" in text
    # every header the umbrella includes is inlined once (rules.inc, an X-macro table, wherever
    # it is included), each with its own lines in order, its kit includes replaced
    blocks = _inlined_blocks(text)
    helper: list[str] = []
    for name in ("l2_prefetch.cuh", "launch_policy.cuh", "prologue.cuh", "launcher_prefetch.cuh"):
        (own,) = blocks[name]
        assert own == _own_lines(name), name
        helper += own
    includes = sum((KIT_DIR / name).read_text().count('#include "rules.inc"') for name in blocks
                   if name != "rules.inc")
    assert len(blocks["rules.inc"]) == includes and all(b == _own_lines("rules.inc")
                                                        for b in blocks["rules.inc"])
    assert "paper.cuh (inlined)" not in text and "gqa_twins.cuh (inlined)" not in text
    # pristine + only added lines
    pristine = (shared_fetched / "pristine" / "sdist" / upstream.ATTENTION_HEADER).read_text()
    diff = list(difflib.unified_diff(pristine.splitlines(), text.splitlines(), lineterm=""))
    removed = [ln for ln in diff if ln.startswith("-") and not ln.startswith("---")]
    added = [ln for ln in diff if ln.startswith("+") and not ln.startswith("+++")]
    assert removed == [] and len(added) > len(helper)
    # the prefetch variant's header alone does not prefetch: the JSON says what else it needs
    assert "paged_attention_v{1,2}.cu.patch" in data["caveat"]
    # and nothing was written into the work directory's trees
    assert carried_variant(shared_fetched / "trees" / "patched") is None


def test_export_header_paper_variant(shared_fetched: Path, tmp_path: Path) -> None:
    out = tmp_path / "paper.cuh"
    res = cli("export-header", "--workdir", str(shared_fetched), "-o", str(out),
              "--variant", "paper")
    assert res.returncode == 0, res.stderr
    assert str(out) in res.stdout
    assert "note:" not in res.stderr  # the paper's drop-in header is complete on its own
    text = out.read_text()
    assert "seed_prefetch_4096" in text.split("begin kvprefetch csrc/kvprefetch/paper.cuh")[1]
    assert text.count("begin kvprefetch csrc/kvprefetch/paper.cuh (inlined)") == 1


def test_default_relative_workdir_inside_a_git_checkout_really_patches(
        tmp_path: Path, fetched_workdir: Path) -> None:
    """The README's flow: `kvprefetch fetch/apply` with the default, RELATIVE work directory
    ./kvprefetch-work inside a git checkout (the kit's own clone). git apply run there finds the
    enclosing checkout unless the ceiling is absolute, and then silently skips every path
    outside it while still exiting 0 -- found by running scripts/main.sh in a fresh clone."""
    import subprocess

    checkout = tmp_path / "checkout"
    checkout.mkdir()
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    copy_workdir(fetched_workdir, checkout / "kvprefetch-work")
    env = {k: v for k, v in os.environ.items() if k != "KVPREFETCH_WORKDIR"}
    res = kvprefetch_cli_split("apply", "--json", env=env, cwd=checkout)
    assert res.returncode == 0, res.stderr
    header = checkout / "kvprefetch-work" / "trees" / "patched" / "csrc" / "attention" / \
        "attention_kernels.cuh"
    assert "kvprefetch::prefetch_prologue" in header.read_text()
    res = kvprefetch_cli_split("diff-upstream", "--check", "--stat", env=env, cwd=checkout)
    assert res.returncode == 0, res.stderr
    assert "csrc/attention/attention_kernels.cuh: +" in res.stdout


def test_new_kit_headers_are_installed_into_an_applied_tree(
        fetched_workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When only the kit's own headers changed since a tree was patched (csrc/*.cuh edited in
    this checkout; the diffs the same), apply installs the new headers, through the same staged
    commit, and leaves the patched upstream files alone. The repository's csrc/ is not edited:
    kit_headers is pointed at a copy with one more line, which is what an edit would look like."""
    apply_patch(fetched_workdir, "prefetch")
    wd = Workdir(fetched_workdir)
    tree = wd.tree("patched")
    patched_before = {rel: sha256_file(tree / rel) for rel in upstream.patched_paths("prefetch")}
    newer = []
    for src, rel in upstream.kit_headers():
        copy = tmp_path / "csrc" / src.name
        copy.parent.mkdir(exist_ok=True)
        copy.write_text(src.read_text() + "// a newer kit header\n")
        newer.append((copy, rel))
    monkeypatch.setattr(upstream, "kit_headers", lambda: newer)
    res = apply_patch(fetched_workdir, "prefetch")
    assert res.action == "applied" and res.patch_sha256 == patch_sha256("prefetch")
    for copy, rel in newer:
        assert (tree / rel).read_bytes() == copy.read_bytes()
    assert {rel: sha256_file(tree / rel) for rel in patched_before} == patched_before
    assert tree_modifications(wd, "patched") == []
    assert apply_patch(fetched_workdir, "prefetch").action == "already-applied"


def test_apply_writes_nothing_outside_the_work_directory(fetched_workdir: Path,
                                                         tmp_path: Path) -> None:
    """apply's scratch copies live in <workdir>/tmp (recorded, so a killed apply's are removed
    by the next fetch or clean), not in the system temp directory: TMPDIR stays empty, and the
    work directory keeps no scratch after a successful or a refused apply."""
    tmpdir = tmp_path / "system-tmp"
    tmpdir.mkdir()
    env = dict(_env(), TMPDIR=str(tmpdir))
    for variant, want in (("prefetch", 0), ("paper", PatchError.exit_code)):
        res = kvprefetch_cli_split("apply", "--workdir", str(fetched_workdir), "--variant",
                                   variant, "--tree", "patched", env=env)
        assert res.returncode == want, res.stderr
        assert list(tmpdir.iterdir()) == []
        assert not (fetched_workdir / "tmp").exists()
        assert not [e for e in ownership.entries(fetched_workdir).values() if e["kind"] == "tmp"]


def test_fetch_only_makes_just_the_named_trees(tmp_path: Path, vllm_sdist: Path) -> None:
    """`fetch --only NAME` (a cluster job that builds one tree) makes that tree and no other,
    from the real sdist; mixing it with --extra-tree is refused before anything is made."""
    wd = tmp_path / "w"
    res = cli("fetch", "--workdir", str(wd), "--source", str(vllm_sdist), "--only", "launch")
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in (wd / "trees").iterdir()) == ["launch"]
    res = cli("apply", "--workdir", str(wd), "--variant", "launch")
    assert res.returncode == 0, res.stderr
    res = cli("fetch", "--workdir", str(tmp_path / "v"), "--source", str(vllm_sdist), "--only",
              "patched", "--extra-tree", "x")
    assert res.returncode != 0 and "--only names every tree" in res.stderr
    assert not (tmp_path / "v").exists()
