"""Issue 41, the twenty-fourth hostile pass (tester d: the generated job scripts as they run on
a node, and the jobs' environment allow-list, ``slurm/job_env.py``). Each test fails without
its fix (checked by reverting ``src`` and running it):

- glibc's loader looks for a library in subfolders of each ``LD_LIBRARY_PATH`` entry before
  the entry itself: ``glibc-hwcaps/x86-64-v4`` to ``v2``, and (glibc up to 2.36, this
  machine's) ``tls/``, ``x86_64/`` and their combinations (``LD_DEBUG=libs`` lists them).
  Submit and the job checked only the entry, so ``LD_LIBRARY_PATH=~/lib`` with the campaign at
  ``~/lib/x86_64`` (or ``~/lib/tls``, ``~/lib/glibc-hwcaps/x86-64-v2``) passed submit, and the
  merge job's bash loaded a ``libtinfo.so.6`` planted in the campaign before its first line
  (3 runs of 3, one per subfolder); the job kept the entry too, so every later program (``mv``
  writing the exit record) loaded from there as well. Now submit refuses an entry with a
  subfolder the loader searches in (or through a link into) the campaign, and the job drops
  such an entry.
- The job checked ``TMPDIR``, ``HOME``, ``CUDA_HOME`` and ``CUDA_PATH`` again as the node sees
  them (a bind mount of the campaign there, a link made after submit), but not the files the
  job's programs read by a passed value: ``TZ`` (every Python reads the zone file as it starts)
  and the certificates. A ``TZ`` naming a zone in a bind mount of the campaign that the node
  has and the submitting machine does not passed submit, and a FIFO the campaign's writer put
  at the zone's name had the merge job's Python block before its first instruction (killed
  after 20 s; a real job waits out Slurm's time limit: hang, 1 run of 1). Now the job checks
  those files as it checks the folders, and refuses with a fix.

- ``CUDA_HOME`` and ``CUDA_PATH`` were checked to be outside the campaign, not to be free of
  it: ``CUDA_HOME=~/cu`` with the campaign at ``~/cu/bin`` passed submit and the job, and the
  build job (the real one: sdist unpacked, kernels compiled by the kit's ninja) ran the
  ``nvcc`` planted in the campaign for each kernel (1 run of 1; stopped after six). Now submit
  and the job refuse a toolkit folder that holds the campaign, or whose ``bin``, ``nvvm``,
  ``include``, ``targets``, ``lib64`` or ``lib`` reaches it.
- A job writes its exit record (and verify's report) only in the folder it resolved, and
  compared that folder's path as the kernel gives it with the path as planned: a campaign
  reached through a link on the node (``/home`` a link to ``/gpfs/home``, or the folder moved
  and linked back) made every job refuse to write its record, blaming "another process
  changing the campaign" (wrong-way message, 1 run of 1); ``slurm status`` then had no
  record to read. Now the campaign's part is compared as the job resolved it at its start.
- Each job left the campaign for ``/`` before ``python -m kvprefetch``, which puts its
  working folder first on ``sys.path``: a campaign planned in ``/`` itself (``/kvprefetch``;
  or bind-mounted there, as a container does) is a folder of ``/``, and every job imported
  the campaign's ``__init__.py`` in place of the kit (1 run of 1, in a mount namespace with
  the campaign bind-mounted at ``/kvprefetch`` and a chroot). Now the kit runs in its own
  folder, the one ``PYTHONPATH`` already puts first.
- sbatch passes every ``SLURM_*`` of the submitting shell on, whatever ``--export`` says,
  and a ``--scratch node`` build works in ``$SLURM_TMPDIR`` where set. One in the campaign
  passed submit; each build job refused it, telling the user to "plan the campaign again with
  --scratch node", which is that very folder (wrong-way message, 1 run of 1). Now submit
  checks ``SLURM_TMPDIR`` as a passed folder (exit 2, "unset it in this shell"), and the
  job's refusal names ``SLURM_TMPDIR`` and where it came from.
- The same for ``HOME``, which may hold the campaign (it usually does) but not where the
  job's programs read their settings, user site and caches: with the campaign at
  ``~/.config``, submit and the job passed ``HOME``, and git (run by each bench task for the
  kit's commit) read ``~/.config/git/config`` from the campaign, whose ``core.fsmonitor`` it
  ran (shown with git on a repository here, 1 run of 1). Now submit and the job refuse a
  ``HOME`` whose ``.config``, ``.gitconfig``, ``.local``, ``.cache``, ``.nv``, ``.triton``
  or ``.pip`` is in or reaches the campaign. (Since replaced: each job makes a HOME of its
  own, and the user's is never read; test_job_home.py.)
- ``kit_info`` (the kit's version and commit, recorded by ``slurm plan``, ``bench kernel`` and
  every bench task of a campaign) ran ``git status`` in the kit's checkout, which refreshes
  that checkout's index as it reads it: ``.git/index`` was rewritten (under ``index.lock``)
  by a plan whose kit files had new times, a file outside any work directory or campaign
  (1 run of 1), and a user's ``git commit`` there at that moment would fail on the lock. Now
  git runs with ``GIT_OPTIONAL_LOCKS=0`` and writes nothing.

Slurm is absent: the job scripts are run by bash as Slurm runs them (from ``/``, with the
environment given); the node's own bind mount is made with ``mount --bind`` after submit's
check (root only: skipped elsewhere)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.test_hostile_pass18_e import _fake_lib, _fake_libacl
from tests.integration.test_hostile_pass20_d import _SRC, _bind, _plan, _run
from tests.integration.test_hostile_pass22_d import _dry_run
from tests.integration.test_reliability import outside

__all__ = ["outside"]  # the autouse fixture: every test here checks the outside folder


_SUBFOLDERS = ["x86_64", "tls", "glibc-hwcaps/x86-64-v2", "tls/x86_64/x86_64"]


@pytest.mark.parametrize("sub", [*_SUBFOLDERS, "link"])
def test_submit_refuses_a_library_folder_holding_the_campaign_where_the_loader_looks(
        tmp_path: Path, outside: Path, sub: str) -> None:
    """The campaign at a subfolder of an ``LD_LIBRARY_PATH`` entry that the loader searches
    (or that subfolder the user's link to it): submit refuses, exit 2, naming the value, with
    a fix. Without the check, the job's bash loaded the campaign's ``libtinfo.so.6``."""
    lib = tmp_path / "lib"
    camp = lib / "camp" if sub == "link" else lib / sub
    camp.parent.mkdir(parents=True, exist_ok=True)
    _plan(tmp_path, camp)
    if sub == "link":
        (lib / "glibc-hwcaps").mkdir()
        (lib / "glibc-hwcaps" / "x86-64-v3").symlink_to(camp)
    res = _dry_run(tmp_path, camp, LD_LIBRARY_PATH=f"/usr/lib:{lib}")
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"LD_LIBRARY_PATH='{lib}'" in res.stderr, res.stderr
    assert "subfolder the loader searches" in res.stderr, res.stderr
    assert "To fix: unset LD_LIBRARY_PATH" in res.stderr, res.stderr
    # the same value without the campaign where the loader looks passes
    assert _dry_run(tmp_path, camp, LD_LIBRARY_PATH="/usr/lib").returncode == 0


def test_what_was_at_stake_the_jobs_bash_loads_from_such_a_subfolder(
        tmp_path: Path, outside: Path) -> None:
    """The attack itself (nothing a script can do once bash has started: submit is the
    check): the merge job run with the campaign at ``LD_LIBRARY_PATH``'s ``x86_64/`` loads
    the campaign's ``libtinfo.so.6``."""
    bad = tmp_path / "loaded-by-the-job"
    fake = _fake_lib(tmp_path, "bash", "libtinfo.so.6", bad)
    if fake is None:
        pytest.skip("no C compiler, or this bash does not link libtinfo.so.6")
    lib = tmp_path / "lib"
    camp = lib / "x86_64"
    lib.mkdir()
    _plan(tmp_path, camp)
    shutil.copy(fake, camp / "libtinfo.so.6")
    _run(tmp_path, camp, "40-merge.sbatch", LD_LIBRARY_PATH=str(lib))
    assert bad.exists(), "the attack no longer works here: the test proves nothing"


@pytest.mark.parametrize("sub", _SUBFOLDERS)
def test_the_job_drops_a_library_folder_holding_the_campaign_where_the_loader_looks(
        tmp_path: Path, outside: Path, sub: str) -> None:
    """The job's own check, for an sbatch by hand or a node that sees the folders otherwise:
    the entry is dropped, so ``mv`` (the exit record's rename) never loads a ``libacl.so.1``
    planted in the campaign; the job runs on and records its end."""
    bad = tmp_path / "loaded-by-mv"
    fake = _fake_libacl(tmp_path, bad)
    if fake is None:
        pytest.skip("no C compiler, or this mv does not link libacl.so.1")
    lib = tmp_path / "lib"
    camp = lib / sub
    camp.parent.mkdir(parents=True)
    _plan(tmp_path, camp)
    shutil.copy(fake, camp / "libacl.so.1")
    res = _run(tmp_path, camp, "40-merge.sbatch", LD_LIBRARY_PATH=f"{lib}:/usr/lib")
    assert not bad.exists(), "mv loaded a library planted in the campaign:\n" + res.stderr
    assert (camp / "logs" / "merge-7.exit").read_text().strip() == str(res.returncode)


@pytest.mark.parametrize(("name", "value"), [
    ("TZ", ":{alias}/zone"), ("TZ", "../../..{alias}/zone"),
    ("SSL_CERT_DIR", "/etc/ssl/certs:{alias}"), ("PIP_CERT", "{alias}/zone"),
])
def test_the_job_refuses_a_file_in_a_bind_mount_of_the_campaign_only_the_node_has(
        tmp_path: Path, outside: Path, name: str, value: str) -> None:
    """Submit passes the value (no such mount where it runs); on the node the path is a bind
    mount of the campaign with a FIFO at the zone's name. The job refuses, exit 2, with a fix,
    at once, and records its end; before, its Python blocked on the FIFO for good."""
    camp, alias = tmp_path / "camp", tmp_path / "alias"
    _plan(tmp_path, camp)
    os.mkfifo(camp / "zone")
    val = value.format(alias=alias)
    assert _dry_run(tmp_path, camp, **{name: val}).returncode == 0
    _bind(camp, alias)
    try:
        res = subprocess.run(["bash", str(camp / "scripts" / "40-merge.sbatch")],
                             env={"HOME": str(tmp_path), "SLURM_JOB_ID": "7",
                                  "PATH": "/usr/bin:/bin", name: val},
                             capture_output=True, text=True, timeout=30, check=False, cwd="/")
    except subprocess.TimeoutExpired:
        pytest.fail(f"the job's Python blocked on the FIFO {name} names (hang)")
    finally:
        # a reader blocked on the FIFO (the job's Python, left by the timeout) reads its end
        with contextlib.suppress(OSError):
            os.close(os.open(camp / "zone", os.O_WRONLY | os.O_NONBLOCK))
        subprocess.run(["umount", "-l", str(alias)], check=False)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"refusing to run: {name}={val} names a file in the campaign" in res.stderr
    assert "To fix: submit the campaign with" in res.stderr
    assert (camp / "logs" / "merge-7.exit").read_text() == "2\n"


@pytest.mark.parametrize(("name", "value"), [
    ("TZ", "UTC"), ("TZ", ":Europe/Paris"), ("TZ", "EST5EDT"), ("TZ", "<+03>-3"), ("TZ", ""),
    ("SSL_CERT_DIR", "/etc/ssl/certs:/usr/lib/ssl/certs"), ("PIP_CERT", "/etc/ssl/x.pem"),
])
def test_ordinary_zones_and_certificates_pass_the_jobs_check(
        tmp_path: Path, outside: Path, name: str, value: str) -> None:
    """What a user sets: the job goes past the check (the merge then fails on its missing
    bench result, as with no value at all)."""
    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    res = _run(tmp_path, camp, "40-merge.sbatch", **{name: value})
    assert "refusing to run" not in res.stderr, res.stderr
    assert "bench task 0's result" in res.stderr  # the kit's report ran (pass 32 b's message)


@pytest.mark.parametrize(("name", "how"), [("CUDA_HOME", "bin"), ("CUDA_PATH", "include"),
                                           ("CUDA_HOME", "link")])
def test_a_cuda_toolkit_folder_holding_the_campaign_is_refused(
        tmp_path: Path, outside: Path, name: str, how: str) -> None:
    """The campaign at the toolkit's ``bin`` (or ``include``), or the toolkit's ``lib64`` a
    link of the user's to it: submit refuses (exit 2, naming the value, with a fix), and the
    build job run anyway refuses before it fetches or builds anything, recording its end; the
    ``nvcc`` planted in the campaign never runs."""
    cu, bad = tmp_path / "cu", tmp_path / "nvcc-ran"
    camp = tmp_path / "camp" if how == "link" else cu / how
    cu.mkdir()
    _plan(tmp_path, camp)
    if how == "link":
        (cu / "lib64").symlink_to(camp)
    (camp / "nvcc").write_text(f"#!/bin/sh\necho ran >> {bad}\n")
    (camp / "nvcc").chmod(0o755)
    res = _dry_run(tmp_path, camp, **{name: str(cu)})
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{name}='{cu}' in this shell holds the campaign" in res.stderr, res.stderr
    assert f"To fix: point {name} at a folder that holds the campaign in none" in res.stderr
    assert _dry_run(tmp_path, camp, **{name: "/usr/local/cuda"}).returncode == 0
    res = _run(tmp_path, camp, "10-build-baseline.sbatch", **{name: str(cu)})
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"refusing to run: {name}={cu} holds the campaign" in res.stderr, res.stderr
    assert (camp / "logs" / "build-baseline-7.exit").read_text() == "2\n"
    assert not bad.exists()


def test_a_campaign_reached_through_a_link_on_the_node_still_gets_its_exit_records(
        tmp_path: Path, outside: Path) -> None:
    """Planned at ``real/camp``; on the node ``real`` is a link to where the folder is now.
    The job records its end (no "became a symlink"); a ``logs`` swapped for a link is
    still refused."""
    (tmp_path / "real").mkdir()
    _plan(tmp_path, tmp_path / "real" / "camp")
    (tmp_path / "real").rename(tmp_path / "moved")
    (tmp_path / "real").symlink_to(tmp_path / "moved")
    camp = tmp_path / "real" / "camp"
    res = _run(tmp_path, camp, "40-merge.sbatch")
    assert "became a symlink" not in res.stderr, res.stderr
    assert (camp / "logs" / "merge-7.exit").read_text() == f"{res.returncode}\n"
    (camp / "logs").rename(camp / "old-logs")
    (camp / "logs").symlink_to(outside)
    res = _run(tmp_path, camp, "40-merge.sbatch")
    assert "is a symlink" in res.stderr, res.stderr


_CHROOT_RUN = """#!/bin/bash
set -e
nr=$1; camp=$2; shift 2
for d in usr bin lib lib64 sbin etc root work dev proc tmp; do
  [ -e "/$d" ] || continue
  if [ -L "/$d" ]; then ln -sfn "$(readlink "/$d")" "$nr/$d"; continue; fi
  mkdir -p "$nr/$d"; mount --rbind "/$d" "$nr/$d"
done
mkdir -p "$nr/kvprefetch"; mount --bind "$camp" "$nr/kvprefetch"
exec chroot "$nr" "$@"
"""


def chroot_runner(tmp_path: Path, at: str) -> tuple[
        Path, Callable[..., subprocess.CompletedProcess[str]]]:
    """A folder ``camp`` here, seen at ``at`` (a folder of ``/``) inside a private mount
    namespace and chroot (``_CHROOT_RUN``; nothing outside this test's folder is touched), and
    ``in_root(*argv)``, which runs ``argv`` there. Skipped without root, unshare or a chroot."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare (a mount namespace, a chroot)")
    script, nr, camp = tmp_path / "chroot-run", tmp_path / "root", tmp_path / "camp"
    script.write_text(_CHROOT_RUN.replace("/kvprefetch", at))
    script.chmod(0o755)
    nr.mkdir()
    camp.mkdir()

    def in_root(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["unshare", "-m", "--propagation", "private", str(script),
                               str(nr), str(camp), *argv], capture_output=True, text=True,
                              timeout=120, check=False)

    probe = in_root("true")
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace and chroot here: {probe.stderr.strip()}")
    return camp, in_root


def test_a_campaign_in_the_root_folder_is_never_imported_in_place_of_the_kit(
        tmp_path: Path, outside: Path) -> None:
    """The campaign at ``/kvprefetch`` (a private mount namespace and a chroot whose
    ``/kvprefetch`` is a bind mount of a folder here; nothing outside this test's folder is
    touched), planned there; whoever writes it puts an ``__init__.py`` in it. The merge job
    runs the kit, not that file, and records its end."""
    camp, in_root = chroot_runner(tmp_path, "/kvprefetch")
    bad = tmp_path / "campaign-code-ran"
    res = in_root("env", f"PYTHONPATH={_SRC}", f"TMPDIR={tmp_path}", f"HOME={tmp_path}",
                  sys.executable, "-m", "kvprefetch", "slurm", "plan", "/kvprefetch",
                  "--stand-in", "--batch", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    (camp / "__init__.py").write_text(f"open({str(bad)!r}, 'w').write('ran')\n")
    (camp / "__main__.py").write_text("")
    res = in_root("env", "-i", f"HOME={tmp_path}", "SLURM_JOB_ID=7", "PATH=/usr/bin:/bin",
                  "bash", "/kvprefetch/scripts/40-merge.sbatch")
    assert not bad.exists(), "the job imported the campaign's __init__.py:\n" + res.stderr
    assert "bench-0.json' does not exist" in res.stderr, res.stderr  # the kit's own report
    assert (camp / "logs" / "merge-7.exit").read_text() == f"{res.returncode}\n"


def test_a_slurm_tmpdir_in_the_campaign_is_named_at_submit_and_in_the_job(
        tmp_path: Path, outside: Path) -> None:
    """``SLURM_TMPDIR=<campaign>/tmp`` in the submitting shell: submit refuses, naming it,
    with a fix that works; the build job (the node scratch) names it too."""
    camp = tmp_path / "camp"
    _plan(tmp_path, camp)
    res = _dry_run(tmp_path, camp, SLURM_TMPDIR=str(camp / "tmp"))
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"SLURM_TMPDIR='{camp / 'tmp'}' in this shell is in the campaign" in res.stderr
    assert "To fix: point SLURM_TMPDIR outside the campaign (or unset it)" in res.stderr
    res = _run(tmp_path, camp, "10-build-baseline.sbatch", SLURM_TMPDIR=str(camp / "tmp"))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "a node scratch is SLURM_TMPDIR (where set)" in res.stderr, res.stderr


def git_reads_its_config_there(tmp_path: Path, home: Path, folder: Path) -> None:
    """What was at stake: git run with ``HOME=home`` runs the fsmonitor ``folder/config``
    names (``folder`` is ``~/.config/git``, in the campaign). Skipped where git is missing."""
    git = shutil.which("git")
    if git is None:
        return
    ran = tmp_path / "fsmonitor-ran"
    (folder / "config").write_text(f'[core]\n\tfsmonitor = "echo >> {ran}; true"\n')
    repo = tmp_path / "repo"
    subprocess.run([git, "init", "-q", str(repo)], check=True, capture_output=True)
    subprocess.run([git, "-C", str(repo), "status", "--porcelain"], capture_output=True,
                   check=False, env={"HOME": str(home), "PATH": "/usr/bin:/bin"})
    assert ran.exists(), "git no longer reads ~/.config/git/config: the test proves less"


def test_planning_never_rewrites_the_kits_own_git_index(tmp_path: Path, outside: Path) -> None:
    """A checkout of the kit (its sources, committed) whose files have newer times than its
    index: ``slurm plan`` run from it reads its commit and leaves ``.git/index`` byte for
    byte as it was."""
    git = shutil.which("git")
    if git is None:
        pytest.skip("no git")
    kit = tmp_path / "kit"
    shutil.copytree(_SRC, kit / "src", ignore=shutil.ignore_patterns("__pycache__"))
    ident = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for args in (["init", "-q"], ["add", "-A"], [*ident, "commit", "-qm", "kit"]):
        subprocess.run([git, "-C", str(kit), *args], check=True, capture_output=True)
    index = kit / ".git" / "index"
    before = index.read_bytes()
    later = index.stat().st_mtime + 5
    for f in (kit / "src").rglob("*.py"):
        os.utime(f, (later, later))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPREFETCH", "SLURM",
                                                                     "GIT_"))}
    env.update(PYTHONPATH=str(kit / "src"), TMPDIR=str(tmp_path), HOME=str(tmp_path))
    res = subprocess.run([sys.executable, "-m", "kvprefetch", "slurm", "plan",
                          str(tmp_path / "camp"), "--stand-in", "--batch", "1"], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert index.read_bytes() == before, "slurm plan rewrote the kit checkout's git index"
