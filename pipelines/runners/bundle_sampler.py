"""Beam's per-bundle state sampler, asked to wake every 10 ms, not 200.

Every bundle a Beam SDK worker runs (2.77, ``BundleProcessor.
process_bundle``) starts a ``StateSampler`` thread that sleeps in steps
growing from 2 ms to ``sampling_period_ms`` (200), and ends by joining it:
the bundle is not done until the thread's current sleep is over. A bundle
of a second or more waits ~140 ms there (measured: 138-143 ms for 1 and
2 s bundles, 12 ms for 0.3 s), with its worker idle, and the next stage
waits for it. The passes over the data and the writers are such bundles,
one per worker and stage: a ``--clusters 16`` job (1M x 384, DirectRunner,
2 workers) spent 0.76 and 1.09 s of its two workers' time in these waits,
0.09 and 0.13 s with a 10 ms period.

The sampler only measures time per step (Beam's msec counters and its
report of a step stuck for minutes); waking every 10 ms keeps both (finer,
at a cost of microseconds a wake). Installed where dpsynth runs Beam's
workers: the submitting process (the in-process runner of one worker,
LOOPBACK environments of Flink, Spark and Prism) and the fork server of
DirectRunner's worker processes (``dpsynth.pipelines.runners.worker_fork``). Workers that
Beam starts itself elsewhere (Dataflow, DOCKER or PROCESS environments)
keep Beam's period.

Measured on Beam 2.77 (commit 1c81018). The demo job's bundles are short
(a 12 ms wait each), and an A/B on it (10 alternating pairs, a loaded
2-core machine) is within the noise: CPU ratio 0.99 (0.97-1.06), wall
0.92 (0.62-1.67); the gain is on jobs with bundles of a second or more.
Where ``StateSampler.__init__``
has other parameters than ``(self, prefix, counter_factory,
sampling_period_ms)`` the patch is not installed: Beam's period, and one
debug line (``beam_patch.kept``).
"""

from __future__ import annotations

from typing import Any, Callable

from dpsynth.pipelines.runners.beam_patch import replace_once, takes

SAMPLING_PERIOD_MS = 10


def install() -> None:
    """New samplers made without a period get ``SAMPLING_PERIOD_MS``
    (idempotent; samplers made with an explicit period keep it)."""
    from apache_beam.runners.worker import statesampler
    replace_once(statesampler.StateSampler, "__init__", shorter_period,
                 fits=takes("self", "prefix", "counter_factory",
                            "sampling_period_ms"))


def shorter_period(original: Callable[..., None]) -> Callable[..., None]:
    """``StateSampler.__init__`` with ``SAMPLING_PERIOD_MS`` as its
    default period."""

    def __init__(self, prefix: str, counter_factory: Any,
                 sampling_period_ms: int = SAMPLING_PERIOD_MS) -> None:
        original(self, prefix, counter_factory, sampling_period_ms)

    __init__.__doc__ = original.__doc__
    return __init__
