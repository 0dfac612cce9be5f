"""dpsynth.pipelines.runners.dofn_specs: Beam's state-and-timer check memoised per DoFn
class (or per instance where the answer may depend on it) gives Beam's
answers, and asks Beam once per class or instance."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.transforms import userstate
from apache_beam.transforms.userstate import (BagStateSpec, TimerSpec,
                                              on_timer)
from apache_beam.transforms.timeutil import TimeDomain

from dpsynth.pipelines.runners import dofn_specs

BAG = BagStateSpec("bag", VarIntCoder())
TIMER = TimerSpec("timer", TimeDomain.WATERMARK)


class Plain(beam.DoFn):
    def process(self, x):
        yield x


class Stateful(beam.DoFn):
    def process(self, x, bag=beam.DoFn.StateParam(BAG),
                timer=beam.DoFn.TimerParam(TIMER)):
        yield x

    @on_timer(TIMER)
    def expired(self):
        pass


class HoldsAMethod(beam.DoFn):
    def __init__(self, other):
        self.helper = other.process  # inspected by Beam too

    def process(self, x):
        yield x


def _dofns():
    return [Plain(), Stateful(), HoldsAMethod(Stateful()),
            beam.Map(lambda x: x).fn, beam.FlatMap(lambda x: [x]).fn]


def test_memoised_answers_are_beams():
    dofn_specs.install()
    for dofn in _dofns():
        assert (userstate.get_dofn_specs(dofn)
                == dofn_specs._original(dofn)), dofn
    assert userstate.get_dofn_specs(Stateful()) == ({BAG}, {TIMER})


def test_beam_is_asked_once_per_class_or_instance():
    dofn_specs.install()
    asked = []
    get = dofn_specs.memoised(
        lambda d: asked.append(d) or dofn_specs._original(d))
    plain, other, mapped = Plain(), Plain(), beam.Map(lambda x: x).fn
    for _ in range(3):
        for dofn in (plain, other, mapped):
            assert get(dofn) == dofn_specs._original(dofn)
    assert asked == [plain, mapped]  # Plain once for both; the Map's once
    assert dofn_specs.class_level(plain)
    assert not dofn_specs.class_level(mapped)
    assert not dofn_specs.class_level(HoldsAMethod(plain))


def test_each_caller_gets_its_own_sets():
    dofn_specs.install()
    states, _ = userstate.get_dofn_specs(Stateful())
    states.clear()
    assert userstate.get_dofn_specs(Stateful())[0] == {BAG}
