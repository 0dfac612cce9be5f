"""Ctrl-C inside a Beam pass: one line, exit 130, nothing published, the
budget store consistent (the attempt failed, its lease given back)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from dpsynth.pipelines.budget import store as budget_store
from dpsynth.pipelines.release import release
from tests.conftest import gmm_data

REPO = Path(__file__).resolve().parent.parent

# The read of the first pass blocks (in the in-process DirectRunner) until
# the test interrupts it, as a user pressing Ctrl-C mid-pass would.
SLOW_READ = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {repo!r})
    from dpsynth.pipelines import cli
    from dpsynth.transforms.io import read
    real = read._ReadBlocksFn.process

    def slow(self, r):
        open({mark!r}, "w").close()
        time.sleep(120)
        yield from real(self, r)

    read._ReadBlocksFn.process = slow
    sys.exit(cli.main(sys.argv[1:]))
""")


def _ctrl_c_once_reading(proc: subprocess.Popen, mark: Path,
                         sigterm: bool = False) -> str:
    """Waits until the job's read has begun (``mark`` exists), sends
    Ctrl-C (or SIGTERM) and returns the job's stderr."""
    deadline = time.time() + 180
    while not mark.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "the pass never started"
        time.sleep(0.1)
    time.sleep(0.3)
    if sigterm:
        proc.terminate()  # to the process alone, as a scheduler may
    else:
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: the group
    return proc.communicate(timeout=120)[1]


def test_ctrl_c_inside_a_pass_is_one_line_and_exit_130(tmp_path):
    x, y = gmm_data(300, d=4, classes=2)
    np.savez(tmp_path / "in.npz", embeddings=x, labels=y)
    mark, out, store = tmp_path / "reading", tmp_path / "out", \
        tmp_path / "b"
    code = SLOW_READ.format(repo=str(REPO), mark=str(mark))
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "generate", "--input",
         str(tmp_path / "in.npz"), "--num-classes", "2", "--output", str(out),
         "--run-id", "r1", "--budget-store", str(store), "--dataset-id", "p",
         "--lifetime-epsilon", "10"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True)
    err = _ctrl_c_once_reading(proc, mark)
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert lines[-1] == "dpsynth: interrupted; nothing was published"
    assert not any("Traceback" in l or "KeyboardInterrupt" in l
                   for l in lines), err
    assert len(lines) <= 6, err  # the plan, progress lines, the one line
    assert not release.release_exists(str(out))
    assert release.staging_folders(str(out), "r1") == {}
    (entry,) = budget_store.history(str(store), "p")
    assert entry["status"] == budget_store.FAILED  # read data: charged
    assert entry["lease_until"] == 0  # a retry need not wait
    assert not list(tmp_path.glob("dpsynth-*.log"))


SLOW_LAUNCH = SLOW_READ.replace(
    "from dpsynth.pipelines import cli", "from dpsynth.deploy import launch").replace(
    "cli.main(", "launch.main(")


@pytest.mark.parametrize("entry", ["dpsynth", "deploy/launch.py"])
def test_sigterm_inside_a_pass_stops_the_job_like_ctrl_c(tmp_path, entry):
    """What Airflow (deploy/launch.py under the Beam operator), Kubernetes
    or systemd send to stop a task: the lease is given back at once (a
    retry need not wait for it), nothing is published, one line, 143."""
    x, y = gmm_data(300, d=4, classes=2)
    np.savez(tmp_path / "in.npz", embeddings=x, labels=y)
    mark, out, store = tmp_path / "reading", tmp_path / "out", \
        tmp_path / "b"
    script = SLOW_READ if entry == "dpsynth" else SLOW_LAUNCH
    code = script.format(repo=str(REPO), mark=str(mark))
    argv = ["generate"] if entry == "dpsynth" else []
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *argv, "--input",
         str(tmp_path / "in.npz"), "--num-classes", "2", "--output", str(out),
         "--run-id", "r1", "--budget-store", str(store), "--dataset-id", "p",
         "--lifetime-epsilon", "10"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True)
    err = _ctrl_c_once_reading(proc, mark, sigterm=True)
    assert proc.returncode == 143, err
    lines = err.strip().splitlines()
    assert lines[-1] == "dpsynth: stopped (SIGTERM); nothing was published"
    assert not any("Traceback" in l for l in lines), err
    assert not release.release_exists(str(out))
    (entry_,) = budget_store.history(str(store), "p")
    assert entry_["status"] == budget_store.FAILED
    assert entry_["lease_until"] == 0


