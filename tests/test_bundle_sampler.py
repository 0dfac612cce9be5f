"""dpsynth.pipelines.runners.bundle_sampler: Beam's per-bundle state sampler wakes every
10 ms where dpsynth runs Beam's workers (the submitting process and
DirectRunner's forked worker processes), so a long bundle no longer ends
with its worker waiting up to 200 ms for the sampler's sleep; a sampler
made with an explicit period keeps it."""

from __future__ import annotations

import os

import apache_beam as beam
import pytest
from apache_beam.runners.worker import statesampler
from apache_beam.utils import counters

from dpsynth.pipelines.runners import bundle_sampler, direct_runner, worker_fork
from dpsynth.pipelines.runners.options import beam_options

HERE = os.path.dirname(os.path.abspath(__file__))


def _sampler(*period):
    return statesampler.StateSampler("step", counters.CounterFactory(),
                                     *period)


def test_samplers_made_without_a_period_wake_every_10_ms():
    bundle_sampler.install()
    bundle_sampler.install()
    assert _sampler().sampling_period_ms == bundle_sampler.SAMPLING_PERIOD_MS
    assert _sampler(200).sampling_period_ms == 200
    beams = statesampler.StateSampler.__init__._dpsynth_replaces
    wrapped = bundle_sampler.shorter_period(beams)
    assert wrapped.__doc__ == beams.__doc__
    assert statesampler.DEFAULT_SAMPLING_PERIOD_MS == 200  # Beam's, kept


class _Period(beam.DoFn):
    """The sampling period of the bundle this element runs in."""

    def process(self, x):
        from apache_beam.runners.worker import statesampler
        yield statesampler.get_current_tracker().sampling_period_ms


def _periods(tmp_path, monkeypatch, argv) -> set:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [HERE] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    out = tmp_path / "periods.txt"
    with beam.Pipeline(options=beam_options(argv)) as p:
        _ = (p | beam.Create(list(range(16))) | beam.Reshuffle()
             | beam.ParDo(_Period()) | beam.Distinct()
             | beam.Map(repr) | beam.io.WriteToText(str(out)))
    return {int(line) for f in tmp_path.glob("periods.txt*")
            for line in f.read_text().splitlines()}


def test_the_in_process_worker_wakes_every_10_ms(tmp_path, monkeypatch):
    assert _periods(tmp_path, monkeypatch, ["--direct_num_workers", "1"]) \
        == {bundle_sampler.SAMPLING_PERIOD_MS}


@pytest.mark.skipif(not worker_fork.supported(),
                    reason="no process file descriptors (pidfd) on this "
                           "system: DirectRunner starts Beam's own workers")
def test_forked_workers_wake_every_10_ms(tmp_path, monkeypatch):
    direct_runner.start_worker_server()
    assert _periods(tmp_path, monkeypatch,
                    ["--direct_num_workers", "2",
                     "--direct_running_mode", "multi_processing"]) \
        == {bundle_sampler.SAMPLING_PERIOD_MS}
