"""Beam's "are we in IPython?" check, without importing IPython.

Beam 2.77 asks ``interactive_utils.is_in_ipython()`` when the first
transform is applied (to relabel transforms typed in a notebook) and when
a pipeline run ends. Its answer imports IPython where it is installed (a
laptop with Jupyter, this project's development machine): ~0.5 s in the
launcher while no worker has work, once per process, in every job.

An IPython session has imported IPython before any of its code runs, so
when ``IPython`` is not in ``sys.modules`` the answer is "no" without the
import; otherwise Beam's own check answers. The same answer, always.

Measured on Beam 2.77 (commit df1215d): the demo 6.33 -> 5.91 s median
(6 pairs) where IPython is installed; nothing where it is not. Re-measured
on the demo (``dpsynth generate``, 8 alternating pairs, a loaded 2-core
machine): CPU 3.95 vs 4.03 s median (ratio 0.99, 0.97-1.05: within the
noise), peak memory 303 vs 328 MiB (no overlap: IPython is not loaded).
Kept for the memory. Where
``is_in_ipython`` takes parameters the patch is not installed: Beam's own
check, and one debug line (``beam_patch.kept``).
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable, Optional

from dpsynth.pipelines.runners.beam_patch import replace_once, takes

_original: Optional[Callable[[], bool]] = None  # Beam's, once installed
# Beam modules that bind the function by name at import
_BOUND_IN = ("apache_beam.pipeline", "apache_beam.runners.direct.direct_runner")


def install() -> None:
    """Points Beam's ``is_in_ipython`` (and the modules that imported it
    by name) at ``is_in_ipython`` below (idempotent)."""
    global _original
    from apache_beam.utils import interactive_utils
    beams = replace_once(interactive_utils, "is_in_ipython",
                         lambda _: is_in_ipython, fits=takes())
    if beams is None:  # Beam's own kept
        return
    _original = beams
    for name in _BOUND_IN:
        module = importlib.import_module(name)
        if getattr(module, "is_in_ipython", None) is beams:
            module.is_in_ipython = is_in_ipython


def is_in_ipython() -> bool:
    """Whether this code runs in an IPython session (Beam's answer),
    without importing IPython when no session can exist."""
    if "IPython" not in sys.modules:
        return False
    return bool(_original()) if _original is not None else False
