"""A partial download is judged dead only on the host that made it (issue 41, left open by the
twenty-seventh hostile pass and closed after the twenty-eighth). A campaign's ``cache/`` is
shared by the nodes; its partial downloads were named by pid alone, so a prepare job on one node
removed another node's running download as a dead pid's. Now a partial's name carries a tag of
its host (``download._partial_name``), and only this host's dead ones, and the old names
without a tag, are removed. Another host is stood for by a tag that is not this one's (two
machines cannot be had here); the pid is a real process's, waited for."""

from __future__ import annotations

import subprocess
from pathlib import Path

from kvprefetch.sources import download


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_only_this_hosts_dead_partials_are_removed(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    pid = _dead_pid()
    ours = download._partial_name().rpartition(".")[2]
    other = "0" * 8 if ours != "0" * 8 else "1" * 8
    mine_dead = folder / f".download-{pid}-aaaa1111.{ours}"
    theirs = folder / f".download-{pid}-bbbb2222.{other}"  # the same pid, on another node
    legacy = folder / f".download-{pid}-cccc3333"  # an older kit's name: judged as before
    for path in (mine_dead, theirs, legacy):
        path.write_bytes(b"partial")
    download._remove_dead_downloads(folder)
    assert sorted(p.name for p in folder.iterdir()) == [theirs.name]


def test_a_partial_is_named_with_this_host(tmp_path: Path) -> None:
    import os

    name = download._partial_name()
    assert name.startswith(f".download-{os.getpid()}-")
    assert name.rpartition(".")[2] == download._partial_name().rpartition(".")[2]
    assert len(name.rpartition(".")[2]) == 8
