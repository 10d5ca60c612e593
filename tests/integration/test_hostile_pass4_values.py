"""Issue 41, the fourth hostile pass (against 4d500c5), its values: what was accepted though
absurd and failed later (in nvcc, in a Slurm job, at sbatch, in the middle of a run) or never
stopped. Each is now refused up front by click's usage error (exit 2, naming the option and
the range or format) and by the library for callers that are not the command line:

- ``build --tree-define patched:=1``: an empty macro name (NAME must be a C identifier);
- ``bench kernel --sample-ms/--l2-factor/--time-limit`` NaN or negative, ``--pool-factor 0``;
- ``bench e2e`` and ``bench ncu`` negative counts (repeats, lengths, prompts, launches);
- ``slurm plan --context '1k;id'``, ``--arch '9.0a;$(id)'``, ``--preset 'a b'``, ``--time
  1-99:99:99``, ``--batch``/``--cpus-per-build`` 10^23;
- ``vmm selftest --ops 10**20`` (ran as long as asked);
- ``fetch --source ''`` (the current directory), and a fetch refused for its source left a new,
  tagged ``--workdir``.

Each test fails on the code before the fix (checked with the fixes stashed). The autouse
``outside`` fixture checks that a folder outside the work directory is byte-identical."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from kvprefetch.errors import ConfigError, FetchError, OptionError
from tests.integration.test_reliability import cli, outside, refused

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

USAGE = 2  # click's usage error


def _usage_error(res, option: str, *needles: str) -> None:  # type: ignore[no-untyped-def]
    """click's usage error naming the option, the kit's To fix, no traceback."""
    refused(res, USAGE, f"Invalid value for '{option}'", *needles)


# ------------------------------------------------------------------------ 1. --tree-define


@pytest.mark.parametrize("define", ["patched:=1", "patched:=", "patched:1X=1", "patched:A-B=1"])
def test_a_tree_define_whose_name_is_no_c_identifier_is_refused(tmp_path: Path,
                                                                define: str) -> None:
    res = cli("build", "--dry-run", "--kernels-only", "--skip-doctor", "--workdir",
              str(tmp_path / "w"), "--tree-define", define)
    _usage_error(res, "--tree-define", "C macro name")
    assert not (tmp_path / "w").exists()


def test_parse_tree_defines_refuses_an_empty_macro_name() -> None:
    from kvprefetch.builds.pipeline import parse_tree_defines

    with pytest.raises(ConfigError, match="C macro name"):
        parse_tree_defines(("patched:=1",))
    assert parse_tree_defines(("patched:KVPREFETCH_DEFAULT_MODE=0", "patched:X")) == {
        "patched": ("KVPREFETCH_DEFAULT_MODE=0", "X")}


# ------------------------------------------------------------------------ 2. bench kernel


@pytest.mark.parametrize(("option", "value"), [
    ("--sample-ms", "nan"), ("--sample-ms", "-1"), ("--sample-ms", "0"),
    ("--l2-factor", "nan"), ("--l2-factor", "-4"), ("--l2-factor", "inf"),
    ("--time-limit", "nan"), ("--time-limit", "-1"),
    ("--pool-factor", "0"), ("--pool-factor", "nan"),
])
def test_bench_kernel_refuses_numbers_that_mean_nothing(tmp_path: Path, option: str,
                                                        value: str) -> None:
    res = cli("bench", "kernel", "--workdir", str(tmp_path / "w"), "--dry-run", "--batch", "1",
              "--context", "512", option, value)
    _usage_error(res, option, "finite number")


def test_the_kernel_plan_refuses_them_for_callers_that_are_not_the_cli(tmp_path: Path) -> None:
    from kvprefetch.bench.kernel_plan import KernelBenchOptions, plan_kernel_bench

    base = KernelBenchOptions(workdir=tmp_path, batch=("1",), context=("512",))
    for field, value in (("sample_ms", math.nan), ("l2_factor", -1.0), ("pool_factor", 0.0),
                         ("time_limit", -1.0)):
        with pytest.raises(OptionError) as info:
            plan_kernel_bench(replace(base, **{field: value}), builds=())
        assert info.value.option == "--" + field.replace("_", "-")
    assert plan_kernel_bench(base, builds=()).runs == 1


# ------------------------------------------------------------------------ 3. bench e2e / ncu


@pytest.mark.parametrize(("option", "value"), [
    ("--repeats", "-1"), ("--repeats", "0"), ("--input-len", "-5"), ("--output-len", "0"),
    ("--prompts-per-seq", "-2"), ("--min-prompts", "-1"), ("--max-model-len", "-1"),
])
def test_bench_e2e_refuses_negative_counts(tmp_path: Path, option: str, value: str) -> None:
    res = cli("bench", "e2e", "--workdir", str(tmp_path / "w"), "--dry-run", option, value)
    _usage_error(res, option, "whole number")


@pytest.mark.parametrize(("option", "value"), [
    ("--launch-count", "-3"), ("--launch-count", "0"), ("--launch-skip", "-1"),
])
def test_bench_ncu_refuses_negative_launch_counts(tmp_path: Path, option: str,
                                                  value: str) -> None:
    res = cli("bench", "ncu", "--workdir", str(tmp_path / "w"), "--dry-run", option, value)
    _usage_error(res, option, "whole number")


def test_e2e_and_ncu_plans_refuse_them_for_callers_that_are_not_the_cli(tmp_path: Path) -> None:
    from kvprefetch.bench.e2e_plan import E2EBenchOptions, plan_e2e_bench
    from kvprefetch.bench.ncu_plan import NcuBenchOptions, plan_ncu_bench

    with pytest.raises(OptionError, match="whole number"):
        plan_e2e_bench(E2EBenchOptions(workdir=tmp_path, repeats=-1), dry_run=True)
    with pytest.raises(OptionError, match="whole number"):
        plan_ncu_bench(NcuBenchOptions(workdir=tmp_path, launch_count=-3), builds=())
    # 0 is meaningful where it is: no floor on prompts, no launches skipped
    plan_e2e_bench(E2EBenchOptions(workdir=tmp_path, min_prompts=0), dry_run=True)
    plan_ncu_bench(NcuBenchOptions(workdir=tmp_path, launch_skip=0), builds=())


# ------------------------------------------------------------------------ 4. slurm plan


@pytest.mark.parametrize(("option", "value", "needle"), [
    ("--context", "1k;id", "not a context length"),
    ("--arch", "9.0a;$(id)", "not a CUDA arch"),
    ("--preset", "a b", "not a model preset"),
    ("--time", "1-99:99:99", "not a time sbatch accepts"),
    ("--time", "99:60", "not a time sbatch accepts"),
    ("--time", "1-24", "not a time sbatch accepts"),
    ("--time", "9" * 30, "not a time sbatch accepts"),
    ("--batch", str(10**23), "65535"),
    ("--batch", "1,70000", "65535"),
    ("--cpus-per-build", str(10**23), "1024"),
])
def test_slurm_plan_refuses_values_not_in_their_real_format(tmp_path: Path, option: str,
                                                            value: str, needle: str) -> None:
    campaign = tmp_path / "camp"
    res = cli("slurm", "plan", str(campaign), "--dry-run", option, value)
    _usage_error(res, option, needle)
    assert not campaign.exists()


def test_a_campaign_read_back_is_checked_the_same(tmp_path: Path) -> None:
    """campaign.json may be edited: the values are checked in the Campaign, not only by click."""
    from kvprefetch.slurm.campaign import BenchSpec, SlurmOptions, make_campaign, parse_trees

    def plan(**kw: object) -> None:
        args: dict = {"python": "/usr/bin/python3", "kit_root": "/k", "kit_commit": None,
                      "kit_version": "0", "path": "/usr/bin", "source": "auto",
                      "trees": parse_trees("baseline,patched"),
                      "arch": "9.0a", "build_args": (), "no_gpu": True, "bench": BenchSpec(),
                      "slurm": SlurmOptions()}
        args.update(kw)
        make_campaign(tmp_path / "c", **args)  # type: ignore[arg-type]

    plan()
    for bad, needle in (({"arch": "9.0a;$(id)"}, "not a CUDA arch"),
                        ({"bench": BenchSpec(contexts=("1k;id",))}, "not a context length"),
                        ({"bench": BenchSpec(presets=("a b",))}, "not a model preset"),
                        ({"bench": BenchSpec(batches=(10**23,))}, "65535")):
        with pytest.raises(ConfigError, match=needle):
            plan(**bad)
    # every format sbatch takes still passes
    for value in ("90", "90:30", "2:00:00", "1-12", "1-12:30", "1-23:59:59", "0", "INFINITE"):
        assert SlurmOptions(time=value).time == value
    for slurm, needle in (({"time": "1-99:99:99"}, "not a time sbatch accepts"),
                          ({"cpus_per_build": 10**23}, "1024")):
        with pytest.raises(ConfigError, match=needle):
            SlurmOptions(**slurm)  # type: ignore[arg-type]


# ------------------------------------------------------------------------ 5. vmm selftest


def test_vmm_selftest_refuses_more_ops_than_a_run_can_hold() -> None:
    res = cli("vmm", "selftest", "--driver", "fake", "--ops", str(10**20), timeout=60)
    _usage_error(res, "--ops", "10000000")


# ------------------------------------------------------------------------ 6. fetch --source


@pytest.mark.parametrize("source", ["", "  ", "does-not-exist"])
def test_fetch_refuses_an_empty_or_missing_source_and_makes_nothing(tmp_path: Path,
                                                                    source: str) -> None:
    wd = tmp_path / "new" / "work"
    res = cli("fetch", "--workdir", str(wd), "--source", source, timeout=60)
    _usage_error(res, "--source")
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_fetch_refused_for_its_source_leaves_no_new_work_directory(tmp_path: Path,
                                                                     kind: str) -> None:
    """A file that is not the sdist (sha256) and a folder that is no vLLM tree are found only
    once fetch has made and locked the work directory: what it made is removed again."""
    source = tmp_path / "src"
    if kind == "file":
        source.write_text("not the sdist\n")
    else:
        source.mkdir()
    wd = tmp_path / "new" / "work"
    res = cli("fetch", "--workdir", str(wd), "--source", str(source), timeout=60)
    refused(res, FetchError.exit_code, str(source))
    assert not (tmp_path / "new").exists()
    # an existing (empty) --workdir is the user's: it stays, with the kit's tag
    wd = tmp_path / "work"
    wd.mkdir()
    res = cli("fetch", "--workdir", str(wd), "--source", str(source), timeout=60)
    refused(res, FetchError.exit_code, str(source))
    assert wd.is_dir() and (wd / ".kvprefetch-workdir").is_file()



def test_a_failed_fetch_that_made_more_keeps_its_work_directory_whole(tmp_path: Path) -> None:
    """Past the skeleton (a download, a pristine copy) nothing is removed, the tag included:
    the next fetch takes the directory as the kit's and uses what is there."""
    from kvprefetch.sources.fetch import _missing_folders, _remove_new_skeleton
    from kvprefetch.workspace.workdir import TAG_FILE, Workdir

    root = tmp_path / "new" / "work"
    made = _missing_folders(root)
    wd = Workdir(root)
    wd.ensure()
    (root / "downloads").mkdir()
    _remove_new_skeleton(wd, made, ("baseline", "patched"))
    assert sorted(p.name for p in root.iterdir()) == [TAG_FILE, "downloads"]
    (root / "downloads").rmdir()
    _remove_new_skeleton(wd, made, ("baseline", "patched"))
    assert not (tmp_path / "new").exists()
