"""What a user sees on the console: quiet logging, one-line errors, exit codes.

Exit codes: 0 success; 2 bad input or flags (one line, no traceback: the
message names the file, row or flag); 130 interrupted (Ctrl-C: one line);
anything else is a bug or an infrastructure failure and shows its traceback
(exit 1).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from typing import Callable, Iterator, Optional, Sequence

from dpsynth.pipelines.help_format import DefaultsHelpFormatter

# TensorFlow's C++ start-up chatter drowns our progress lines.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

log = logging.getLogger("dpsynth")
# Exact row counts of a running job: the operator's console only (like
# Beam's counters), never the release, the manifest or dpsynth's own log.
operator_log = logging.getLogger("dpsynth.operator")

# Log records from other libraries that say nothing a dpsynth user can act on.
_NOISE = ("apitools not found", "Discarding unparseable args",
          "Missing pipeline option (runner)", "Falling back to ",
          "Could not find a compatible version of the Prism",
          "Prism", "is not installed")
# Markers of our own error types inside Beam's wrapped worker exceptions.
ERROR_MARKERS = ("InputError: ", "ImageInputError: ", "EncoderError: ",
                 "EncoderUnavailableError: ", "BadImagesError: ")


class _DropNoise(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        # While quiet_stderr runs, other libraries' records go to the
        # runner's log (_LibraryLog), not to the console.
        self.ours_only = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("dpsynth"):
            return True
        if self.ours_only or _stopped:
            return False  # while a job runs, or after Ctrl-C ended it
        return _worth_keeping(record)


class _LibraryLog(logging.StreamHandler):
    """While quiet_stderr runs: other libraries' records, to the runner's
    log file beside the workers' own output. Beam's runner logs its
    workers' ends there (a data-plane stream that broke, a worker handler
    that failed to close): after Ctrl-C that is every worker's interrupt,
    in whatever order the runner and its workers saw it, and none of it
    belongs on the console (its log is deleted)."""

    def __init__(self, path: str) -> None:
        super().__init__(open(path, "a", encoding="utf-8"))
        self.errors = 0
        self.setFormatter(logging.Formatter(
            "%(levelname)s:%(name)s: %(message)s"))

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith("dpsynth") and \
            _worth_keeping(record)

    def emit(self, record: logging.LogRecord) -> None:
        if self.stream.closed:  # a thread's record, sent as the job ended
            return
        if record.levelno >= logging.ERROR:
            self.errors += 1
        super().emit(record)

    def close(self) -> None:
        self.acquire()  # not while a thread emits
        try:
            self.stream.close()
        finally:
            self.release()
        super().close()


def _worth_keeping(record: logging.LogRecord) -> bool:
    """Whether another library's record says something a user can act on."""
    text = _message(record)
    exc = record.exc_info[1] if record.exc_info else None
    if "KeyboardInterrupt" in text or (exc is not None and interrupted(exc)):
        return False  # Ctrl-C: one line from run_command, no traceback
    if any(marker in text for marker in _NOISE):
        return False
    # Beam logs a worker's exception before re-raising it; bad input is
    # reported once, as one line (see fail()).
    return not (exc is not None and any(
        m in f"{type(exc).__name__}: " for m in ERROR_MARKERS)) and not any(
        m in text for m in ERROR_MARKERS)


def _message(record: logging.LogRecord) -> str:
    """The record's text with its arguments (Beam relays a worker's log
    records as ``"Worker: %s"``, the worker's text an argument)."""
    try:
        return record.getMessage()
    except Exception:  # bad arguments: logging reports it when it prints
        return str(record.msg)