# With worker processes the slow read must run in the workers: every
# process of the job (the runner, the worker fork server, the workers it
# forks) imports this at start-up from PYTHONPATH.
SLOW_SITE = textwrap.dedent("""
    import os, time
    if os.environ.get("DPSYNTH_TEST_SLOW_MARK"):
        from dpsynth.transforms.io import read
        real = read._ReadBlocksFn.process

        def slow(self, r):
            open(os.environ["DPSYNTH_TEST_SLOW_MARK"], "w").close()
            time.sleep(120)
            yield from real(self, r)

        read._ReadBlocksFn.process = slow
""")


def _session_processes(sid: int) -> list[str]:
    """The processes still alive in session ``sid`` (pid and command)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) != sid:
                continue
            alive.append(entry.name + " " + (entry / "cmdline").read_bytes()
                         .replace(b"\0", b" ").decode(errors="replace"))
        except (OSError, ProcessLookupError):
            continue
    return alive


def test_ctrl_c_with_worker_processes_is_one_line_and_leaves_no_process(
        tmp_path):
    """Two DirectRunner workers (forked by dpsynth.pipelines.runners.worker_fork): Ctrl-C
    prints one line, not every worker's interrupted harness, and the job's
    processes all end."""
    x, y = gmm_data(3000, d=4, classes=2)
    np.savez(tmp_path / "in.npz", embeddings=x, labels=y)
    site, mark, out = tmp_path / "site", tmp_path / "reading", \
        tmp_path / "out"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_SITE)
    env = dict(os.environ, DPSYNTH_TEST_SLOW_MARK=str(mark),
               PYTHONPATH=os.pathsep.join([str(site), str(REPO)]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpsynth.pipelines.cli", "generate", "--input",
         str(tmp_path / "in.npz"), "--num-classes", "2", "--output",
         str(out), "--direct_num_workers", "2"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True)
    err = _ctrl_c_once_reading(proc, mark)
    assert proc.returncode == 130, err
    lines = [l for l in err.strip().splitlines()
             if "bson" not in l and "apitools" not in l]  # import chatter
    assert lines[-1] == "dpsynth: interrupted; nothing was published"
    assert not any("KeyboardInterrupt" in l or "Traceback" in l
                   for l in lines), err
    assert len(lines) <= 6, err
    assert not release.release_exists(str(out))
    deadline = time.time() + 30
    while _session_processes(proc.pid) and time.time() < deadline:
        time.sleep(0.2)
    assert not _session_processes(proc.pid), _session_processes(proc.pid)


def _swallowed_ctrl_c() -> None:
    """Ctrl-C arriving inside a library that swallows it (measured: scipy's
    lazy submodule import under ``import pipeline_dp``)."""
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)  # the handler runs here
    except BaseException:
        pass


def test_a_ctrl_c_a_library_swallowed_still_stops_the_job(
        tmp_path, capsys, monkeypatch):
    from dpsynth.pipelines import cli, job_plan
    real = job_plan.prepare

    def prepare(spec):
        _swallowed_ctrl_c()
        return real(spec)
    monkeypatch.setattr(job_plan, "prepare", prepare)
    x, y = gmm_data(300, d=4, classes=2)
    np.savez(tmp_path / "in.npz", embeddings=x, labels=y)
    out, store = tmp_path / "out", tmp_path / "b"
    before = signal.getsignal(signal.SIGINT)
    rc = cli.main(["generate", "--input", str(tmp_path / "in.npz"),
                   "--num-classes", "2", "--output", str(out),
                   "--run-id", "r1", "--budget-store", str(store),
                   "--dataset-id", "p", "--lifetime-epsilon", "10"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 130
    assert err[-1] == "dpsynth: interrupted; nothing was published"
    assert not release.release_exists(str(out))
    (entry,) = budget_store.history(str(store), "p")
    # stopped before reading: the attempt stays reserved, for a retry to
    # take over at no new cost, and its lease is given back
    assert entry["status"] == budget_store.RESERVED
    assert entry["lease_until"] == 0
    assert signal.getsignal(signal.SIGINT) is before  # given back


def test_the_error_a_swallowed_ctrl_c_leaves_is_the_one_line(
        tmp_path, capsys, monkeypatch):
    """Ctrl-C while Beam is imported (before any job), swallowed, then the
    half-imported module's own error: one line, exit 130."""
    from dpsynth.pipelines import cli

    def build_parser(only=None):
        _swallowed_ctrl_c()
        raise NameError("name '_signal_api' is not defined")
    monkeypatch.setattr(cli, "build_parser", build_parser)
    assert cli.main(["generate", "--output", str(tmp_path / "o")]) == 130
    assert capsys.readouterr().err.splitlines() == [
        "dpsynth: interrupted; nothing was published"]


