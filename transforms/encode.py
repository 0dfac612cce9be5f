"""EncodeImages: (source, label, uint8 image) → (source, label, float32 embedding) with Beam RunInference.

Each image is resized to the encoder's input size where it is decoded (per image, in the workers); RunInference
batches the uint8 images, each worker process loads the network once (`EncoderModelHandler.load_model`) and
normalises + encodes whole batches. Optional L2 normalisation of each output row is a fixed public map
(no data-derived parameter), so it needs no privacy budget.

`ToBlocks` groups rows into the blocks the DP generation pipeline consumes: (x [b, d] float64, y [b] int64).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Iterable, Optional, Sequence, Union

import apache_beam as beam
import numpy as np
from apache_beam.ml.inference.base import KeyedModelHandler, ModelHandler, PredictionResult, RunInference

from dpsynth.models.encoders import Encoder, EncodeFn, get_encoder

log = logging.getLogger("dpsynth.encode")


class EncoderModelHandler(ModelHandler[np.ndarray, PredictionResult, EncodeFn]):
    """RunInference handler for any registry `Encoder`: uint8 [h, w, 3] examples → [d] float32 embeddings."""

    def __init__(self, encoder: Encoder, batch_size: int = 64):
        if batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
        self._encoder = encoder
        self._batch_size = batch_size

    def load_model(self) -> EncodeFn:
        start = time.time()
        model = self._encoder.load()
        log.info("encoder %s loaded in %.1f s (pid %d)", self._encoder.name, time.time() - start, os.getpid())
        return model

    def run_inference(self, batch: Sequence[np.ndarray], model: EncodeFn,
                      inference_args: Optional[dict[str, Any]] = None) -> Iterable[PredictionResult]:
        embeddings = model(np.stack(batch))
        if len(embeddings) != len(batch):
            raise RuntimeError(f"encoder {self._encoder.name!r} returned {len(embeddings)} rows for "
                               f"{len(batch)} images")
        # The input image is not kept in the result: downstream only needs the embedding.
        return [PredictionResult(None, row) for row in embeddings]

    def batch_elements_kwargs(self) -> dict:
        # Fixed-size batches (the last one of a bundle may be smaller).
        return {"min_batch_size": self._batch_size, "max_batch_size": self._batch_size}

    def get_num_bytes(self, batch: Sequence[np.ndarray]) -> int:
        return int(sum(x.nbytes for x in batch))

    def get_metrics_namespace(self) -> str:
        return "dpsynth_encode"


class _PrepareFn(beam.DoFn):
    """(source, label, image) → ((source, label), resized uint8 image)."""

    def __init__(self, encoder: Encoder):
        self.encoder = encoder

    def process(self, item):
        source, label, image = item
        yield (source, label), self.encoder.prepare(image)


def l2_normalise(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norm, eps)


def _to_row(keyed: tuple, l2_normalize: bool):
    (source, label), result = keyed
    emb = np.asarray(result.inference, dtype=np.float32)
    if l2_normalize:
        emb = l2_normalise(emb).astype(np.float32)
    return source, label, emb


class EncodeImages(beam.PTransform):
    """(source, label, uint8 RGB image [h, w, 3]) → (source, label, float32 embedding [d]).

    `encoder`: an `Encoder` or a registry name (see dpsynth.models.encoders.registry). Its availability (packages,
    weights) is checked when the graph is built, so a missing model fails before any worker starts.
    """

    def __init__(self, encoder: Union[Encoder, str], batch_size: int = 64, l2_normalize: bool = False,
                 check: bool = True):
        super().__init__()
        self.encoder = get_encoder(encoder) if isinstance(encoder, str) else encoder
        if check:
            self.encoder.check_available()
        self.handler = EncoderModelHandler(self.encoder, batch_size)
        self.l2_normalize = l2_normalize

    def expand(self, images):
        return (images
                | "Resize" >> beam.ParDo(_PrepareFn(self.encoder))
                | "RunInference" >> RunInference(KeyedModelHandler(self.handler))
                | "Rows" >> beam.Map(_to_row, self.l2_normalize))


def _stack_block(rows: list) -> tuple[np.ndarray, np.ndarray]:
    x = np.stack([r[2] for r in rows]).astype(np.float64)
    y = np.asarray([r[1] for r in rows], dtype=np.int64)
    return x, y


class ToBlocks(beam.PTransform):
    """(source, label, embedding) rows → blocks (x [b, d] float64, y [b] int64), b ≤ block_size."""

    def __init__(self, block_size: int = 2048):
        super().__init__()
        if block_size < 1:
            raise ValueError(f"--block-size must be >= 1, got {block_size}")
        self.block_size = block_size

    def expand(self, rows):
        return (rows
                | "Batch" >> beam.BatchElements(min_batch_size=self.block_size, max_batch_size=self.block_size)
                | "Stack" >> beam.Map(_stack_block))
