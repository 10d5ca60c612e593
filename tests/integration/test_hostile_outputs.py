"""Where the kit's outputs land (a hostile pass over the writers): a device node or a FIFO in
the place of `export-header -o` was replaced by a regular file (E3, E2); `report`'s
``<name>.md``/``.png``, ``merged.json``/``.md``, ``--index --out FILE`` and ``--readme FILE``
were written through a planted symlink to a file outside (R1, R4, R6); ``--readme`` read a
binary file (a UnicodeDecodeError traceback) or a FIFO (a hang) whole (R13, R11).

Each case runs the real command in a subprocess on a committed result under docs/results and
checks ``refused``: the family's exit code, one message with "To fix", no traceback; the
autouse ``outside`` fixture (shared with test_reliability.py) checks that the files the links
point to are byte-identical afterwards. Every test here fails on the code before this file."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import types
from pathlib import Path

import pytest

from kvprefetch.errors import BenchError, PatchError
from tests.integration.helpers import tree_bytes
from tests.integration.test_reliability import cli, outside, refused

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "docs" / "results" / "2026-11-29-h200-l2-bound" / "small-hot-aliased.json"


def _result(tmp_path: Path) -> Path:
    """A private copy of a committed bench kernel result."""
    p = tmp_path / "in" / RESULT.name
    p.parent.mkdir(exist_ok=True)
    shutil.copyfile(RESULT, p)
    return p


def _mknod_chr(path: Path) -> None:
    """``mknod -m 666 path c 1 3`` (a /dev/null twin), or skip where this machine forbids it."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError as exc:
        pytest.skip(f"mknod of a character device is not permitted here ({exc}): the test "
                    "needs root or CAP_MKNOD")


# ------------------------------------------------ E3, E2: only a regular file is replaced


def test_export_header_never_replaces_a_device_node_or_a_fifo(
        fetched_workdir: Path, tmp_path: Path) -> None:
    """`export-header -o X` where X is a character device (as root, `-o /dev/null` would have
    broken the system) or a FIFO: refused, naming X; X is still what it was."""
    dev, fifo = tmp_path / "dev-null-twin", tmp_path / "fifo.cuh"
    _mknod_chr(dev)
    os.mkfifo(fifo)
    for path, kind, is_kind in ((dev, "a character device", stat.S_ISCHR),
                                (fifo, "a FIFO", stat.S_ISFIFO)):
        res = cli("export-header", "--workdir", str(fetched_workdir), "-o", str(path),
                  timeout=120)
        refused(res, PatchError.exit_code, f"refusing to write {path}", kind,
                "not a regular file")
        assert is_kind(os.lstat(path).st_mode), f"{path} was replaced"
        assert not any(p.name.startswith(f".{path.name}.tmp-") for p in tmp_path.iterdir())
    # a regular file in its place is still replaced, as before
    plain = tmp_path / "plain.cuh"
    plain.write_text("old\n")
    res = cli("export-header", "--workdir", str(fetched_workdir), "-o", str(plain), timeout=120)
    assert res.returncode == 0, res.stderr
    assert plain.read_text() != "old\n"


def test_report_never_writes_over_a_device_node_or_a_fifo(tmp_path: Path) -> None:
    """`report RESULT --out D` with D/<name>.md a FIFO (the old write blocked on it forever)
    or a character device: refused, nothing replaced."""
    src = _result(tmp_path)
    d = tmp_path / "d"
    d.mkdir()
    os.mkfifo(d / "small-hot-aliased.md")
    res = cli("report", str(src), "--formats", "md", "--out", str(d), timeout=60)
    refused(res, BenchError.exit_code, "a FIFO", "not a regular file")
    assert stat.S_ISFIFO(os.lstat(d / "small-hot-aliased.md").st_mode)
    (d / "small-hot-aliased.md").unlink()
    _mknod_chr(d / "small-hot-aliased.md")
    res = cli("report", str(src), "--formats", "md", "--out", str(d), timeout=60)
    refused(res, BenchError.exit_code, "a character device")
    assert stat.S_ISCHR(os.lstat(d / "small-hot-aliased.md").st_mode)


