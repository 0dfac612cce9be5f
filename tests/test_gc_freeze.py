"""The job's process keeps its startup objects out of the cyclic
collector's full scans while a job runs (pipelines/runners/gc_freeze.py)."""

from __future__ import annotations

import gc

import pytest

from dpsynth.pipelines import job
from dpsynth.pipelines.runners import gc_freeze


@pytest.fixture
def nothing_frozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_the_heap_is_frozen_for_the_block_and_handed_back(nothing_frozen):
    with gc_freeze.startup_heap_frozen():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0  # collected as before after the job


def test_handed_back_when_the_block_fails(nothing_frozen):
    with pytest.raises(RuntimeError):
        with gc_freeze.startup_heap_frozen():
            raise RuntimeError("a failed job")
    assert gc.get_freeze_count() == 0


def test_a_host_that_froze_its_heap_keeps_it(nothing_frozen):
    gc.freeze()
    frozen = gc.get_freeze_count()
    with gc_freeze.startup_heap_frozen():
        pass
    assert gc.get_freeze_count() == frozen


def test_a_job_runs_with_its_startup_heap_frozen(nothing_frozen,
                                                  monkeypatch):
    seen = []
    monkeypatch.setattr(job, "_run",
                        lambda spec: seen.append(gc.get_freeze_count()))
    job.run(None)
    assert seen and seen[0] > 0
    assert gc.get_freeze_count() == 0
