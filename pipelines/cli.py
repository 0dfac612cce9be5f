"""The `dpsynth` command line: generate, encode, evaluate."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

# TensorFlow's C++ start-up chatter drowns our progress lines.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from typing import Optional, Sequence

from pipelines import generate

# Sub-commands living in their own modules: (module, description).
_EXTRA_COMMANDS = ("pipelines.encode", "pipelines.evaluate",
                   "pipelines.report")


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="dpsynth: %(message)s",
                        stream=sys.stderr)
    for noisy in ("apache_beam", "absl", "tensorflow", "root"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # getLogger("root") above *is* the root logger: without this our own
    # progress lines (INFO) would be dropped with everyone else's.
    logging.getLogger("dpsynth").setLevel(logging.INFO)
    # Beam logs a worker's exception with its traceback before re-raising it;
    # for bad input we print one clear line instead (see _fail).
    for name in _BEAM_ERROR_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _HideInputErrors) for f in logger.filters):
            logger.addFilter(_HideInputErrors())


_BEAM_ERROR_LOGGERS = ("apache_beam.runners.common",
                       "apache_beam.runners.worker.sdk_worker",
                       "apache_beam.runners.portability.local_job_service")


class _HideInputErrors(logging.Filter):
    """Drops Beam's log records about our InputError (bad input data)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from transforms.io import InputError
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, InputError):
            return False
        return "InputError: " not in str(record.msg)


def _fail(message: str) -> int:
    # Beam appends " [while running '<step>']" to worker errors: noise here.
    message = message.split(" [while running '", 1)[0]
    print(f"dpsynth: error: {message}", file=sys.stderr)
    return 2


def run_generate(args: argparse.Namespace, beam_argv: Sequence[str]) -> int:
    _setup_logging()
    from pipelines import demo, release
    from transforms.io import InputError
    demo_run = args.input is None and not args.images  # prepare() fills input
    try:
        job_output = generate.run(args, beam_argv)
    except (ValueError, InputError, release.ReleaseError) as err:
        return _fail(str(err))
    except Exception as err:  # errors raised inside Beam workers
        inner = _inner_error(err)
        if inner is not None:
            return _fail(inner)
        raise
    print(f"release written to {job_output}")
    if demo_run:
        train, test = demo.demo_files()
        print(demo.utility_line(job_output, test, train))
    return 0


def _inner_error(err: BaseException) -> Optional[str]:
    """Beam wraps worker exceptions; surface our own input errors (other
    errors keep their traceback: they are bugs, not bad input)."""
    text = str(err)
    for marker in ("InputError: ", "ImageInputError: ", "EncoderError: "):
        if marker in text:
            return text.split(marker, 1)[1].splitlines()[0].strip()
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpsynth",
        description="Differentially private synthetic embedding datasets.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="private embeddings -> DP synthetic "
                         "release (no flags: embedded demo)",
                         description=generate.parser().description)
    generate.add_arguments(gen)
    gen.set_defaults(handler=run_generate)
    for name in _EXTRA_COMMANDS:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        module.register(sub)
    return parser


_TAKES_BEAM_OPTIONS = ("generate", "encode")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command in _TAKES_BEAM_OPTIONS:
        return args.handler(args, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
