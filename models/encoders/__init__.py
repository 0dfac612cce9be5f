"""Image encoders: one interface (`Encoder`), a registry (`get_encoder`), framework code imported lazily."""

from models.encoders.base import Encoder, EncodeFn, EncoderError, EncoderUnavailableError
from models.encoders.registry import get_encoder, list_encoders

__all__ = ["Encoder", "EncodeFn", "EncoderError", "EncoderUnavailableError", "get_encoder", "list_encoders"]
