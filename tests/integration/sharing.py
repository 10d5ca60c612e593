"""How the integration layer runs under pytest-xdist (scripts/test.sh runs the suite with
``-n N --dist loadgroup``) without building its expensive fixtures once per worker.

Two means, one for each kind of fixture:

* **shared once** (``shared_once``): a session fixture whose result is a folder the tests only
  read (the verified sdist, the fetched template work directory, the tagged git repository) is
  built by the first worker that needs it, under a file lock, in a folder every worker of the
  run sees (the parent of the worker's basetemp: ``<basetemp>/popen-gwN`` is each worker's, the
  parent the run's, removed by the controller when the run passes); the others wait on the lock
  and read the finished marker. A build that fails leaves no marker: the next worker builds it
  again, in a new folder. Without xdist the fixture builds in the session's own temp folder, as
  before.
* **one worker** (``assign_groups``): a fixture whose result is a Python object of a run
  (``kernels_build``: the killed, resumed and third build, with their outputs) or a module
  fixture (the overlay build, the one-node Slurm) cannot be handed over as a folder; and
  test_verify and test_pdl_build each run verify-kernel on the kernels build's one work
  directory (its report and cache under verify/), which two workers must not do at once.
  Every test gets an ``xdist_group`` mark: the files whose tests use one of ``GROUPED_FIXTURES``
  share that fixture's group (all on one worker, so the fixture is built once); every other
  file is a group of its own (a module fixture is then built once, and a file's tests keep
  their order, as ``--dist loadfile`` did).

pytest-xdist 3.8 sends a group to one worker by the ``@<group>`` its own collection hook appends
to each marked test's node id, written as ``item._nodeid``; pytest 9.2 keeps the node id in
``item._id`` (a ``NodeId``) and ignores ``_nodeid``, so there the marks alone changed nothing
(every file of the kernels build went to every worker, each building it). ``assign_groups``
therefore runs last (after ``--deselect``, ``-k`` and xdist's hook, which finds no mark yet) and
appends the suffix itself, in whichever of the two the running pytest reads.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# session fixture -> the xdist group of every file whose tests use it (directly or through
# another fixture); a file that uses several takes the first listed
GROUPED_FIXTURES = {"kernels_build": "kernels-build"}
# The groups sent to the workers first, in this order (scripts/test.sh passes
# --no-loadscope-reorder): each holds a build of minutes but few tests, and xdist's own order
# (most tests first) started them last, so that the first fresh parallel rehearsal spent its
# last quarter on the wheel's and the overlay's builds alone. Measured: the slowest setups of
# the serial rehearsal of b3eba42 (overlay 272 s, wheel 198 s, real Slurm 194 s, kernels build
# 184 s, pass 13 b's storms 135 s); every other group is seconds.
SLOW_FIRST = ("kernels-build", "integration/test_overlay", "integration/test_wheel",
              "integration/test_slurm", "integration/test_hostile_pass13_b")


def xdist_worker() -> str | None:
    """This process's xdist worker id (``gw0``...), or None outside xdist."""
    return os.environ.get("PYTEST_XDIST_WORKER") or None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def shared_once(tmp_path_factory: pytest.TempPathFactory, name: str,
                build: Callable[[Path], Any]) -> Any:
    """``build(folder)`` once for the whole run, its (JSON-able) result returned to every
    worker. ``folder`` is new and empty, the build's to fill. Outside xdist: built here, in a new
    folder of this session's basetemp."""
    if xdist_worker() is None:
        return build(tmp_path_factory.mktemp(name))
    root = tmp_path_factory.getbasetemp().parent / "shared"
    root.mkdir(exist_ok=True)
    marker = root / f"{name}.done.json"
    with _locked(root / f"{name}.lock"):
        if marker.is_file():
            return json.loads(marker.read_text())["result"]
        folder = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
        result = build(folder)
        tmp = marker.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"result": result, "by": xdist_worker()}))
        os.replace(tmp, marker)
        return result


def assign_groups(items: list[pytest.Item]) -> None:
    """Give each item its ``xdist_group`` (see the module's docstring). Only called under
    ``--dist loadgroup``, where pytest-xdist registers the marker."""
    by_file: dict[str, str] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        for fixture, group in GROUPED_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()) and path not in by_file:
                by_file[path] = group
    rank: dict[int, int] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        group = by_file.get(path, path.removeprefix("tests/").removesuffix(".py"))
        rank[id(item)] = SLOW_FIRST.index(group) if group in SLOW_FIRST else len(SLOW_FIRST)
        item.add_marker(pytest.mark.xdist_group(group))
        grouped = f"{item.nodeid}@{group}"
        node_id: Any = getattr(item, "_id", None)
        if hasattr(node_id, "parse"):  # pytest >= 9.2: a NodeId
            item._id = type(node_id).parse(grouped)
        else:
            item.__dict__["_nodeid"] = grouped
    items.sort(key=lambda item: rank[id(item)])  # stable: collection order otherwise
