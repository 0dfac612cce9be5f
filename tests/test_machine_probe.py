"""benchmarks/machine_probe.py: the memory reading beside each timed run."""

from __future__ import annotations

import math

from benchmarks import machine_probe


def test_probe_reads_both_and_leaves_nothing(tmp_path):
    reading = machine_probe.probe(str(tmp_path), mb=16)
    assert set(reading) == {"first_touch_s_per_gb", "page_cache_write_gb_s"}
    assert all(v > 0 and math.isfinite(v) for v in reading.values())
    assert list(tmp_path.iterdir()) == []  # the written file is removed


def test_describe_formats_a_reading_or_its_absence():
    assert machine_probe.describe({}) == "-"
    assert machine_probe.describe({"first_touch_s_per_gb": 2.345,
                                   "page_cache_write_gb_s": 0.5}) == (
        "2.35 / 0.50")


def test_the_worker_sweep_reports_the_reading():
    from benchmarks.scaling import workers_report
    runs = [dict(config="default", engine="direct", n=10, d=4, flags="",
                 workers=w, repeat=0, work_s=t, rc=0,
                 machine={"first_touch_s_per_gb": 2.0,
                          "page_cache_write_gb_s": 1.25})
            for w, t in ((1, 10.0), (2, 6.0))]
    text = workers_report(runs)
    assert "| release | memory |" in text
    assert "| 2.00 / 1.25 |" in text
