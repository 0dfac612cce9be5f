"""Public names of the formats and policies the readers and writers accept.

Pure constants and the input errors the command lines name, no Beam
import: the command lines build their ``--help`` and check their flags
from these without loading Beam (``dpsynth generate --help`` answers in a
fraction of a second).
"""

# Input embeddings (dpsynth.transforms.io).
FORMATS = ("npz", "tfrecord", "parquet", "csv")
SPLIT_BYTES = 64 << 20  # input files are read in ranges of this
NON_FINITE_POLICIES = ("reject", "drop")
# Release data shards (dpsynth.transforms.write).
OUTPUT_FORMATS = ("tfrecord", "parquet")
# Image inputs (dpsynth.transforms.images).
IMAGE_LAYOUTS = ("folder", "tfrecord", "npz")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


class ImageInputError(ValueError):
    """Bad --images argument or layout, found while building the graph."""


class BadImagesError(RuntimeError):
    """More unreadable images than --max-bad-images allows."""
