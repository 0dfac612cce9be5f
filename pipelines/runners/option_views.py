"""Beam's ``PipelineOptions.view_as``, one view per options object and class.

Every ``view_as(cls)`` in Beam 2.77 builds a new argparse parser of every
option ``cls`` and its bases declare and parses the pipeline's flags again
(~0.3 ms). Building a pipeline asks it several times for every transform
(``Pipeline.apply`` and its output type inference, each type-hint check),
so a default job spent ~0.6 s of its driver there (py-spy of a 200k x 384
job on Dask, both pipelines of the adaptive plan), time in which no worker
runs and which grows with the graph, not the data.

A view holds nothing of its own: its values live in the dict it shares
with the options it was made from (``_all_options``), and its parse of the
flags only seeds that dict once. So the first view of each class is kept
and handed out again while the options still have the same flags and dict
(a view made from other flags or a replaced dict is made anew). Options
objects are held weakly: the views go with them.

Measured on Beam 2.77 (commit 1eabd97): 1,329 calls (0.57 s of the
driver) in a default 200k x 384 Dask job, 55 (0.03 s) with the patch; the
demo on DirectRunner with 2 workers 5.44 -> 5.03 s median (8 pairs).
Where ``view_as`` takes other parameters than ``(self, cls)`` or no
longer keeps its values in ``_all_options`` / ``_flags``, the patch is not
installed: Beam's own, and one debug line (``beam_patch.kept``).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Optional

from dpsynth.pipelines.runners.beam_patch import (all_of, reads, replace_once,
                                                  takes)

_original: Optional[Callable[[Any, type], Any]] = None  # Beam's view_as


def install() -> None:
    """Replaces ``PipelineOptions.view_as`` with the memoised one
    (idempotent)."""
    global _original
    from apache_beam.options.pipeline_options import PipelineOptions
    beams = replace_once(
        PipelineOptions, "view_as", memoised,
        fits=all_of(takes("self", "cls"), reads("_all_options", "_flags")))
    _original = beams or _original  # None: Beam's own was kept


def memoised(original: Callable[[Any, type], Any]
             ) -> Callable[[Any, type], Any]:
    """``original`` (Beam's ``view_as``) asked once per options object and
    view class."""
    views: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    lock = threading.Lock()

    def view_as(self, cls):
        try:
            mine = views.get(self)
        except TypeError:  # not weakly referable: not kept
            return original(self, cls)
        view = None if mine is None else mine.get(cls)
        if view is None or not _same_source(view, self):
            view = original(self, cls)
            with lock:
                views.setdefault(self, {})[cls] = view
        return view

    view_as.__doc__ = original.__doc__
    return view_as


def _same_source(view: Any, options: Any) -> bool:
    """Whether ``view`` still reads and writes ``options``' values."""
    return (view._all_options is options._all_options
            and view._flags is options._flags)
