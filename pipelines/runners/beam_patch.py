"""Replacing one of Beam's functions once per process, only where it is
the function the replacement was written for.

dpsynth swaps some of Beam's functions for memoised ones with the same
answers (``dofn_specs``, ``option_views``) or ones that clean up after
themselves (``temp_cleanup``); each is installed for every pipeline, so the
swap must happen once whatever the number of calls or threads, and keep
Beam's original for the replacement (and the tests) to call.

Each replacement relies on the shape of what it replaces (its parameters,
the attributes it reads), measured on one range of Beam versions. Another
Beam may differ: then the swap is not made, Beam's own behaviour stays,
and one debug line says so (``kept``). A job never fails for it.
"""

from __future__ import annotations

import inspect
import logging
import threading
from typing import Any, Callable, Optional

log = logging.getLogger(__name__)

_lock = threading.Lock()
_ORIGINAL = "_dpsynth_replaces"  # attribute of a replacement: Beam's
_said: set = set()  # (owner, name) whose "kept" line was logged

Check = Callable[[Any], bool]


def replace_once(owner: Any, name: str,
                 make: Callable[[Callable], Callable],
                 fits: Optional[Check] = None) -> Optional[Callable]:
    """Sets ``owner.name`` to ``make(beams)`` unless it was already
    replaced; returns Beam's function either way. Where ``fits(beams)`` is
    false (this Beam's function is not the one ``make`` was written for),
    nothing is replaced, one debug line is logged, and None returned."""
    with _lock:
        current = getattr(owner, name, None)
        beams = getattr(current, _ORIGINAL, None)
        if beams is not None:
            return beams
        if current is None or (fits is not None and not fits(current)):
            kept(owner, name)
            return None
        replacement = make(current)
        setattr(replacement, _ORIGINAL, current)
        setattr(owner, name, replacement)
        return current


def kept(owner: Any, name: str) -> None:
    """The one debug line of a patch not installed (once per process and
    internal, however often the install is asked for)."""
    where = _where(owner)
    key = (where, name, id(getattr(owner, name, None)))
    if key in _said:
        return
    _said.add(key)
    log.debug("dpsynth: %s.%s is not the shape its patch was measured on; "
              "Beam's own behaviour is kept", where, name)


def _where(owner: Any) -> str:
    """A module's or a class's dotted name."""
    if inspect.ismodule(owner):
        return owner.__name__
    return f"{getattr(owner, '__module__', '?')}." \
           f"{getattr(owner, '__qualname__', type(owner).__name__)}"


def takes(*params: str) -> Check:
    """A check: the function's parameters are exactly ``params``, in order."""
    def fits(fn: Any) -> bool:
        try:
            return list(inspect.signature(fn).parameters) == list(params)
        except (TypeError, ValueError):  # no signature to read
            return False
    return fits


def reads(*names: str) -> Check:
    """A check: the function's code uses every name in ``names`` (the
    attributes of Beam's objects that the replacement relies on)."""
    def fits(fn: Any) -> bool:
        code = getattr(fn, "__code__", None)
        return code is not None and set(names) <= set(code.co_names)
    return fits


def all_of(*checks: Check) -> Check:
    """A check that passes where every one of ``checks`` passes."""
    return lambda fn: all(check(fn) for check in checks)
