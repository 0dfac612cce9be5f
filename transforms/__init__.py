"""dpsynth Beam PTransforms.

Encoder transforms are exported lazily: importing them pulls in Beam's
RunInference (and torch, where installed), which most users of this package
never need.
"""

_LAZY = {"EncodeImages": "encode", "ToBlocks": "encode",
         "EncoderModelHandler": "encode", "ReadImages": "images",
         "CheckBadImages": "images"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f"transforms.{_LAZY[name]}"), name)
    raise AttributeError(name)
