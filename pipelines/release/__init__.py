"""A release: staging, atomic publication and reading (``release``), the
checks before publishing (``consistency``), more rows drawn from a
published release (``sample``) and the summary ``dpsynth generate`` prints
(``summary``). The lifetime privacy budget is its own room
(``dpsynth.pipelines.budget``).

``from dpsynth.pipelines.release import load_release`` (or ``load_latest``,
``ReleaseError``) reads as it always did; importing this package loads
nothing else (``dpsynth sample --help`` stays free of Beam).
"""

from __future__ import annotations

_READERS = ("ReleaseError", "load_latest", "load_release")


def __getattr__(name: str):
    if name in _READERS:
        from dpsynth.pipelines.release import release
        return getattr(release, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list:
    return sorted([*globals(), *_READERS])
