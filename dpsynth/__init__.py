"""dpsynth: differentially private synthetic embedding datasets.

Installed, the design's folders (``pipelines``, ``transforms``, ``dp_ops``,
``models``, ``deploy``) are this package's subpackages, so dpsynth takes one
top-level name beside a user's own packages. In a source checkout they sit
beside this folder; ``__path__`` then also covers the checkout's root so
``dpsynth.pipelines`` resolves without an install (a second worktree, a
plain ``PYTHONPATH``).
"""

from __future__ import annotations

import os

from dpsynth.version import __version__  # noqa: F401 (a leaf module)

_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if (not os.path.isdir(os.path.join(os.path.dirname(__file__), "pipelines"))
        and os.path.isfile(os.path.join(_CHECKOUT, "pipelines", "cli", "__init__.py"))):
    __path__.append(_CHECKOUT)  # noqa: F821 (a package's own __path__)

# The API's names at the top (``from dpsynth import generate, GenerateSpec``),
# imported on first use: ``import dpsynth`` (and ``dpsynth --help``) stays
# free of Beam.
_API = ("BudgetOptions", "EncodeSpec", "EvaluateSpec", "GenerateSpec",
        "GeneratorOptions", "ImageOptions", "InputOptions", "MLPOptions",
        "OutputOptions", "Release", "RunOptions", "encode",
        "evaluate", "generate", "sample")
_READERS = ("load_latest", "load_release")  # dpsynth.pipelines.release.reading


def __getattr__(name: str):
    if name in _API:
        from dpsynth.pipelines import api
        return getattr(api, name)
    if name in _READERS:
        from dpsynth.pipelines.release import reading
        return getattr(reading, name)
    raise AttributeError(f"module 'dpsynth' has no attribute {name!r}")


def __dir__() -> list:
    return sorted([*globals(), *_API, *_READERS])
