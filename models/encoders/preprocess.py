"""Per-encoder image preparation: resizing (per image) and pixel normalisation (per batch).

Images arrive as uint8 RGB arrays [h, w, 3]. `prepare_image` resizes them to the encoder's input size and keeps
uint8 (4x smaller than float32 while batches are formed); `normalise_batch` turns a uint8 batch into the float32
input the network expects. Both are public, fixed transformations: nothing here is fitted on data.
"""

from __future__ import annotations

import numpy as np

# Named pixel scalings. Each maps uint8 pixels p to float32 values.
_IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
_IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
_CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
_CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)

PIXEL_SCALES = {
    "raw": "p (0..255 as float)",
    "unit": "p / 255",
    "symmetric": "p / 127.5 - 1",
    "effnet": "(p - 127) / 128  (EfficientNet-Lite recipe)",
    "imagenet": "(p / 255 - ImageNet mean) / ImageNet std",
    "clip": "(p / 255 - CLIP mean) / CLIP std",
}

RESIZE_MODES = {
    "resize": "resize straight to (h, w), ignoring aspect ratio",
    "resize_crop": "resize the shorter side to the target, then centre-crop",
}


def check_pixel_scale(name: str) -> str:
    if name not in PIXEL_SCALES:
        raise ValueError(f"unknown pixel scale {name!r}; choose one of {sorted(PIXEL_SCALES)}")
    return name


def check_resize_mode(name: str) -> str:
    if name not in RESIZE_MODES:
        raise ValueError(f"unknown resize mode {name!r}; choose one of {sorted(RESIZE_MODES)}")
    return name


def _resample(name: str):
    from PIL import Image
    return {"bicubic": Image.BICUBIC, "bilinear": Image.BILINEAR, "nearest": Image.NEAREST}[name]


def prepare_image(image: np.ndarray, size: tuple[int, int], mode: str = "resize",
                  resample: str = "bicubic") -> np.ndarray:
    """Resizes one uint8 RGB image [h, w, 3] to `size` = (height, width); returns uint8 [height, width, 3]."""
    from PIL import Image
    height, width = size
    if image.shape[:2] == (height, width):
        return np.ascontiguousarray(image, dtype=np.uint8)
    pil = Image.fromarray(image)
    method = _resample(resample)
    if mode == "resize":
        pil = pil.resize((width, height), method)
    elif mode == "resize_crop":
        scale = max(height / pil.height, width / pil.width)
        new_w, new_h = max(width, round(pil.width * scale)), max(height, round(pil.height * scale))
        pil = pil.resize((new_w, new_h), method)
        left, top = (new_w - width) // 2, (new_h - height) // 2
        pil = pil.crop((left, top, left + width, top + height))
    else:
        check_resize_mode(mode)
    return np.asarray(pil, dtype=np.uint8)


def normalise_batch(batch: np.ndarray, scale: str) -> np.ndarray:
    """uint8 [b, h, w, 3] → float32 [b, h, w, 3] with the named pixel scaling."""
    x = np.asarray(batch, dtype=np.float32)
    if scale == "raw":
        return x
    if scale == "unit":
        return x / 255.0
    if scale == "symmetric":
        return x / 127.5 - 1.0
    if scale == "effnet":
        return (x - 127.0) / 128.0
    if scale == "imagenet":
        return (x / 255.0 - _IMAGENET_MEAN) / _IMAGENET_STD
    if scale == "clip":
        return (x / 255.0 - _CLIP_MEAN) / _CLIP_STD
    check_pixel_scale(scale)
    raise AssertionError(scale)


def pool_features(features: np.ndarray, channels_last: bool = True) -> np.ndarray:
    """Reduces a network output to one vector per image: [b, d] stays, [b, h, w, c] (or [b, c, h, w]) is
    globally average-pooled, anything else is flattened."""
    out = np.asarray(features)
    if out.ndim == 4:
        out = out.mean(axis=(1, 2) if channels_last else (2, 3))
    elif out.ndim != 2:
        out = out.reshape(out.shape[0], -1)
    return out.astype(np.float32, copy=False)
