"""A fork server for DirectRunner's SDK worker processes.

Each pipeline that Beam's FnApiRunner runs with ``multi_processing``
starts W fresh ``python -m apache_beam.runners.worker.sdk_worker_main``
processes, and each imports Beam's worker and then, in the first stage that
unpickles its steps, PipelineDP (dp_accounting, scipy): 1.9 s of one core
each, for each of the adaptive plan's two pipelines. The server imports
those modules once, in the background (from the moment ``dpsynth
generate``'s flags parse, beside the command's own imports; else while the
job plans), and forks every worker of the job from itself: a worker is
ready in milliseconds.

Why not ``multiprocessing``'s "forkserver": its children re-run the
launching program's ``__main__`` (the spawn protocol), which a user's
script or an Airflow task need not guard; this server runs nothing but
Beam's worker.

Protocol (one JSON object a line; the runner side is ``WorkerServer``):
runner -> server ``{"env": {...}, "cwd": ...}`` (fork one worker) or
``{"kill": pid}``; server -> runner ``{"pid": pid}`` for each fork, in
order, and ``{"exited": pid, "code": c}`` when a worker ends (c as
``subprocess``: negative for a signal). The server ends when the runner's
end of the request pipe closes (the runner called ``close``, which it does
at exit, or died), at once even in the middle of its imports; its workers
end with their control channel, as Beam's do.

Measured on Beam 2.77 (commit 9985d3a; the gain and the fallback are in
``dpsynth.pipelines.runners.direct_runner``, which hands it Beam's
worker starts).
"""

from __future__ import annotations

import json
import os
import select
import selectors
import signal
import subprocess
import sys
import threading
import traceback
import warnings
from typing import Optional

# What every worker of a generate or encode job imports before its first
# element; a module that is missing is skipped. The server then runs a few
# native threads (numpy's and scipy's OpenBLAS pools, the jemalloc of
# pyarrow, which Beam imports): both libraries make fork safe with their
# own fork handlers, as multiprocessing's fork start relies on daily.
WORKER_MODULES = ("apache_beam.runners.worker.sdk_worker_main", "pipeline_dp",
                  "pyarrow.parquet", "dpsynth.transforms.two_phase", "dpsynth.transforms.write",
                  "dpsynth.transforms.io", "dpsynth.transforms.dp_kmeans")


def supported() -> bool:
    """The server needs Linux's process file descriptors (race-free wait
    and kill of a worker it forked)."""
    if not hasattr(os, "pidfd_open") or not hasattr(signal,
                                                    "pidfd_send_signal"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


def write_line(fd: int, message: dict) -> None:
    """``message`` as one JSON line on a pipe, whole (a pipe may take less
    than asked at once)."""
    data = memoryview((json.dumps(message) + "\n").encode())
    while data:
        data = data[os.write(fd, data):]


class ForkedWorker:
    """One worker forked by the server, with the part of
    ``subprocess.Popen``'s interface that Beam's ``SubprocessSdkWorker``
    uses (``wait``, ``poll``, ``kill``, ``returncode``)."""

    def __init__(self, server: "WorkerServer", pid: int) -> None:
        self.pid, self._server = pid, server
        self.returncode: Optional[int] = None
        self._done = threading.Event()

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._done.set()

    def poll(self) -> Optional[int]:
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            self._server.send({"kill": self.pid})


class WorkerServer:
    """The runner's side: starts the server process and forks workers."""

    def __init__(self) -> None:
        req_r, self._req_w = os.pipe()
        self._rep_r, rep_w = os.pipe()
        # stdout and stderr are this process's: the workers print there
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "dpsynth.pipelines.runners.worker_fork", str(req_r),
             str(rep_w)], pass_fds=(req_r, rep_w))
        os.close(req_r)
        os.close(rep_w)
        self._send_lock = threading.Lock()
        self._fork_lock = threading.Lock()  # one fork reply at a time
        self._started: list[int] = []
        self._started_cv = threading.Condition()
        self._workers: dict[int, ForkedWorker] = {}
        self._early_exits: dict[int, int] = {}
        self._alive = True
        threading.Thread(target=self._read_replies, daemon=True,
                         name="dpsynth-worker-server").start()

    @property
    def alive(self) -> bool:
        return self._alive

    def fork(self, env: dict[str, str], cwd: str) -> ForkedWorker:
        """A new worker with this environment and working folder (as
        ``subprocess.Popen(command, env=env)`` would give it)."""
        with self._fork_lock:
            self.send({"env": env, "cwd": cwd})
            with self._started_cv:
                while not self._started and self._alive:
                    self._started_cv.wait()
                if not self._started:
                    raise RuntimeError("dpsynth's worker fork server ended")
                pid = self._started.pop(0)
                worker = ForkedWorker(self, pid)
                self._workers[pid] = worker
                if pid in self._early_exits:
                    worker._exited(self._early_exits.pop(pid))
        return worker

    def send(self, message: dict) -> None:
        """One request line, whole, never interleaved with another's."""
        with self._send_lock:
            write_line(self._req_w, message)

    def close(self, timeout: float = 10.0) -> None:
        """Ends the server (the workers it forked end with their pipeline);
        one that does not end within ``timeout`` seconds is killed."""
        try:
            os.close(self._req_w)
        except OSError:
            pass
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def _read_replies(self) -> None:
        with os.fdopen(self._rep_r, "rb") as replies:
            for line in replies:
                message = json.loads(line)
                with self._started_cv:
                    if "pid" in message:
                        self._started.append(message["pid"])
                        self._started_cv.notify_all()
                        continue
                    pid, code = message["exited"], message["code"]
                    worker = self._workers.pop(pid, None)
                    if worker is None:  # exited before fork() returned
                        self._early_exits[pid] = code
                    else:
                        worker._exited(code)
        with self._started_cv:
            self._alive = False
            self._started_cv.notify_all()
            for worker in self._workers.values():  # server gone: unknown
                worker._exited(-signal.SIGKILL)
            self._workers.clear()


