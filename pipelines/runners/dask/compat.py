"""The Beam internals dpsynth's Dask runner builds on, and the shapes of
them it was written for.

``dask_runner.DaskRunner`` subclasses Beam's DaskRunner and swaps two of
its translations and one of its functions. Each relies on the parameters
(and dataclass fields) listed in ``SHAPES``, as measured on the Beam
releases named there. ``refusal()`` compares them with the installed Beam
and returns one line when one differs; ``job.py`` asks before the budget
is reserved, so an unforeseen Beam release stops ``--runner dask`` with
that line (uncharged) instead of a traceback after the charge (Beam 2.78
changed ``to_dask_bag_visitor`` and ``DaskBagWindowedIterator``).

Moving the tested ceiling: add the new release's shapes here if they
changed, raise ``apache-beam<X`` in pyproject.toml, and run CI (it runs the
suite on the newest Beam the range admits and the engine tests on the
floor: deploy/README.md "Beam releases").
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any, Callable, Optional

# What each override calls or replaces: the shapes seen on each tested
# release (2.71-2.77: the first; 2.78 added ``lazy_side_inputs``). The
# tested range itself is pyproject.toml's (``tested_range``).
SHAPES: dict[str, tuple[tuple[str, ...], ...]] = {
    # DaskRunner.to_dask_bag_visitor (a staticmethod we call and extend)
    "to_dask_bag_visitor": (("bag_kwargs",),
                            ("bag_kwargs", "lazy_side_inputs")),
    # DaskBagWindowedIterator's fields (we replace the class in Beam's module)
    "DaskBagWindowedIterator": (("bag", "window_fn"),
                                ("bag", "window_fn", "lazy_side_inputs")),
    # transform_evaluator.apply_dofn_to_bundle (replaced)
    "apply_dofn_to_bundle": (("items", "do_fn_invoker_args",
                              "do_fn_invoker_kwargs", "tagged_receivers"),),
    # ParDo.apply / GroupByKey.apply (subclassed)
    "ParDo.apply": (("self", "input_bag", "side_inputs"),),
    "GroupByKey.apply": (("self", "input_bag", "side_inputs"),),
    # DaskRunner.run_pipeline (subclassed, super() called)
    "DaskRunner.run_pipeline": (("self", "pipeline", "options"),),
}
# The DaskOptions destinations dask_runner reads.
OPTIONS = ("address", "scheduler_file", "npartitions", "partition_size")


def _params(fn: Any) -> tuple[str, ...]:
    fn = getattr(fn, "_dpsynth_replaces", fn)  # Beam's, once swapped
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # nothing to read: no fit
        return ()


def _fields(cls: Any) -> tuple[str, ...]:
    if not dataclasses.is_dataclass(cls):
        return ()
    return tuple(f.name for f in dataclasses.fields(cls))


def installed_shapes() -> dict[str, tuple[str, ...]]:
    """The shapes of the installed Beam's Dask internals (empty tuples
    where a name is missing)."""
    from apache_beam.runners.dask import dask_runner as beam_dask
    from apache_beam.runners.dask import transform_evaluator as te
    return {
        "to_dask_bag_visitor": _params(
            getattr(beam_dask.DaskRunner, "to_dask_bag_visitor", None)),
        "DaskBagWindowedIterator": _fields(
            getattr(beam_dask, "DaskBagWindowedIterator", None)),
        "apply_dofn_to_bundle": _params(
            getattr(te, "apply_dofn_to_bundle", None)),
        "ParDo.apply": _params(getattr(getattr(te, "ParDo", None),
                                       "apply", None)),
        "GroupByKey.apply": _params(getattr(getattr(te, "GroupByKey", None),
                                            "apply", None)),
        "DaskRunner.run_pipeline": _params(
            getattr(beam_dask.DaskRunner, "run_pipeline", None)),
    }


def tested_range() -> str:
    """The Beam range dpsynth declares (and CI tests), from the installed
    package's metadata: ``>=2.71,<2.79``."""
    from importlib.metadata import PackageNotFoundError, requires
    try:
        reqs = requires("dpsynth") or []
    except PackageNotFoundError:  # a checkout on PYTHONPATH
        return "the range pyproject.toml declares"
    for req in reqs:
        found = re.match(r"apache-beam\s*\(?([^;)]*)", req)
        if found and "extra" not in req:
            return ",".join(sorted(found.group(1).replace(" ", "").split(","),
                                   key=lambda p: not p.startswith(">")))
    return "the range pyproject.toml declares"


def _missing_options() -> list[str]:
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.dask.dask_runner import DaskOptions
    have = PipelineOptions([]).view_as(DaskOptions).get_all_options()
    return [name for name in OPTIONS if name not in have]


def refusal() -> Optional[str]:
    """None where the installed Beam's Dask runner has the shapes dpsynth's
    was written for; else one line saying what differs and what to do."""
    import apache_beam
    try:
        shapes = installed_shapes()
        missing = _missing_options()
    except ImportError as err:  # Beam's Dask extra is not installed
        return (f"--runner dask needs Beam's Dask runner ({err}): pip install "
                "'dpsynth[dask]'")
    differ = [name for name, seen in shapes.items()
              if seen not in SHAPES[name]]
    differ += [f"DaskOptions.{name}" for name in missing]
    if not differ:
        return None
    tested = tested_range()
    return (f"--runner dask: dpsynth's Dask runner was written for Beam "
            f"{tested}, and Beam {apache_beam.__version__} differs in "
            f"{', '.join(differ)}; nothing was read or charged: install a "
            f"tested Beam (pip install 'apache-beam[dask]{tested}') or use "
            f"another --runner")


def beam_visitor(bag_kwargs: Any, lazy_side_inputs: bool) -> Any:
    """Beam's own visitor, called with the arguments its release takes."""
    from apache_beam.runners.dask import dask_runner as beam_dask
    make: Callable = beam_dask.DaskRunner.to_dask_bag_visitor
    if "lazy_side_inputs" in _params(make):
        return make(bag_kwargs, lazy_side_inputs)
    return make(bag_kwargs)
