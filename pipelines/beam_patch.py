"""Replacing one of Beam's functions once per process.

dpsynth swaps some of Beam's functions for memoised ones with the same
answers (``dofn_specs``, ``option_views``) or ones that clean up after
themselves (``beam_temp``); each is installed for every pipeline, so the
swap must happen once whatever the number of calls or threads, and keep
Beam's original for the replacement (and the tests) to call.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

_lock = threading.Lock()
_ORIGINAL = "_dpsynth_replaces"  # attribute of a replacement: Beam's


def replace_once(owner: Any, name: str,
                 make: Callable[[Callable], Callable]) -> Callable:
    """Sets ``owner.name`` to ``make(beams)`` unless it was already
    replaced; returns Beam's function either way."""
    with _lock:
        current = getattr(owner, name)
        beams = getattr(current, _ORIGINAL, None)
        if beams is not None:
            return beams
        replacement = make(current)
        setattr(replacement, _ORIGINAL, current)
        setattr(owner, name, replacement)
        return current
