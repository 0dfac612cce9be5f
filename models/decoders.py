"""Decoders: embedding → image, for looking at a synthetic release.

Decoding is post-processing of the DP release. A decoder only ever receives synthetic embeddings that already
left the DP pipeline (the released TFRecord), never private images or private embeddings, so it costs no privacy
budget (post-processing property of DP) — and it must stay that way: do not fit, fine-tune, calibrate or
evaluate a decoder on private data, and never wire a decoder into a stage before the release.

Where an unCLIP-style decoder plugs in
--------------------------------------
The paper's images come from an unCLIP decoder (a diffusion model conditioned on CLIP image embeddings,
e.g. Karlo / Stable unCLIP). To add one, implement the `Decoder` protocol below in a module of this package
(say `models/decoders_unclip.py`), importing its framework inside `load()`, and register it in `DECODERS`
(name → zero-argument factory). The decoder must match the encoder that produced the embeddings: an unCLIP
decoder for CLIP ViT-L/14 expects 768-d `clip-vit-l14` image embeddings, with the same (un)normalisation.
Nothing in dpsynth runs a decoder; it is not required (nor able, offline) to run here.
"""

from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Decoder(Protocol):
    """embedding [b, d] float → uint8 RGB images [b, h, w, 3]."""

    name: str
    encoder_name: str  # the registry name of the encoder whose embedding space it inverts
    embedding_dim: int

    def load(self) -> None:
        """Loads weights (once per process); heavy imports belong here."""

    def decode(self, embeddings: np.ndarray, seed: int | None = None) -> np.ndarray:
        """Synthetic (released) embeddings only; see the module docstring."""


# name → factory; empty until a decoder is added (see module docstring).
DECODERS: dict[str, Callable[[], Decoder]] = {}


def get_decoder(name: str) -> Decoder:
    if name not in DECODERS:
        known = ", ".join(sorted(DECODERS)) or "none registered yet"
        raise ValueError(f"unknown decoder {name!r} ({known}); see models/decoders.py for how to add one")
    return DECODERS[name]()
