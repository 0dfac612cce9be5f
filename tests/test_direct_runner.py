"""dpsynth.pipelines.runners.direct_runner: Beam's FnApiRunner with several workers closes
its workers at once, runs no empty bundles and forks its workers from a
server that has imported what they need; what stages compute does not
change (the release's byte identity across worker counts is
tests/test_determinism.py, which runs through these patches)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import apache_beam as beam
import pytest

from dpsynth.pipelines.runners import (direct_runner, parallel_shutdown,
                                       skip_empty_bundles, worker_fork)
from dpsynth.pipelines.runners.options import beam_options


class _Handler:
    def __init__(self, delay: float, fail: bool = False) -> None:
        self.delay, self.fail, self.closed = delay, fail, False

    def close(self) -> None:
        time.sleep(self.delay)
        self.closed = True
        if self.fail:
            raise RuntimeError("worker gone")


class _Server:
    closed = False

    def close(self) -> None:
        self.closed = True


class _Manager:
    close_all = parallel_shutdown.close_all

    def __init__(self, handlers) -> None:
        self._cached_handlers = {"env": list(handlers)}
        self._workers_by_id = {"w": handlers[0]}
        self._grpc_server = _Server()


def test_workers_are_closed_at_once_and_errors_are_logged(caplog):
    handlers = [_Handler(0.4) for _ in range(7)] + [_Handler(0.4, fail=True)]
    manager = _Manager(handlers)
    server = manager._grpc_server
    t0 = time.perf_counter()
    manager.close_all()
    took = time.perf_counter() - t0
    assert all(h.closed for h in handlers)
    assert took < 0.4 * len(handlers) / 2  # sequential would take 3.2 s
    assert "Error closing worker_handler" in caplog.text
    assert server.closed and manager._grpc_server is None
    assert not manager._cached_handlers and not manager._workers_by_id


def test_has_input():
    assert not skip_empty_bundles.has_input({})
    assert not skip_empty_bundles.has_input({"a": [], "b": [b""]})
    assert skip_empty_bundles.has_input({"a": [b""], "b": [b"x"]})


class _Bundles(beam.DoFn):
    """Appends one line per bundle that this DoFn's stage runs."""

    def __init__(self, path: str) -> None:
        self.path = path

    def finish_bundle(self) -> None:
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")

    def process(self, x):
        yield x


