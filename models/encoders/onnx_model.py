"""`onnx:PATH`: an ONNX image model run with onnxruntime (optional extra `dpsynth[onnx]`, imported lazily).

Layout (NCHW or NHWC) and input size are read from the model's first input; `--image-size` fills dynamic
sizes. Pixels are scaled with `--pixel-scale` (default `unit`); uint8 inputs get raw pixels. The first output
is the embedding: [b, d] as is, [b, c, h, w] / [b, h, w, c] globally average-pooled.
"""

from __future__ import annotations

import os

import numpy as np

from dpsynth.models.encoders import preprocess
from dpsynth.models.encoders.base import Encoder, EncodeFn, EncoderError, EncoderUnavailableError, path_exists, read_bytes


def import_onnxruntime():
    """onnxruntime with its telemetry off. Its official POSIX builds (1.2x+, here 1.32) send usage events to
    Microsoft's 1DS service unless ``ORT_DISABLE_TELEMETRY=1`` is set before it initialises (no uploader, events,
    device id or cache then; measured: without it each run writes a ``.ses`` session file in the temporary
    directory). Nothing of a private dataset should prompt traffic from a DP pipeline; a user who wants the
    telemetry sets the variable to 0."""
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    try:
        import onnxruntime
    except ImportError as err:
        raise EncoderUnavailableError(f"onnx encoders need onnxruntime ({err}); install the optional extra: "
                                      f"pip install 'dpsynth[onnx]'") from err
    return onnxruntime


class OnnxEncoder(Encoder):
    def __init__(self, path: str, image_size: tuple[int, int] | None = None, pixel_scale: str | None = None,
                 resize_mode: str | None = None, num_threads: int | None = None):
        super().__init__(num_threads)
        if not path:
            raise EncoderError("encoder 'onnx:PATH' needs a path, e.g. onnx:/models/encoder.onnx")
        self.name = f"onnx:{path}"
        self.path = path
        self.input_size = tuple(image_size) if image_size else None
        self.pixel_scale = preprocess.check_pixel_scale(pixel_scale or "unit")
        self.resize_mode = preprocess.check_resize_mode(resize_mode or "resize")
        self.channels_first: bool | None = None

    def _session(self):
        ort = import_onnxruntime()
        options = ort.SessionOptions()
        if self.num_threads:
            options.intra_op_num_threads = self.num_threads
            options.inter_op_num_threads = 1
        try:
            return ort.InferenceSession(read_bytes(self.path), sess_options=options,
                                        providers=["CPUExecutionProvider"])
        except Exception as err:
            raise EncoderError(f"encoder {self.name!r}: cannot load {self.path!r} with onnxruntime: {err}") from err

    def _read_layout(self, session) -> None:
        shape = list(session.get_inputs()[0].shape)
        if len(shape) != 4:
            raise EncoderError(f"encoder {self.name!r}: first input has shape {shape}; need a 4-d image batch")
        if shape[1] == 3 and shape[3] != 3:
            self.channels_first, dims = True, shape[2:4]
        elif shape[3] == 3:
            self.channels_first, dims = False, shape[1:3]
        else:
            raise EncoderError(f"encoder {self.name!r}: cannot tell NCHW from NHWC in input shape {shape}")
        if self.input_size is None:
            if not all(isinstance(d, int) and d > 0 for d in dims):
                raise EncoderError(f"encoder {self.name!r}: input size is dynamic ({shape}); pass --image-size H,W")
            self.input_size = (int(dims[0]), int(dims[1]))

    def check_available(self) -> None:
        import_onnxruntime()
        if not path_exists(self.path):
            raise EncoderUnavailableError(f"encoder {self.name!r}: model file {self.path!r} does not exist")
        self._read_layout(self._session())

    def resolve_input_size(self) -> tuple[int, int]:
        if self.input_size is None or self.channels_first is None:
            self._read_layout(self._session())
        return self.input_size

    def load(self) -> EncodeFn:
        session = self._session()
        self._read_layout(session)
        first = session.get_inputs()[0]
        feed_uint8 = first.type == "tensor(uint8)"
        scale, channels_first = self.pixel_scale, self.channels_first

        def encode(batch: np.ndarray) -> np.ndarray:
            x = batch if feed_uint8 else preprocess.normalise_batch(batch, scale)
            if channels_first:
                x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
            out = session.run(None, {first.name: x})[0]
            return preprocess.pool_features(out, channels_last=not channels_first)
        return encode

    def _build(self) -> EncodeFn:  # load() is overridden: uint8 inputs skip normalisation
        raise AssertionError("unused")
