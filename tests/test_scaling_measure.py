"""benchmarks.scaling.measure: the harness around every timed run must not
take CPU from the run it times (issue 27: its PSS readings, every 0.2 s,
took ~11 % of a core, only noticed when W = 2 left no core idle)."""
import sys

from benchmarks import scaling

SLEEP = [sys.executable, "-c", "import time; time.sleep(1.0)"]


def test_pss_is_read_once_per_interval_not_every_poll(monkeypatch):
    calls = []
    real = scaling._resident

    def counting(proc):
        calls.append(proc.pid)
        return real(proc)

    monkeypatch.setattr(scaling, "_resident", counting)
    stats = scaling.measure(SLEEP, timeout=30, poll=0.05, pss_every=60)
    assert stats["rc"] == 0 and not stats["over_memory"]
    assert len(set(calls)) == len(calls) == 1  # one reading, ~20 polls
    assert stats["peak_rss_sum"] > 0
    assert stats["wall_s"] < 5  # ends when the run ends, not a poll later


def test_a_run_over_the_memory_cap_is_killed_on_its_pss():
    stats = scaling.measure(SLEEP, timeout=30, max_rss=1, poll=0.05,
                            pss_every=60)
    assert stats["over_memory"]
    assert stats["rc"] != 0  # killed


def test_a_run_past_its_timeout_is_killed():
    stats = scaling.measure(SLEEP, timeout=0.2, poll=0.05)
    assert stats["timed_out"] and stats["rc"] != 0
