"""The image and encoder flags, shared by `dpsynth encode` and `dpsynth
generate --images`, as ``ImageOptions``' fields declare them
(``dpsynth.pipelines.spec``). Light on purpose (no Beam, no TensorFlow):
building ``--help`` must not load the pipeline's libraries."""

from __future__ import annotations

import argparse

from dpsynth.pipelines.cli.spec_flags import add_flags
from dpsynth.pipelines.spec import EncodeSpec, ImageOptions


class _EncodeOnly(argparse.Action):
    """--max-bad-images given to `generate`: say why it is not there."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is an encode-only flag: a release skips unreadable images one by one "
                     "(whether a release exists must not depend on how many there are)")


# What `generate --images` says differently: a release skips unreadable
# images one by one, and lists no private folder to find its label set.
_FOR_RELEASE = {
    "bad_images_report": {
        "help": "write the unreadable files (name, reason) here: an operator file naming private files, "
                "never part of the release; unreadable images are skipped one by one"},
    "classes": {
        "help": "class names in label order (label i = the i-th name); required with a folder layout: "
                "the label set is public, the private folders are not listed to find it"},
}


def add_image_arguments(parser: argparse.ArgumentParser, images_required: bool = True,
                        for_release: bool = False) -> None:
    """Flags for reading and encoding images; shared by `encode` and `generate --images` (``for_release``:
    unreadable images are skipped per record, so there is no --max-bad-images, and --classes is required for
    a folder layout)."""
    g = parser.add_argument_group("images and encoder (instead of --input: images encoded by a public encoder "
                                  "in the workers)" if for_release else "images and encoder")
    changes = dict(_FOR_RELEASE) if for_release else {}
    if not images_required:
        changes["path"] = {"required": False}
    add_flags(g, ImageOptions, "path", "layout", "encoder", "encoder_weights", "image_size", "pixel_scale",
              "resize_mode", "encoder_output_key", "encoder_threads", "batch_size", "l2_normalize", **changes)
    if not for_release:
        add_flags(g, EncodeSpec, "max_bad_images")
    else:
        g.add_argument("--max-bad-images", action=_EncodeOnly, help=argparse.SUPPRESS)
    add_flags(g, ImageOptions, "bad_images_report", "classes", "image_feature", **changes)
    if not for_release:  # generate's own --label-feature names it there
        add_flags(g, ImageOptions, "label_feature")
