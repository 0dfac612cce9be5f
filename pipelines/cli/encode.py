"""`dpsynth encode`: labelled images → embeddings + labels, encoded in Beam workers with RunInference.

    dpsynth encode --images ROOT_OR_PATTERN --encoder NAME --output OUT.npz|OUT.tfrecord [beam options]
    python -m dpsynth.pipelines.cli.encode ...   (same flags; any flag not listed here goes to Beam: --runner,
                                      --direct_num_workers, --project, ...)

Output by extension: `.npz` (arrays `embeddings` float32 [n, d], `labels` int64 [n], `classes` when known; rows
sorted by source file so the result does not depend on the number of workers) or `.tfrecord` (tf.train.Example
with float list `embedding` and int64 `label`). A small `<output stem>.labels.json` next to it records the label
mapping (sorted class folder names → 0..C-1) and the encoder recipe — schema only, no data-derived numbers.

The embeddings are as private as the images: this command is data preparation inside the trust boundary, not
a release. This module is the command line (no Beam import: `--help` and flag errors answer at once);
the job is `pipelines/encode_job.py`, whose `encoded_blocks` gives the same stage to `dpsynth generate
--images` as (x, y) blocks.
"""

from __future__ import annotations

# First: it quiets the libraries' start-up logs before Beam is imported.
from dpsynth.pipelines import console  # noqa: I001  isort:skip

import argparse
import os
import sys
from typing import Optional, Sequence

from dpsynth.pipelines.help_format import DefaultsHelpFormatter
from dpsynth.pipelines.cli.image_flags import add_image_arguments
from dpsynth.pipelines.cli.spec_flags import add_flags, spec_values
from dpsynth.pipelines.spec import EncodeSpec, ImageOptions
from dpsynth.transforms.formats import ImageInputError


# ------------------------------------------------------------------ flags

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """encode's flags, as ``EncodeSpec``'s and ``ImageOptions``' fields declare them."""
    add_image_arguments(parser)
    add_flags(parser, EncodeSpec, "verbose", "output", "num_shards", "keep_source_ids")


def register(subparsers) -> argparse.ArgumentParser:
    """Adds the `encode` sub-command to an argparse subparsers object."""
    p = subparsers.add_parser("encode", help="labelled images -> embeddings (Beam RunInference)",
                              description=__doc__.split("\n\n")[0],
                              formatter_class=DefaultsHelpFormatter)
    add_arguments(p)
    p.set_defaults(handler=handle, command="encode")
    return p


def parser() -> argparse.ArgumentParser:
    p = console.Parser(prog="dpsynth encode", description=__doc__,
                       formatter_class=DefaultsHelpFormatter)
    add_arguments(p)
    return p


def spec_from_args(args: argparse.Namespace, beam_argv: Sequence[str] = ()) -> EncodeSpec:
    """The command line's flags as the typed spec of the run (everything below the command line takes the
    spec, never the flags). Raises ImageInputError for duplicate --classes."""
    return spec_values(args, EncodeSpec, images=spec_values(args, ImageOptions),
                       beam_args=tuple(beam_argv))


def handle(args: argparse.Namespace, beam_argv: Sequence[str] = ()) -> int:
    """CLI entry for `dpsynth encode` (argparse handler)."""
    from dpsynth.pipelines.cli import early_checks
    refusal = early_checks.unknown_flag(parser(), beam_argv, "encode")
    if refusal:  # before Beam's and TensorFlow's imports
        return console.fail(refusal)
    console.setup_logging(getattr(args, "verbose", False))
    with console.quiet_stderr(getattr(args, "verbose", False)):
        # Beam and the job load here, after the flags parsed.
        from dpsynth.models.encoders import EncoderError, EncoderUnavailableError
        from dpsynth.pipelines import encode_job
        from dpsynth.pipelines.runners.options import UsageError, check_beam_args
        from dpsynth.transforms.formats import BadImagesError

        def go() -> int:
            check_beam_args(beam_argv, parser(), "encode")
            spec = spec_from_args(args, beam_argv)
            info = encode_job.run(spec)
            print(f"embeddings written to {spec.output} (labels: {info['labels_json']})")
            return 0

        return console.run_command(go, "encode", (UsageError, ImageInputError, EncoderError,
                                                  EncoderUnavailableError, BadImagesError))


def main(argv: Optional[Sequence[str]] = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    args, beam_argv = parser().parse_known_args(argv)
    return handle(args, beam_argv)


if __name__ == "__main__":
    sys.exit(main())
