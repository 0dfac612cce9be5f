"""dpsynth.pipelines.runners.option_views: Beam's ``view_as`` memoised per options object and
view class gives the values Beam's gives, shares writes the way Beam's views
do, makes a view anew when the options' values were replaced, and asks Beam
once per options object and class."""

from __future__ import annotations

import gc

from apache_beam.options.pipeline_options import (DebugOptions,
                                                  PipelineOptions,
                                                  StandardOptions,
                                                  TypeOptions)

from dpsynth.pipelines.runners import option_views

FLAGS = ["--runner", "dask", "--experiments", "a", "--job_name", "j"]


def _beams():
    option_views.install()
    return option_views._original


def test_views_read_what_beams_views_read():
    beams = _beams()
    memo = option_views.memoised(beams)
    mine, theirs = PipelineOptions(FLAGS), PipelineOptions(FLAGS)
    for cls in (DebugOptions, StandardOptions, TypeOptions, PipelineOptions):
        assert (memo(mine, cls).get_all_options()
                == beams(theirs, cls).get_all_options())
    assert memo(mine, DebugOptions).experiments == ["a"]


def test_writes_through_any_view_reach_the_options_and_later_views():
    memo = option_views.memoised(_beams())
    options = PipelineOptions(FLAGS)
    memo(options, StandardOptions).streaming = True
    memo(options, DebugOptions).experiments.append("b")
    assert options.get_all_options()["streaming"] is True
    assert memo(options, StandardOptions).streaming is True
    assert memo(options, DebugOptions).experiments == ["a", "b"]
    # another options object with the same flags shares nothing
    assert memo(PipelineOptions(FLAGS), DebugOptions).experiments == ["a"]


def test_beam_is_asked_once_per_options_and_class():
    beams = _beams()
    asked = []
    memo = option_views.memoised(
        lambda o, cls: asked.append(cls) or beams(o, cls))
    options = PipelineOptions(FLAGS)
    first = memo(options, TypeOptions)
    for _ in range(5):
        assert memo(options, TypeOptions) is first
    memo(options, DebugOptions)
    assert asked == [TypeOptions, DebugOptions]


def test_a_view_is_made_anew_when_the_values_were_replaced():
    memo = option_views.memoised(_beams())
    options = PipelineOptions(FLAGS)
    old = memo(options, DebugOptions)
    options._all_options = dict(options._all_options, experiments=["z"])
    new = memo(options, DebugOptions)
    assert new is not old and new.experiments == ["z"]


def test_options_are_held_weakly():
    memo = option_views.memoised(_beams())
    options = PipelineOptions(FLAGS)
    memo(options, DebugOptions)
    views = memo.__closure__  # the WeakKeyDictionary among the cells
    table = next(c.cell_contents for c in views
                 if hasattr(c.cell_contents, "keyrefs"))
    assert len(table) == 1
    del options
    gc.collect()
    assert len(table) == 0


def test_installed_for_every_pipeline_dpsynth_builds():
    from dpsynth.pipelines.runners.options import beam_options
    options = beam_options(["--runner", "DirectRunner"])
    assert options.view_as(DebugOptions) is options.view_as(DebugOptions)


def test_replace_once_swaps_once_and_keeps_beams():
    from types import SimpleNamespace

    from dpsynth.pipelines.runners.beam_patch import replace_once
    owner = SimpleNamespace(f=lambda x: x + 1)
    beams = owner.f
    made = []

    def make(original):
        made.append(original)
        return lambda x: original(x) * 10
    assert replace_once(owner, "f", make) is beams
    assert replace_once(owner, "f", make) is beams  # again: no second wrap
    assert made == [beams] and owner.f(1) == 20
