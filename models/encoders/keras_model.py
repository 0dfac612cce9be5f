"""`keras:PATH`: any Keras model file (.keras, .h5) or TensorFlow SavedModel folder as an image encoder.

The input size is read from the model (`--image-size` when it has none); pixels are scaled with
`--pixel-scale` (default `unit`, p/255). Outputs [b, d] are used as is; [b, h, w, c] feature maps are
globally average-pooled. A SavedModel with several outputs needs `output_key`.
"""

from __future__ import annotations

import io
import json
import os
import zipfile

import numpy as np

from dpsynth.models.encoders import preprocess
from dpsynth.models.encoders.base import (Encoder, EncodeFn, EncoderError, EncoderUnavailableError, localized, path_exists,
                                  read_bytes)


def _keras_file_input_size(path: str) -> tuple[int, int] | None:
    """(h, w) of the first InputLayer in a .keras zip's config.json; None when it cannot tell."""
    if not path.endswith(".keras"):
        return None
    try:
        with zipfile.ZipFile(io.BytesIO(read_bytes(path))) as archive:
            config = json.loads(archive.read("config.json"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    stack = [config]
    while stack:
        node = stack.pop(0)
        if isinstance(node, dict):
            if node.get("class_name") == "InputLayer":
                cfg = node.get("config", {})
                shape = cfg.get("batch_shape") or cfg.get("batch_input_shape")
                if shape and len(shape) == 4 and shape[1] and shape[2] and shape[3] == 3:
                    return int(shape[1]), int(shape[2])
                return None
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return None


class KerasEncoder(Encoder):
    def __init__(self, path: str, image_size: tuple[int, int] | None = None, pixel_scale: str | None = None,
                 resize_mode: str | None = None, output_key: str | None = None, num_threads: int | None = None):
        super().__init__(num_threads)
        if not path:
            raise EncoderError("encoder 'keras:PATH' needs a path, e.g. keras:/models/encoder.keras")
        self.name = f"keras:{path}"
        self.path = path
        self.input_size = tuple(image_size) if image_size else None
        self.pixel_scale = preprocess.check_pixel_scale(pixel_scale or "unit")
        self.resize_mode = preprocess.check_resize_mode(resize_mode or "resize")
        self.output_key = output_key

    def check_available(self) -> None:
        if not path_exists(self.path):
            raise EncoderUnavailableError(f"encoder {self.name!r}: model path {self.path!r} does not exist")
        if self.input_size is None:
            # A .keras file's config names its input shape: no TensorFlow import in the driver.
            self.input_size = _keras_file_input_size(self.path) or self._model_input_size(self._load_model())

    def _is_saved_model(self, local: str) -> bool:
        return os.path.isdir(local) and os.path.exists(os.path.join(local, "saved_model.pb"))

    def _load_model(self):
        import keras
        with localized(self.path) as local:
            if self._is_saved_model(local):
                return keras.layers.TFSMLayer(local, call_endpoint="serving_default")
            try:
                return keras.models.load_model(local, compile=False)
            except Exception as err:
                raise EncoderError(f"encoder {self.name!r}: cannot load {self.path!r} as a Keras model or "
                                   f"SavedModel: {err}") from err

    def _model_input_size(self, model) -> tuple[int, int]:
        shape = getattr(model, "input_shape", None)
        if shape is None and hasattr(model, "call_endpoint_fn"):  # SavedModel: read the serving signature
            specs = model.call_endpoint_fn.structured_input_signature[1]
            shape = tuple(next(iter(specs.values())).shape) if len(specs) == 1 else None
        if isinstance(shape, list):
            shape = shape[0] if len(shape) == 1 else None
        if shape is not None and len(shape) == 4 and shape[1] and shape[2]:
            return int(shape[1]), int(shape[2])
        raise EncoderError(f"encoder {self.name!r}: the model has no fixed [h, w, 3] input; pass --image-size H,W")

    def _pick_output(self, out):
        if isinstance(out, dict):
            if self.output_key is not None:
                return out[self.output_key]
            if len(out) == 1:
                return next(iter(out.values()))
            raise EncoderError(f"encoder {self.name!r}: the model has outputs {sorted(out)}; pick one with "
                               f"--encoder-output-key")
        if isinstance(out, (list, tuple)):
            return out[0]
        return out

    def _build(self) -> EncodeFn:
        if self.num_threads:
            from dpsynth.models.encoders.clip import _set_tf_threads
            _set_tf_threads(self.num_threads)
        model = self._load_model()
        if self.input_size is None:
            self.input_size = self._model_input_size(model)

        def run(batch: np.ndarray) -> np.ndarray:
            out = self._pick_output(model(batch, training=False) if hasattr(model, "compile") else model(batch))
            return preprocess.pool_features(np.asarray(out), channels_last=True)
        return run

    def resolve_input_size(self) -> tuple[int, int]:
        if self.input_size is None:
            try:
                self.input_size = self._model_input_size(self._load_model())
            except ImportError as err:
                raise EncoderUnavailableError(f"encoder {self.name!r} needs keras ({err})") from err
        return self.input_size