class _Format(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        if record.name.startswith("dpsynth"):
            prefix = "dpsynth: " if record.levelno < logging.WARNING else \
                f"dpsynth: {record.levelname.lower()}: "
            return prefix + record.getMessage()
        return super().format(record)


def setup_logging(verbose: bool = False) -> None:
    """dpsynth's own lines at INFO; other libraries only at ERROR (WARNING
    and their INFO with --verbose). Idempotent."""
    root = logging.getLogger()
    handler = next((h for h in root.handlers
                    if getattr(h, "_dpsynth", False)), None)
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        handler._dpsynth = True  # type: ignore[attr-defined]
        handler.addFilter(_DropNoise())
        root.addHandler(handler)
    _point(handler, sys.stderr)  # the current one (tests swap it)
    handler.setFormatter(_Format("%(levelname)s:%(name)s: %(message)s"))
    for other in list(root.handlers):  # a basicConfig's: lines twice
        if type(other) is logging.StreamHandler and other is not handler:
            root.removeHandler(other)
    root.setLevel(logging.INFO if verbose else logging.ERROR)
    logging.getLogger("dpsynth").setLevel(logging.DEBUG if verbose
                                          else logging.INFO)
    for name in ("apache_beam", "absl", "tensorflow", "distributed", "dask"):
        logging.getLogger(name).setLevel(logging.INFO if verbose
                                         else logging.ERROR)


def fail(message: str) -> int:
    """Prints a one-line error; returns exit code 2."""
    # Beam appends " [while running '<step>']" to worker errors: noise here.
    message = message.split(" [while running '", 1)[0].strip()
    print(f"dpsynth: error: {message}", file=sys.stderr)
    return 2


def _silent(args) -> None:
    pass


_SILENT = _silent


def silence_dying_threads() -> None:
    """After Ctrl-C the runner's gRPC threads die with tracebacks of the
    same interrupt (workers gone): nothing for the user to act on."""
    threading.excepthook = _SILENT


def _to_runner_log(path: str):
    def hook(args) -> None:
        import traceback
        with open(path, "a", encoding="utf-8") as log_file:
            print(f"Exception in thread {getattr(args.thread, 'name', '?')}:",
                  file=log_file)
            traceback.print_exception(args.exc_type, args.exc_value,
                                      args.exc_traceback, file=log_file)
    return hook


def interrupted(err: BaseException) -> bool:
    """Ctrl-C, also when a runner re-raised it from inside a pass (Beam
    wraps it: ``RuntimeError: KeyboardInterrupt [while running '...']``)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, KeyboardInterrupt) or str(err).startswith(
                "KeyboardInterrupt"):
            return True
        err = err.__cause__ or err.__context__
    return False


def inner_error(err: BaseException) -> Optional[str]:
    """Beam wraps worker exceptions; our own input errors inside them are
    surfaced as one line (other errors keep their traceback: they are bugs
    or infrastructure failures, not bad input)."""
    text = str(err)
    for marker in ERROR_MARKERS:
        if marker in text:
            return text.split(marker, 1)[1].splitlines()[0].strip()
    return None


_ctrl_c = threading.Event()
_stopped_by: Optional[int] = None  # the signal that stopped the command


def interrupt_main_thread() -> None:
    """KeyboardInterrupt in the main thread (where a pipeline waits), from
    another thread. ``_thread.interrupt_main`` does nothing where SIGINT is
    ignored, as in a background job of a non-interactive shell (``cmd &``
    in a script): a lease taken over at a pass boundary did not stop such a
    run. There the exception is set on the main thread directly."""
    import _thread
    if callable(signal.getsignal(signal.SIGINT)):
        _thread.interrupt_main()
        return
    import ctypes
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(threading.main_thread().ident),
        ctypes.py_object(KeyboardInterrupt))


def _on_stop_signal(signum: int, frame: object) -> None:
    global _stopped_by
    _stopped_by = signum
    _ctrl_c.set()
    raise KeyboardInterrupt


@contextlib.contextmanager
def remember_ctrl_c() -> Iterator[None]:
    """While the block runs, Ctrl-C (SIGINT) and SIGTERM (what Airflow,
    Kubernetes and systemd send to stop a task) are remembered as well as
    raised as KeyboardInterrupt: either stops the job the same way (the
    lease given back at once, nothing half-published, one line).

    Python raises KeyboardInterrupt wherever the main thread is, and not
    every place lets it through: a Ctrl-C while scipy's lazy loader imports
    a submodule (``from scipy import optimize`` under ``import
    pipeline_dp``, in the first ~2 s of a job) was swallowed here, the
    import went on, and the job read its input and published; or the
    submodule was left half-imported and a later import failed with a
    ``NameError``. A remembered Ctrl-C still stops the job before it reads
    or publishes (``stop_if_ctrl_c``) and turns such a later error into the
    one interrupted line. Nested blocks share the outer one's memory."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is _on_stop_signal):
        yield
        return
    global _stopped, _stopped_by
    _ctrl_c.clear()
    _stopped, _stopped_by = False, None
    previous = {sig: signal.signal(sig, _on_stop_signal)
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def ctrl_c_pressed() -> bool:
    return _ctrl_c.is_set()


def stop_if_ctrl_c() -> None:
    """Raises KeyboardInterrupt if Ctrl-C was pressed (see remember_ctrl_c)."""
    if _ctrl_c.is_set():
        raise KeyboardInterrupt


_stopped = False  # Ctrl-C ended the command: nothing more on the console


class InterruptedAfterPublishing(KeyboardInterrupt):
    """Ctrl-C once the release was published: it stays, complete."""

    def __init__(self, output: str) -> None:
        super().__init__(output)
        self.output = output


def stopped_by_ctrl_c(err: Optional[BaseException] = None,
                      command: str = "generate") -> int:
    """The one line a Ctrl-C prints; returns exit code 130 (143 for
    SIGTERM, as a shell reports a process it ended). Other libraries' log
    records after it (Dask's workers ending, asyncio's tasks of a cluster
    that never started) stay off the console."""
    global _stopped
    _stopped = True
    silence_dying_threads()
    what = "stopped (SIGTERM)" if _stopped_by == signal.SIGTERM \
        else "interrupted"
    if isinstance(err, InterruptedAfterPublishing):
        print(f"dpsynth: {what} after the release at {err.output} was "
              "published (it is complete)", file=sys.stderr)
    else:
        made = "published" if command == "generate" else "written"
        print(f"dpsynth: {what}; nothing was {made}", file=sys.stderr)
    return 128 + (_stopped_by or signal.SIGINT)


def run_stoppable(fn: Callable[[], int], command: str) -> int:
    """Runs a whole command (its imports included) with Ctrl-C and SIGTERM
    remembered: one that stops it, or is swallowed and leaves a later error
    behind (see remember_ctrl_c), is the one line."""
    with remember_ctrl_c():
        try:
            return fn()
        except KeyboardInterrupt as err:  # e.g. while Beam was imported
            return stopped_by_ctrl_c(err, command)
        except Exception:
            if ctrl_c_pressed():  # a half-imported module's error
                return stopped_by_ctrl_c(command=command)
            raise


def run_command(fn: Callable[[], int], command: str,
                input_errors: Sequence[type]) -> int:
    """Runs ``fn`` with dpsynth's error policy (see the module docstring)."""
    try:
        return fn()
    except KeyboardInterrupt as err:
        return stopped_by_ctrl_c(err, command)
    except tuple(input_errors) as err:
        return fail(inner_error(err) or str(err))
    except Exception as err:
        if interrupted(err) or ctrl_c_pressed():
            return stopped_by_ctrl_c(command=command)
        inner = inner_error(err)
        if inner is not None:
            return fail(inner)
        raise


@contextlib.contextmanager
def quiet_stderr(verbose: bool) -> Iterator[None]:
    """Sends what other code writes to file descriptor 2 (Beam's worker
    processes, TensorFlow's C++ start-up banners) to a log file instead of
    the console, and other libraries' log records with it; dpsynth's own
    lines still reach the console. On failure the log is kept (its path is
    printed), also on success when a library logged an error in it;
    otherwise (and after Ctrl-C) it is deleted."""
    global _QUIET, _stopped
    if verbose or _QUIET:  # nested: the outer capture is in place
        yield
        return
    _QUIET = True
    sys.stderr.flush()
    saved = os.dup(2)
    fd, path = tempfile.mkstemp(prefix="dpsynth-", suffix=".log")
    old_stderr, streams = sys.stderr, _our_streams()
    # Python-level writers keep their stream unless it is file descriptor 2
    # itself (then they get a copy of the real console).
    console = (os.fdopen(os.dup(saved), "w", buffering=1)
               if _writes_fd2(old_stderr) else old_stderr)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stderr = console
    # Library threads (Beam's gRPC readers) that die print to sys.stderr:
    # their tracebacks belong in the runner's log too.
    old_hook = threading.excepthook
    threading.excepthook = _to_runner_log(path)
    for handler in streams:
        _point(handler, console)
    library = _route_library_records(path, streams)
    _stopped = False
    outcome = "failed"
    try:
        yield
        outcome = "done"
    except BaseException as err:
        # Ctrl-C: the runner's own log holds only the workers' tracebacks
        # of the same interrupt; the console's one line says it all.
        if interrupted(err) or ctrl_c_pressed():
            outcome = "interrupted"
            silence_dying_threads()
        raise
    finally:
        _QUIET = False
        if threading.excepthook is not _SILENT:
            threading.excepthook = old_hook
        os.dup2(saved, 2)
        os.close(saved)
        sys.stderr = old_stderr
        for handler in streams:
            _point(handler, old_stderr)
        _unroute_library_records(library, streams)
        if console is not old_stderr:
            console.close()
        if outcome == "done" and _stopped:  # run_command caught Ctrl-C
            outcome = "interrupted"
        # A job that worked while a library logged errors: kept, to read.
        keep = outcome == "failed" or (outcome == "done" and library.errors)
        if keep and os.path.getsize(path) > 0:
            print(f"dpsynth: the runner's own log is in {path}",
                  file=sys.stderr)
        else:
            os.unlink(path)


def _route_library_records(path: str, streams: list) -> _LibraryLog:
    """Other libraries' log records to the runner's log from now on."""
    library = _LibraryLog(path)
    logging.getLogger().addHandler(library)
    for handler in streams:
        for drop in handler.filters:
            if isinstance(drop, _DropNoise):
                drop.ours_only = True
    return library


def _unroute_library_records(library: _LibraryLog, streams: list) -> None:
    logging.getLogger().removeHandler(library)
    library.close()
    for handler in streams:
        for drop in handler.filters:
            if isinstance(drop, _DropNoise):
                drop.ours_only = False


_QUIET = False


def _writes_fd2(stream) -> bool:
    try:
        return stream.fileno() == 2
    except (AttributeError, OSError, ValueError):
        return False


def _point(handler: logging.StreamHandler, stream) -> None:
    """handler.setStream without flushing the old stream (it may be closed:
    a finished test's capture, or our console copy)."""
    handler.acquire()
    try:
        handler.stream = stream
    finally:
        handler.release()


def _our_streams() -> list:
    return [h for h in logging.getLogger().handlers
            if getattr(h, "_dpsynth", False)]


class ProgressPrinter:
    """Tails a ``dpsynth.transforms.progress.ProgressFile`` in a thread and prints,
    every ``every`` seconds or when a new pass starts, one line: elapsed
    time and the pass. The exact rows each pass has read so far are private
    (they are n); they are printed only with ``show_rows`` (the operator's
    ``--show-row-counts``), never by default: schedulers forward the console
    to logs that more people read. Without a file (remote runners) it
    prints the elapsed time only.

    Not interactive (the console is not a terminal: an Airflow task log, a
    CI log, a file) it prints no clock and nothing periodic: one line per
    pass, every pass of the plan in order, and the end. Elapsed times grow
    with n, so they stay on an operator's terminal. ``on_pass`` is called
    (in the printer's thread) when a new pass starts; if it raises, the
    main thread is interrupted (the run stops: see ``stopped_by``)."""

    LABELS = {"Centre": "DP centre", "Read": "reading the input",
              "TreeCounts": "tree counts", "LeafSums": "tree leaf sums",
              "Moments": "moments", "SecondMoment": "second moment",
              "Votes": "vote filter",
              "Counts": "DP centre + class counts",
              "ClassSubspace": "class subspace moments"}

    def __init__(self, path: Optional[str], passes: Sequence[str],
                 every: float = 10.0, show_rows: bool = False,
                 done: int = 0, more_to_come: bool = False,
                 interactive: Optional[bool] = None,
                 on_pass: Optional[Callable[[], None]] = None) -> None:
        """``done``: passes an earlier pipeline of the job ran, and
        ``more_to_come``: a later pipeline's passes (not known yet) follow
        (no total shown): the adaptive plan's two phases count as one.
        ``on_pass`` runs at each pass boundary and may stop the run."""
        self.path, self.passes, self.every = path, list(passes), every
        self.show_rows = show_rows
        self._done, self._open_ended = done, more_to_come
        self.interactive = (console_is_terminal() if interactive is None
                            else interactive)
        self.on_pass = on_pass
        self.stopped_by: Optional[BaseException] = None
        self._rows: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._start = time.time()
        self._offset = 0
        self._shown: Optional[str] = None
        self._last = 0.0

    def label(self, name: str) -> str:
        if name.startswith("Lloyd"):
            return f"Lloyd round {name[5:]}"
        return self.LABELS.get(name, name)

    def __enter__(self) -> "ProgressPrinter":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._poll(final=not any(exc))

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            self._poll()

    def _read(self) -> Optional[str]:
        """Adds new lines to the row counts; returns the latest pass."""
        if not self.path or not os.path.exists(self.path):
            return None
        latest = None
        with open(self.path) as f:
            f.seek(self._offset)
            for line in f:
                if not line.endswith("\n"):
                    break
                self._offset += len(line.encode())
                name, _, rows = line.rstrip("\n").partition("\t")
                self._rows[name] = self._rows.get(name, 0) + int(rows)
                latest = name
        return latest

    def _poll(self, final: bool = False) -> None:
        latest = self._read() or self._shown
        now = time.time()
        if final:
            # A short job can run every pass between two polls: its last
            # pass is still shown once, before the end.
            if latest is not None and latest != self._shown:
                self._show_up_to(latest, now)
            operator_log.info("%spipeline finished", self._stamp(now))
            return
        if latest != self._shown and latest is not None:
            self._boundary()
        if latest == self._shown and (not self.interactive
                                      or now - self._last < self.every):
            return
        self._show_up_to(latest, now)

    def _boundary(self) -> None:
        """A new pass began: ``on_pass`` may stop the run."""
        if self.on_pass is None or self.stopped_by is not None:
            return
        try:
            self.on_pass()
        except Exception as err:
            self.stopped_by = err
            interrupt_main_thread()

    def _show_up_to(self, latest: Optional[str], now: float) -> None:
        """Not interactive: also the passes that ran between two polls, so
        which lines appear does not depend on how long a pass took."""
        if not self.interactive and latest in self.passes and (
                self._shown is None or self._shown in self.passes):
            first = (0 if self._shown is None
                     else self.passes.index(self._shown) + 1)
            for name in self.passes[first:self.passes.index(latest)]:
                self._show(name, now)
        self._show(latest, now)

    def _stamp(self, now: float) -> str:
        return f"[{_clock(now - self._start)}] " if self.interactive else ""

    def _show(self, latest: Optional[str], now: float) -> None:
        self._shown, self._last = latest, now
        stamp = self._stamp(now)
        if latest is None:
            operator_log.info("%srunning", stamp)
            return
        index = ""
        if latest in self.passes:
            total = "" if self._open_ended else \
                f"/{self._done + len(self.passes)}"
            index = f" {self._done + self.passes.index(latest) + 1}{total}"
        if not self.show_rows:
            operator_log.info("%spass%s: %s", stamp, index,
                              self.label(latest))
            return
        operator_log.info("%spass%s, %s: %s rows read", stamp, index,
                          self.label(latest), f"{self._rows.get(latest, 0):,}")


def console_is_terminal() -> bool:
    """Whether dpsynth's console lines reach a terminal (not a task log)."""
    handler = next(iter(_our_streams()), None)
    stream = getattr(handler, "stream", None) or sys.stderr
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no 40-line usage before them) and no
    abbreviated flags (``--clip`` must not silently mean ``--clip-norm``)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        # One prefix for every error line, whoever finds it.
        print(f"dpsynth: error: {message} (see {self.prog} --help)",
              file=sys.stderr)
        raise SystemExit(2)


# Installed at import, before Beam is imported: Beam logs some warnings (e.g.
# "apitools not found") while its modules load.
setup_logging()
