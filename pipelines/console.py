"""What a user sees on the console: quiet logging, one-line errors, exit codes.

Exit codes: 0 success; 2 bad input or flags (one line, no traceback: the
message names the file, row or flag); 130 interrupted (Ctrl-C: one line);
anything else is a bug or an infrastructure failure and shows its traceback
(exit 1).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Callable, Optional, Sequence

# TensorFlow's C++ start-up chatter drowns our progress lines.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

log = logging.getLogger("dpsynth")

# Log records from other libraries that say nothing a dpsynth user can act on.
_NOISE = ("apitools not found", "Discarding unparseable args",
          "Missing pipeline option (runner)", "Falling back to ",
          "Could not find a compatible version of the Prism",
          "Prism", "is not installed")
# Markers of our own error types inside Beam's wrapped worker exceptions.
ERROR_MARKERS = ("InputError: ", "ImageInputError: ", "EncoderError: ",
                 "EncoderUnavailableError: ")


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("dpsynth"):
            return True
        text = str(record.msg)
        if any(marker in text for marker in _NOISE):
            return False
        exc = record.exc_info[1] if record.exc_info else None
        # Beam logs a worker's exception before re-raising it; bad input is
        # reported once, as one line (see fail()).
        return not (exc is not None and any(
            m in f"{type(exc).__name__}: " for m in ERROR_MARKERS)) and not any(
            m in text for m in ERROR_MARKERS)


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


def inner_error(err: BaseException) -> Optional[str]:
    """Beam wraps worker exceptions; our own input errors inside them are
    surfaced as one line (other errors keep their traceback: they are bugs
    or infrastructure failures, not bad input)."""
    text = str(err)
    for marker in ERROR_MARKERS:
        if marker in text:
            return text.split(marker, 1)[1].splitlines()[0].strip()
    return None


def run_command(fn: Callable[[], int], command: str,
                input_errors: Sequence[type]) -> int:
    """Runs ``fn`` with dpsynth's error policy (see the module docstring)."""
    try:
        return fn()
    except KeyboardInterrupt:
        print(f"dpsynth {command}: interrupted; nothing was published",
              file=sys.stderr)
        return 130
    except tuple(input_errors) as err:
        return fail(str(err))
    except Exception as err:
        inner = inner_error(err)
        if inner is not None:
            return fail(inner)
        raise


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no 40-line usage before them) and no
    abbreviated flags (``--clip`` must not silently mean ``--clip-norm``)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class",
                          argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        print(f"{self.prog}: error: {message} (see {self.prog} --help)",
              file=sys.stderr)
        raise SystemExit(2)


# Installed at import, before Beam is imported: Beam logs some warnings (e.g.
# "apitools not found") while its modules load.
setup_logging()