def test_report_out_naming_a_fifo_or_a_device_says_what_it_is(tmp_path: Path) -> None:
    """`report RESULT --out F` with F a FIFO or /dev/null: a usage error that called both "a
    file" (issue 41, the fifteenth hostile pass left it open); it names the kind now, and the
    FIFO is left as it was."""
    src = _result(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for out, kind in ((fifo, "a FIFO"), (Path("/dev/null"), "a character device")):
        res = cli("report", str(src), "--formats", "md", "--out", str(out), timeout=60)
        refused(res, 2, f"{out} is {kind}", "give a folder")
        assert "is a file" not in res.stderr, res.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


# ------------------------------------------------ R1, R4, R6: never through a planted symlink


def test_report_out_never_writes_through_a_planted_symlink(
        tmp_path: Path, outside: Path) -> None:
    """R1: D/<name>.md linked to a file outside; and D itself a symlink (the rule of
    `export-header -o`: the folder named must not be a link)."""
    src = _result(tmp_path)
    d = tmp_path / "d"
    d.mkdir()
    (d / "small-hot-aliased.md").symlink_to(outside / "notes.txt")
    res = cli("report", str(src), "--formats", "md", "--out", str(d), timeout=60)
    refused(res, BenchError.exit_code, "small-hot-aliased.md is a symlink")
    linked = tmp_path / "linked"
    linked.symlink_to(outside, target_is_directory=True)
    res = cli("report", str(src), "--formats", "md", "--out", str(linked), timeout=60)
    refused(res, BenchError.exit_code, f"refusing to write into {linked}: it is a symlink")
    # without the links the same command writes
    (d / "small-hot-aliased.md").unlink()
    res = cli("report", str(src), "--formats", "md", "--out", str(d), timeout=60)
    assert res.returncode == 0, res.stderr
    assert (d / "small-hot-aliased.md").read_text().startswith("#")


def test_report_png_is_rendered_in_memory_and_never_saved_through_a_symlink(
        tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """R1 for the plot: matplotlib's savefig(path) opened the path itself and followed a
    planted link. A stand-in figure writes wherever savefig is told (as matplotlib does), so
    this runs without the `plot` extra."""
    from kvprefetch.bench.render import save_figure

    # a stand-in for `import matplotlib.pyplot as plt`, installed or not (the real plt.close
    # refuses a stand-in figure; the real plot is the next test's)
    plt = types.ModuleType("matplotlib.pyplot")
    plt.close = lambda fig: None  # type: ignore[attr-defined]
    mpl = types.ModuleType("matplotlib")
    mpl.pyplot = plt  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "matplotlib", mpl)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", plt)

    class Figure:
        def tight_layout(self) -> None:
            pass

        def savefig(self, target: object, **kw: object) -> None:
            if isinstance(target, (str, os.PathLike)):
                with open(target, "wb") as f:
                    f.write(b"\x89PNG fake")
            else:
                target.write(b"\x89PNG fake")  # type: ignore[attr-defined]

    png = tmp_path / "d" / "k.png"
    png.parent.mkdir()
    png.symlink_to(outside / "baseline.json")
    with pytest.raises(BenchError, match="is a symlink"):
        save_figure(Figure(), png)
    png.unlink()
    assert save_figure(Figure(), png) == png and png.read_bytes() == b"\x89PNG fake"


def test_report_png_with_matplotlib_never_writes_through_a_symlink(
        tmp_path: Path, outside: Path) -> None:
    """R1 for the real plot (where the `plot` extra is installed)."""
    pytest.importorskip("matplotlib", reason="the `plot` extra (matplotlib) is not installed; "
                        "test_report_png_is_rendered_in_memory_... covers the writer")
    src = _result(tmp_path)
    d = tmp_path / "d"
    d.mkdir()
    (d / "small-hot-aliased.png").symlink_to(outside / "baseline.json")
    res = cli("report", str(src), "--formats", "png", "--out", str(d), timeout=120)
    refused(res, BenchError.exit_code, "small-hot-aliased.png is a symlink")


def test_report_merge_never_writes_through_a_planted_symlink(
        tmp_path: Path, outside: Path) -> None:
    """R4: merged.json and merged.md linked to files outside."""
    src = _result(tmp_path)
    d = tmp_path / "d"
    d.mkdir()
    (d / "merged.json").symlink_to(outside / "baseline.json")
    res = cli("report", "--merge", str(src), "--formats", "md", "--out", str(d), timeout=60)
    refused(res, BenchError.exit_code, "merged.json is a symlink")
    (d / "merged.json").unlink()
    (d / "merged.md").symlink_to(outside / "notes.txt")
    res = cli("report", "--merge", str(src), "--formats", "md", "--out", str(d), timeout=60)
    refused(res, BenchError.exit_code, "merged.md is a symlink")


def test_report_index_out_never_writes_through_a_symlink(
        tmp_path: Path, outside: Path) -> None:
    """R6: `report --index DIR --out FILE` with FILE a symlink to a file outside."""
    runs = tmp_path / "runs"
    shutil.copytree(RESULT.parent, runs / RESULT.parent.name)
    out = tmp_path / "results.md"
    out.symlink_to(outside / "notes.txt")
    res = cli("report", "--index", str(runs), "--out", str(out), timeout=60)
    refused(res, BenchError.exit_code, "results.md is a symlink")
    out.unlink()
    res = cli("report", "--index", str(runs), "--out", str(out), timeout=60)
    assert res.returncode == 0, res.stderr
    assert RESULT.parent.name in out.read_text()


def test_report_readme_never_rewrites_through_a_symlink(tmp_path: Path) -> None:
    """`report --readme LINK` whose target outside has a block to regenerate: refused, the
    target byte-identical."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "README.md").write_text("# mine\n<!-- commands -->\n<!-- /commands -->\n")
    before = tree_bytes(victim)
    link = tmp_path / "README.md"
    link.symlink_to(victim / "README.md")
    res = cli("report", "--readme", str(link), timeout=60)
    # (the fix names the file the link points to since the twenty-sixth pass: pass26_b)
    refused(res, BenchError.exit_code, f"{link}: it is a symlink to {victim / 'README.md'}",
            f"run `kvprefetch report --readme {victim / 'README.md'}`")
    assert tree_bytes(victim) == before


# ------------------------------------------------ R13, R11: --readme reads a bounded text file


def test_report_readme_refuses_a_binary_file_or_a_fifo(tmp_path: Path) -> None:
    """R13: a binary --readme was a UnicodeDecodeError traceback; R11: a FIFO hung."""
    binary = tmp_path / "README.md"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00binary")
    refused(cli("report", "--readme", str(binary), timeout=60), BenchError.exit_code,
            f"cannot read {binary}: it is not UTF-8 text")
    assert binary.read_bytes().startswith(b"\x89PNG")
    fifo = tmp_path / "fifo.md"
    os.mkfifo(fifo)
    refused(cli("report", "--readme", str(fifo), timeout=60), BenchError.exit_code,
            f"cannot read {fifo}", "not a regular file")
    big = tmp_path / "big.md"
    big.write_bytes(b"x" * ((4 << 20) + 1))
    refused(cli("report", "--readme", str(big), timeout=60), BenchError.exit_code,
            "larger than")


def test_e2e_model_dir_never_writes_through_a_symlink(tmp_path: Path, outside: Path) -> None:
    """bench e2e's generated model folder: a planted config.json link is refused."""
    from kvprefetch.bench.e2e import write_model_dir

    dest = tmp_path / "model"
    dest.mkdir()
    (dest / "config.json").symlink_to(outside / "baseline.json")
    with pytest.raises(BenchError, match="is a symlink"):
        write_model_dir(dest)