# -- the server process ------------------------------------------------------

def serve(req_fd: int, rep_fd: int) -> None:
    """The server's loop: fork a worker per request, report each exit."""
    _prepare_server(req_fd)
    selector = selectors.DefaultSelector()
    selector.register(req_fd, selectors.EVENT_READ, None)
    pidfds: dict[int, int] = {}  # pid -> pidfd
    pending = b""
    while True:
        for key, _ in selector.select():
            if key.data is not None:  # a worker ended
                _report_exit(key.data, selector, pidfds, rep_fd)
                continue
            chunk = os.read(req_fd, 1 << 16)
            if not chunk:  # the runner closed its end
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                _handle(json.loads(line), req_fd, rep_fd, pidfds, selector)


def _prepare_server(req_fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the runner handles Ctrl-C
    # Python 3.12 warns on fork() while other threads run; the server's are
    # OpenBLAS's and jemalloc's idle pools, whose fork handlers keep the
    # child safe (see WORKER_MODULES).
    warnings.filterwarnings("ignore", r".*use of fork\(\) may lead to "
                            "deadlocks", DeprecationWarning)
    done = threading.Event()
    watch = threading.Thread(target=_exit_if_runner_gone, args=(req_fd, done),
                             daemon=True)
    watch.start()
    for name in WORKER_MODULES:
        try:
            __import__(name)
        except ImportError:
            pass
    from dpsynth.pipelines.runners import bundle_sampler
    bundle_sampler.install()  # its workers' bundles end without a 0.2 s wait
    done.set()
    watch.join()  # no thread of ours when workers are forked


def _exit_if_runner_gone(req_fd: int, done: threading.Event) -> None:
    """While the server imports: ends it at once if the runner closed its
    end of the request pipe with no request in it (it exited before asking
    for a worker, e.g. on a flag error), instead of after the imports."""
    poller = select.poll()
    poller.register(req_fd, select.POLLIN | select.POLLHUP)
    while not done.is_set():
        events = dict(poller.poll(50)).get(req_fd, 0)
        if events & select.POLLIN:  # a request: served after the imports
            return
        if events & select.POLLHUP:
            os._exit(0)


def _handle(message: dict, req_fd: int, rep_fd: int, pidfds: dict[int, int],
            selector: selectors.BaseSelector) -> None:
    """One request: kill a worker, or fork one and watch its pidfd."""
    if "kill" in message:
        fd = pidfds.get(message["kill"])
        if fd is not None:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        return
    pid = _fork_worker(message["env"], message["cwd"],
                       [req_fd, rep_fd, *pidfds.values()], selector)
    pidfds[pid] = os.pidfd_open(pid)
    selector.register(pidfds[pid], selectors.EVENT_READ, pid)
    write_line(rep_fd, {"pid": pid})


def _report_exit(pid: int, selector: selectors.BaseSelector,
                 pidfds: dict[int, int], rep_fd: int) -> None:
    selector.unregister(pidfds[pid])
    _, status = os.waitpid(pid, 0)
    os.close(pidfds.pop(pid))
    write_line(rep_fd, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})




def _fork_worker(env: dict[str, str], cwd: str, close_fds: list[int],
                 selector: selectors.BaseSelector) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        selector.close()
        for fd in close_fds:
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        code = run_sdk_worker(env, cwd)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except KeyboardInterrupt:  # Ctrl-C: the runner says it, once
        code = 128 + signal.SIGINT
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def run_sdk_worker(env: dict[str, str], cwd: str) -> int:
    """In the forked worker: what a fresh ``python -m
    apache_beam.runners.worker.sdk_worker_main`` would see (the runner's
    environment, working folder and ``PYTHONPATH``), then Beam's worker."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
             if p and p not in sys.path]
    sys.path[1:1] = extra
    from apache_beam.runners.worker import sdk_worker_main
    sdk_worker_main.main([])
    return 0


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
    # Nothing to clean up (the workers are processes of their own), and
    # the runner waits for this exit: skip the interpreter's teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
