"""The one encoder interface.

An `Encoder` is a small, picklable description of an image encoder. Beam ships it to the workers, where
`prepare` runs per image and `load` builds the network once per worker process. Splitting the two keeps the
heavy framework imports (torch, TensorFlow, onnxruntime) out of the pipeline-construction process and out of
tests that never run a model.
"""

from __future__ import annotations

import abc
import contextlib
import os
import shutil
import tempfile
from typing import Callable, Iterator

import numpy as np

from dpsynth.models.encoders import preprocess

# A loaded encoder: uint8 images [b, h, w, 3] → float32 embeddings [b, d].
EncodeFn = Callable[[np.ndarray], np.ndarray]


class EncoderError(ValueError):
    """Bad encoder name or options."""


class EncoderUnavailableError(RuntimeError):
    """The encoder cannot be built here: a package is missing or its weights cannot be fetched."""


class Encoder(abc.ABC):
    """Named image encoder: resizing + normalisation recipe and a lazily loaded network.

    Subclasses set `name`, `input_size` (height, width), `resize_mode`, `resample`, `pixel_scale`
    and implement `_build()` returning an `EncodeFn` that receives already normalised float32 batches.
    `input_size` may be None until `load()` when it is read from the model file.
    """

    name: str = ""
    input_size: tuple[int, int] | None = None
    resize_mode: str = "resize"
    resample: str = "bicubic"
    pixel_scale: str = "unit"
    embedding_dim: int | None = None  # when known without loading the network

    def __init__(self, num_threads: int | None = None):
        self.num_threads = num_threads

    def check_available(self) -> None:
        """Fails fast (in the pipeline-construction process) if the encoder cannot be built.

        Default: nothing to check. Overridden where a package or weights file is needed.
        """

    def resolve_input_size(self) -> tuple[int, int]:
        """The (height, width) the network wants; may read the model file's metadata."""
        if self.input_size is None:
            raise EncoderError(f"encoder {self.name!r}: the model has no fixed input size; pass --image-size")
        return self.input_size

    def prepare(self, image: np.ndarray) -> np.ndarray:
        """One uint8 RGB image [h, w, 3] → uint8 [H, W, 3] at the encoder's input size (runs per image)."""
        if getattr(self, "_size_cache", None) is None:
            self._size_cache = self.resolve_input_size()
        return preprocess.prepare_image(image, self._size_cache, self.resize_mode, self.resample)

    def load(self) -> EncodeFn:
        """Builds the network (once per worker) and returns uint8 batch → float32 [b, d]."""
        network = self._build()
        scale = self.pixel_scale

        def encode(batch: np.ndarray) -> np.ndarray:
            out = network(preprocess.normalise_batch(batch, scale))
            return np.asarray(out, dtype=np.float32)
        return encode

    @abc.abstractmethod
    def _build(self) -> EncodeFn:
        """Returns float32 normalised batch [b, h, w, 3] → embeddings [b, d]."""

    def describe(self) -> dict:
        return {"encoder": self.name, "input_size": self.input_size, "resize_mode": self.resize_mode,
                "resample": self.resample, "pixel_scale": self.pixel_scale, "embedding_dim": self.embedding_dim}

    def __getstate__(self):
        # Never pickle caches; workers rebuild them.
        state = dict(self.__dict__)
        state.pop("_size_cache", None)
        return state


def read_bytes(path: str) -> bytes:
    """Whole file through Beam's FileSystems (local, gs://, ...)."""
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.io.filesystem import CompressionTypes
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        return handle.read()


def path_exists(path: str) -> bool:
    from apache_beam.io.filesystems import FileSystems
    return FileSystems.exists(path)


@contextlib.contextmanager
def localized(path: str) -> Iterator[str]:
    """A local path for `path` while the block runs: a remote file or folder (gs://...) is copied into a temp
    folder first, removed when the block ends (load the model inside it: a worker that loads a remote model for
    every job would otherwise keep a copy per job in its temp folder).

    Framework loaders (Keras, keras-hub) want local files; all remote access still goes through FileSystems.
    """
    from apache_beam.io.filesystems import FileSystems
    if FileSystems.get_scheme(path) in (None, "file"):
        yield path
        return
    target_root = tempfile.mkdtemp(prefix="dpsynth-model-")
    try:
        yield _copy_local(path, target_root)
    finally:
        shutil.rmtree(target_root, ignore_errors=True)


def _copy_local(path: str, target_root: str) -> str:
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems
    base = path.rstrip("/")
    name = base.rsplit("/", 1)[-1]
    matches = FileSystems.match([base + "/**"])[0].metadata_list
    if not matches:  # a single file
        local = os.path.join(target_root, name)
        with open(local, "wb") as out:
            out.write(read_bytes(base))
        return local
    for meta in matches:
        rel = meta.path[len(base) + 1:]
        local = os.path.join(target_root, name, *rel.split("/"))
        os.makedirs(os.path.dirname(local), exist_ok=True)
        with FileSystems.open(meta.path, compression_type=CompressionTypes.UNCOMPRESSED) as src, \
                open(local, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return os.path.join(target_root, name)
