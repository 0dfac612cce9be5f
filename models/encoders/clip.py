"""CLIP image encoders (the paper's choice) through keras-hub presets.

Weights live on Kaggle Models (`kaggle://kerashub/clip/keras/<preset>/<version>`). Where they cannot be
downloaded (no network, as on the dpsynth build machines), loading fails with `EncoderUnavailableError` naming
the preset and how to point at a local copy (`--encoder-weights DIR`). The embedding is the projected image
embedding (`CLIPBackbone.get_vision_embeddings`), as used for zero-shot retrieval; it is not L2-normalised here
(use the public `--l2-normalize` option of the encode stage).
Preprocessing follows OpenAI CLIP: shorter side to the input size (bicubic), centre crop, CLIP mean/std.
"""

from __future__ import annotations

import numpy as np

from dpsynth.models.encoders.base import Encoder, EncodeFn, EncoderUnavailableError, localized, path_exists

# registry name → (keras-hub preset, Kaggle handle, input size, projection dim)
CLIP_PRESETS = {
    "clip-vit-b16": ("clip_vit_base_patch16", "kerashub/clip/keras/clip_vit_base_patch16/1", 224, 512),
    "clip-vit-b32": ("clip_vit_base_patch32", "kerashub/clip/keras/clip_vit_base_patch32/1", 224, 512),
    "clip-vit-l14": ("clip_vit_large_patch14", "kerashub/clip/keras/clip_vit_large_patch14/1", 224, 768),
    "clip-vit-l14-336": ("clip_vit_large_patch14_336", "kerashub/clip/keras/clip_vit_large_patch14_336/1", 336, 768),
}


def download_preset(handle: str) -> str:
    """Downloads (or finds in the kagglehub cache, $KAGGLEHUB_CACHE) a Kaggle model; returns its local folder."""
    import kagglehub
    return kagglehub.model_download(handle)


def offline_message(name: str, preset: str, handle: str, reason: str) -> str:
    return (
        f"encoder {name!r}: cannot download the CLIP weights (keras-hub preset {preset!r}, Kaggle handle "
        f"{handle!r}): {reason}. This machine probably has no network access to Kaggle. To use a local copy: "
        f"on a machine with network run  python -c \"import kagglehub; print(kagglehub.model_download('{handle}'))\"  "
        f"(or keras_hub.models.CLIPBackbone.from_preset('{preset}') then backbone.save_to_preset(DIR)), copy the "
        f"printed preset folder (config.json, model.weights.h5, ...) here or to gs://, and pass "
        f"--encoder {name} --encoder-weights DIR; alternatively set KAGGLEHUB_CACHE to a kagglehub cache holding it.")


class ClipImageEncoder(Encoder):
    resize_mode = "resize_crop"
    resample = "bicubic"
    pixel_scale = "clip"

    def __init__(self, name: str, weights: str | None = None, num_threads: int | None = None):
        super().__init__(num_threads)
        self.name = name
        self.preset, self.handle, size, self.embedding_dim = CLIP_PRESETS[name]
        self.input_size = (size, size)
        self.weights = weights

    def resolve_weights(self) -> str:
        """Local (or gs://) preset folder: --encoder-weights if given, else a Kaggle download."""
        if self.weights is not None:
            if not path_exists(self.weights):
                raise EncoderUnavailableError(
                    f"encoder {self.name!r}: --encoder-weights {self.weights!r} does not exist; it must be a "
                    f"keras-hub preset folder for {self.preset!r} (config.json, model.weights.h5, ...)")
            return self.weights
        try:
            import kagglehub  # noqa: F401
        except ImportError as err:
            raise EncoderUnavailableError(offline_message(
                self.name, self.preset, self.handle, f"the 'kagglehub' package is not installed ({err})")) from err
        try:
            return download_preset(self.handle)
        except Exception as err:  # network, DNS, HTTP and auth errors all land here
            raise EncoderUnavailableError(offline_message(
                self.name, self.preset, self.handle, f"{type(err).__name__}: {str(err)[:300]}")) from err

    def check_available(self) -> None:
        self.resolve_weights()
        try:
            import keras_hub  # noqa: F401
        except ImportError as err:
            raise EncoderUnavailableError(
                f"encoder {self.name!r} needs the 'keras-hub' package to build CLIP ({err}); "
                f"pip install keras-hub") from err

    def _build(self) -> EncodeFn:
        if self.num_threads:
            _set_tf_threads(self.num_threads)
        try:
            import keras_hub
        except ImportError as err:
            raise EncoderUnavailableError(
                f"encoder {self.name!r} needs the 'keras-hub' package to build CLIP ({err}); "
                f"pip install keras-hub") from err
        with localized(self.resolve_weights()) as preset_dir:
            backbone = keras_hub.models.CLIPBackbone.from_preset(preset_dir)

        def run(batch: np.ndarray) -> np.ndarray:
            return np.asarray(backbone.get_vision_embeddings(batch))
        return run


def _set_tf_threads(n: int) -> None:
    try:
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except (ImportError, RuntimeError):  # RuntimeError: TF already initialised in this process
        pass