def test_one_element_stage_runs_one_bundle_large_stage_every_worker(
        tmp_path, monkeypatch):
    here = os.path.dirname(os.path.abspath(__file__))  # workers unpickle
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(  # _Bundles from here
        [here] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    options = beam_options(["--direct_num_workers", "2",
                            "--direct_running_mode", "multi_processing"])
    small, large = tmp_path / "small.txt", tmp_path / "large.txt"
    with beam.Pipeline(options=options) as p:
        _ = (p | "One" >> beam.Create(["only"])
             | "Small" >> beam.ParDo(_Bundles(str(small))))
        _ = (p | "Many" >> beam.Create(list(range(64)))
             | beam.Reshuffle()
             | "Large" >> beam.ParDo(_Bundles(str(large))))
    assert len(small.read_text().split()) == 1  # Beam's would run 2
    assert len(set(large.read_text().split())) == 2  # both workers


def test_install_is_idempotent():
    from apache_beam.runners.portability.fn_api_runner import (
        fn_runner, worker_handlers)
    direct_runner.install()
    direct_runner.install()
    assert (worker_handlers.WorkerHandlerManager.close_all
            is parallel_shutdown.close_all)
    assert (fn_runner.ParallelBundleManager.process_bundle
            is skip_empty_bundles.process_bundle)


# -- the worker fork server (pipelines/runners/worker_fork.py) ------------------------

class _Where(beam.DoFn):
    """Where a worker runs: its parent, an environment variable set after
    the fork server started, its working folder, whether this test
    module's folder (set in PYTHONPATH after the server started) is on
    its path."""

    def process(self, x):
        import sys
        yield (os.getppid(), os.environ.get("DPSYNTH_TEST_MARK"),
               os.getcwd(), HERE in sys.path)


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


needs_pidfd = pytest.mark.skipif(
    not worker_fork.supported(),
    reason="no process file descriptors (pidfd) on this system")


@needs_pidfd
def test_workers_are_forked_from_the_server_and_see_the_runner_env(
        tmp_path, monkeypatch):
    direct_runner.start_worker_server()
    server = direct_runner._server
    monkeypatch.setenv("DPSYNTH_TEST_MARK", "after-start")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [HERE] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "where.txt"
    options = beam_options(["--direct_num_workers", "2",
                            "--direct_running_mode", "multi_processing"])
    with beam.Pipeline(options=options) as p:
        _ = (p | beam.Create(list(range(32))) | beam.Reshuffle()
             | beam.ParDo(_Where()) | beam.Distinct()
             | beam.Map(repr) | beam.io.WriteToText(str(out)))
    rows = {eval(line) for f in tmp_path.glob("where.txt*")
            for line in f.read_text().splitlines()}
    assert rows == {(server._proc.pid, "after-start", str(tmp_path), True)}


@needs_pidfd
def test_a_forked_worker_reports_its_exit_code_and_can_be_killed():
    server = worker_fork.WorkerServer()
    try:
        # no control address: Beam's worker fails at once
        env = {k: v for k, v in os.environ.items()
               if k != "CONTROL_API_SERVICE_DESCRIPTOR"}
        failed = server.fork(env, os.getcwd())
        assert failed.wait(timeout=60) == 1 and failed.poll() == 1
        # a control address nobody answers: the worker waits until killed
        import socket
        with socket.socket() as sock:
            sock.bind(("localhost", 0))
            sock.listen()
            env["CONTROL_API_SERVICE_DESCRIPTOR"] = (
                f'url: "localhost:{sock.getsockname()[1]}"')
            waiting = server.fork(env, os.getcwd())
            time.sleep(0.5)
            assert waiting.poll() is None
            waiting.kill()
            assert waiting.wait(timeout=60) == -9
    finally:
        server.close()
    assert server._proc.returncode == 0
    assert not server.alive or server._proc.poll() is not None


def test_only_the_sdk_worker_command_is_forked():
    python = sys.executable
    main = "apache_beam.runners.worker.sdk_worker_main"
    assert direct_runner.is_sdk_worker_command(f"{python} -m {main}")
    assert not direct_runner.is_sdk_worker_command(f"other -m {main}")
    assert not direct_runner.is_sdk_worker_command(f"{python} -m {main} x")
    assert not direct_runner.is_sdk_worker_command("'unclosed")
    shim = direct_runner._ForkingSubprocess()
    proc = shim.Popen("exit 3", shell=True, env=dict(os.environ))
    assert isinstance(proc, subprocess.Popen) and proc.wait() == 3
    assert shim.PIPE is subprocess.PIPE


@needs_pidfd
def test_a_dead_fork_server_falls_back_to_beams_worker_start(monkeypatch):
    server = worker_fork.WorkerServer()
    server.close()  # gone: fork() cannot reach it
    monkeypatch.setattr(direct_runner, "_server", server)
    monkeypatch.setattr(direct_runner, "_fork_workers", True)
    shim = direct_runner._ForkingSubprocess()
    started = []
    monkeypatch.setattr(subprocess, "Popen",
                        lambda *a, **k: started.append((a, k)) or "spawned")
    command = f"{sys.executable} -m apache_beam.runners.worker.sdk_worker_main"
    assert shim.Popen(command, shell=True, env={}) == "spawned"
    assert started == [((command,), {"shell": True, "env": {}})]


@pytest.mark.parametrize("argv, wanted", [
    ([], False),  # one in-memory worker
    (["--direct_num_workers", "2"], True),
    (["--direct_num_workers=4", "--runner=DirectRunner"], True),
    (["--direct_num_workers", "2", "--direct_running_mode", "in_memory"],
     False),
    (["--direct_running_mode=multi_processing"], True),
    (["--runner", "dask", "--direct_num_workers", "2"], False),
    (["--direct_num_workers", "many"], False),  # refused later, by Beam
])
def test_worker_processes_are_read_from_the_flags_without_beam(argv, wanted):
    from dpsynth.pipelines.runners import runner_names
    assert runner_names.wants_worker_processes(argv) is wanted


@needs_pidfd
def test_a_server_whose_runner_leaves_during_its_imports_ends_at_once():
    """A flag error ends the command before any worker is asked for: the
    server stops importing (~2 s of modules) instead of running on."""
    server = worker_fork.WorkerServer()
    time.sleep(0.2)  # inside its first import
    start = time.monotonic()
    server.close()
    assert time.monotonic() - start < 1.0
    assert server._proc.returncode == 0


@needs_pidfd
def test_the_fork_server_ends_with_its_runner_process():
    """No server left running when the runner's process exits (a scheduler
    that waits for a task's processes sees none)."""
    code = ("from dpsynth.pipelines.runners import direct_runner\n"
            "direct_runner.start_worker_server_for(['--direct_num_workers', "
            "'2'])\n"
            "print(direct_runner._server._proc.pid)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, check=True, cwd=REPO)
    pid = int(out.stdout.split()[-1])
    assert not os.path.exists(f"/proc/{pid}"), f"server {pid} still running"
