"""Which engine a run's flags choose (``runners.engine``): the one place
that maps a ``--runner`` value to an engine module. Imports the chosen
engine's module only."""

from __future__ import annotations

import importlib
from typing import Optional, Sequence

from dpsynth.pipelines.runners import prism, runner_names
from dpsynth.pipelines.runners.engine import Engine

# runner flag (lower case) -> "module:Class", checked in order; the first
# whose test accepts the flag wins.
_ENGINES = (
    ("direct", "dpsynth.pipelines.runners.direct_runner:DirectEngine"),
    ("dask", "dpsynth.pipelines.runners.dask:DaskEngine"),
    ("prism", "dpsynth.pipelines.runners.prism:PrismEngine"),
    ("dataflow", "dpsynth.pipelines.runners.portable:DataflowEngine"),
    ("portable", "dpsynth.pipelines.runners.portable:PortableEngine"),
)


def kind(runner: Optional[str]) -> str:
    """Which engine a ``--runner`` value names: direct, dask, prism,
    dataflow or portable (Flink, Spark and any other Beam runner)."""
    if runner is None:
        return "direct"
    short = runner.lower().rsplit(".", 1)[-1]
    if runner.lower() in runner_names.LOCAL_RUNNERS or \
            short in runner_names.LOCAL_RUNNERS:
        return "direct"
    if runner_names.is_dask(runner):
        return "dask"
    if prism.is_prism(runner):
        return "prism"
    if "dataflow" in short:
        return "dataflow"
    return "portable"


def resolve(beam_args: Sequence[str]) -> Engine:
    """The engine the flags choose (``--runner``; DirectRunner without)."""
    runner = runner_names.runner_flag(beam_args)
    wanted = kind(runner)
    path = dict(_ENGINES)[wanted]
    module, cls = path.split(":")
    return getattr(importlib.import_module(module), cls)(beam_args, runner)
