"""Beam's "are we in IPython?" check, without importing IPython.

Beam 2.77 asks ``interactive_utils.is_in_ipython()`` when the first
transform is applied (to relabel transforms typed in a notebook) and when
a pipeline run ends. Its answer imports IPython where it is installed (a
laptop with Jupyter, this project's development machine): ~0.5 s in the
launcher while no worker has work, once per process, in every job.

An IPython session has imported IPython before any of its code runs, so
when ``IPython`` is not in ``sys.modules`` the answer is "no" without the
import; otherwise Beam's own check answers. The same answer, always.
"""

from __future__ import annotations

import sys
import threading
from typing import Callable, Optional

_original: Optional[Callable[[], bool]] = None  # Beam's, once installed
_lock = threading.Lock()
# Beam modules that bind the function by name at import
_BOUND_IN = ("apache_beam.pipeline", "apache_beam.runners.direct.direct_runner")


def install() -> None:
    """Points Beam's ``is_in_ipython`` (and the modules that imported it
    by name) at ``is_in_ipython`` below (idempotent)."""
    global _original
    with _lock:
        if _original is not None:
            return
        import importlib

        from apache_beam.utils import interactive_utils
        _original = interactive_utils.is_in_ipython
        interactive_utils.is_in_ipython = is_in_ipython
        for name in _BOUND_IN:
            module = importlib.import_module(name)
            if getattr(module, "is_in_ipython", None) is _original:
                module.is_in_ipython = is_in_ipython


def is_in_ipython() -> bool:
    """Whether this code runs in an IPython session (Beam's answer),
    without importing IPython when no session can exist."""
    if "IPython" not in sys.modules:
        return False
    return bool(_original()) if _original is not None else False
