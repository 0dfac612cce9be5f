"""Beam's check for state and timers, memoised per DoFn class.

Beam 2.77 asks ``userstate.get_dofn_specs(dofn)`` whether a DoFn keeps
state or timers several times for every ParDo while it builds, translates
and runs a pipeline, and each answer wraps every method of the DoFn and
reads its signature (``inspect.signature``): ~39,000 signatures for the
~360 transforms of a ``--clusters 16`` job (1,458 questions about 359
DoFns). That time is serial (no worker runs meanwhile) and grows with the
graph, not the data. Memoised: 298 of the questions reach Beam, 13,800
signatures; the job on 20k x 16 rows in memory takes 2.8-3.1 s instead
of 3.4-3.6 s (three runs each, byte-identical releases).

The answer comes from the default values of the class's methods
(``DoFn.StateParam`` / ``TimerParam``), so it is kept per class, except
where it may depend on the instance: a class with an ``_inspect_<method>``
hook (Beam's ``CallableWrapperDoFn`` of every ``Map`` / ``FlatMap``: the
wrapped function's parameters) or an instance holding a bound method
(``get_dofn_specs`` inspects it too). Those are kept per instance (each is
asked ~4 times: building, translating, running). Each caller gets its own
sets.

Measured on Beam 2.77 (commit 2e17fdb). Where ``get_dofn_specs`` takes
other parameters than ``(dofn)`` the patch is not installed: Beam's own
check, and one debug line (``beam_patch.kept``).
"""

from __future__ import annotations

import threading
import types
import weakref
from typing import Any, Callable, Optional

from dpsynth.pipelines.runners.beam_patch import replace_once, takes

_original: Optional[Callable[[Any], tuple]] = None  # Beam's, once installed


def install() -> None:
    """Replaces ``userstate.get_dofn_specs`` with the memoised one
    (idempotent)."""
    global _original
    from apache_beam.transforms import userstate
    beams = replace_once(userstate, "get_dofn_specs", memoised,
                         fits=takes("dofn"))
    _original = beams or _original  # None: Beam's own was kept


def memoised(original: Callable[[Any], tuple]) -> Callable[[Any], tuple]:
    """``original`` (Beam's ``get_dofn_specs``) asked once per DoFn class,
    or per instance where the answer may depend on it."""
    by_class: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    by_instance: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    lock = threading.Lock()

    def get_dofn_specs(dofn: Any) -> tuple[set, set]:
        key, memo = ((type(dofn), by_class) if class_level(dofn)
                     else (dofn, by_instance))
        try:
            specs = memo.get(key)
        except TypeError:  # not weakly referable: not kept
            return original(dofn)
        if specs is None:
            specs = original(dofn)
            with lock:
                memo[key] = specs
        return set(specs[0]), set(specs[1])

    return get_dofn_specs


def class_level(dofn: Any) -> bool:
    """Whether ``get_dofn_specs(dofn)`` depends on the DoFn's class alone."""
    if any(name.startswith("_inspect_") for name in dir(type(dofn))):
        return False
    return not any(isinstance(value, types.MethodType)
                   for value in getattr(dofn, "__dict__", {}).values())
