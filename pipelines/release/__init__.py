"""A release: the layout, names and checks both sides share (``release``),
publishing a staged release (``publisher``) and reading a published one
(``reading``), the attempt protocol of a run (``protocol``: staged ->
committed -> published), the checks before publishing
(``consistency``), more rows drawn from a published release (``sample``)
and the summary ``dpsynth generate`` prints (``summary``). The lifetime
privacy budget is its own room (``dpsynth.pipelines.budget``).

``from dpsynth.pipelines.release import load_release`` (or ``load_latest``,
``ReleaseError``) reads as it always did; importing this package loads
nothing else (``dpsynth sample --help`` stays free of Beam).
"""

from __future__ import annotations

_READERS = ("ReleaseError", "load_latest", "load_release")


def __getattr__(name: str):
    if name == "ReleaseError":
        from dpsynth.pipelines.release import release
        return release.ReleaseError
    if name in _READERS:
        from dpsynth.pipelines.release import reading
        return getattr(reading, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list:
    return sorted([*globals(), *_READERS])