def test_ctrl_c_while_beam_is_imported_is_one_line(tmp_path, capsys,
                                                  monkeypatch):
    from dpsynth.pipelines import cli

    def build_parser(only=None):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "build_parser", build_parser)
    assert cli.main(["generate", "--output", str(tmp_path / "o")]) == 130
    assert capsys.readouterr().err.splitlines() == [
        "dpsynth: interrupted; nothing was published"]
    assert cli.main(["--version"]) == 0  # the next call is not interrupted


def test_ctrl_c_after_publishing_says_the_release_is_there(
        tmp_path, capsys, monkeypatch):
    """Ctrl-C between publishing and recording it: the line must not say
    that nothing was published; the release is complete, and a retry of
    the run id finishes at no new cost."""
    from dpsynth.pipelines import cli
    from dpsynth.pipelines.release import protocol

    def checkpoint(step):
        if step == "published":
            raise KeyboardInterrupt
    x, y = gmm_data(300, d=4, classes=2)
    np.savez(tmp_path / "in.npz", embeddings=x, labels=y)
    out, store = tmp_path / "out", tmp_path / "b"
    argv = ["generate", "--input", str(tmp_path / "in.npz"), "--num-classes",
            "2", "--output", str(out), "--run-id", "r1", "--budget-store",
            str(store), "--dataset-id", "p", "--lifetime-epsilon", "10"]
    with monkeypatch.context() as patch:
        patch.setattr(protocol, "checkpoint", checkpoint)
        assert cli.main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"dpsynth: interrupted after the release at {out} "
                       "was published (it is complete)")
    assert release.release_exists(str(out))
    published = release.read_manifest(str(out))
    assert cli.main(argv) == 0
    assert release.read_manifest(str(out)) == published
    (entry,) = budget_store.history(str(store), "p")
    assert entry["status"] == "published"


def test_ctrl_c_in_encode_says_nothing_was_written(tmp_path, capsys,
                                                    monkeypatch):
    from dpsynth.pipelines import cli, encode_job

    def run(spec):
        raise KeyboardInterrupt
    monkeypatch.setattr(encode_job, "run", run)
    (tmp_path / "images").mkdir()
    assert cli.main(["encode", "--images", str(tmp_path / "images"),
                     "--output", str(tmp_path / "e.npz")]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        "dpsynth: interrupted; nothing was written")
