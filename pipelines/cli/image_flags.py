"""The image and encoder flags, shared by `dpsynth encode` and `dpsynth
generate --images`. Light on purpose (no Beam, no TensorFlow): building
``--help`` must not load the pipeline's libraries."""

from __future__ import annotations

import argparse

from dpsynth.models.encoders.registry import list_encoders
from dpsynth.transforms.formats import IMAGE_LAYOUTS as LAYOUTS


def _size(text: str) -> tuple[int, int]:
    parts = text.replace("x", ",").split(",")
    try:
        size = tuple(int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--image-size must be H,W or S, got {text!r}") from None
    size = size * 2 if len(size) == 1 else size
    if len(size) != 2 or min(size) < 1:
        raise argparse.ArgumentTypeError(f"--image-size must be H,W or S, got {text!r}")
    return size


class _EncodeOnly(argparse.Action):
    """--max-bad-images given to `generate`: say why it is not there."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is an encode-only flag: a release skips unreadable images one by one "
                     "(whether a release exists must not depend on how many there are)")


def add_image_arguments(parser: argparse.ArgumentParser, images_required: bool = True,
                        for_release: bool = False) -> None:
    """Flags for reading and encoding images; shared by `encode` and `generate --images` (``for_release``:
    unreadable images are skipped per record, so there is no --max-bad-images, and --classes is required for
    a folder layout)."""
    g = parser.add_argument_group("images and encoder (instead of --input: images encoded by a public encoder "
                                  "in the workers)" if for_release else "images and encoder")
    g.add_argument("--images", required=images_required,
                   help="ROOT of a folder-per-class layout (ROOT/<class>/*.jpg|png), or a glob of .tfrecord "
                        "files (tf.train.Example: encoded image + int64 label) or .npz files (images uint8, "
                        "labels); local or gs://")
    g.add_argument("--image-layout", choices=LAYOUTS, default=None, help="override layout detection")
    g.add_argument("--encoder", default="efficientnet-lite0",
                   help="encoder name: " + ", ".join(list_encoders()) + " (default efficientnet-lite0)")
    g.add_argument("--encoder-weights", default=None,
                   help="local or gs:// copy of a named encoder's weights (CLIP: a keras-hub preset folder)")
    g.add_argument("--image-size", type=_size, default=None, help="H,W input size for keras:/onnx: models")
    g.add_argument("--pixel-scale", default=None,
                   help="pixel scaling for keras:/onnx: models: raw, unit (default), symmetric, effnet, "
                        "imagenet, clip")
    g.add_argument("--resize-mode", choices=("resize", "resize_crop"), default=None,
                   help="keras:/onnx: models: plain resize (default) or shorter side + centre crop")
    g.add_argument("--encoder-output-key", default=None, help="output name of a multi-output SavedModel")
    g.add_argument("--encoder-threads", type=int, default=None,
                   help="framework threads per worker (default: CPU cores / DirectRunner workers)")
    g.add_argument("--batch-size", type=int, default=64, help="images per RunInference batch (default 64)")
    g.add_argument("--l2-normalize", action="store_true",
                   help="L2-normalise each embedding (public, per-row)")
    if not for_release:
        g.add_argument("--max-bad-images", type=int, default=0,
                       help="stop the run if more images than this cannot be read or decoded")
    else:
        g.add_argument("--max-bad-images", action=_EncodeOnly, help=argparse.SUPPRESS)
    g.add_argument("--bad-images-report", default=None,
                   help="write the unreadable files (name, reason) here: an operator file naming private "
                        "files" + (", never part of the release; unreadable images are skipped one by one"
                                   if for_release else " (default for encode: next to output)"))
    g.add_argument("--classes", default=None,
                   help=("class names in label order (label i = the i-th name); required with a folder layout: "
                         "the label set is public, the private folders are not listed to find it"
                         if for_release else
                         "comma-separated class folder names in label order (default: all folders, sorted)"))
    g.add_argument("--image-feature", default=None, help="TFRecord image bytes feature (default: auto)")
    if not for_release:  # generate's own --label-feature names it there
        g.add_argument("--label-feature", default=None, help="TFRecord int64 label feature (default: auto)")


