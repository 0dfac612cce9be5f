"""Image encoders: one interface (`Encoder`), a registry (`get_encoder`), framework code imported lazily."""

from dpsynth.models.encoders.base import Encoder, EncodeFn, EncoderError, EncoderUnavailableError
from dpsynth.models.encoders.registry import get_encoder, list_encoders

__all__ = ["Encoder", "EncodeFn", "EncoderError", "EncoderUnavailableError", "get_encoder", "list_encoders"]
