import apache_beam as beam
import numpy as np
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from scipy import stats

from dpsynth.dp_ops.ledger import Mechanism, PrivacyLedger
from dpsynth.dp_ops.noise import SecureNoise, SeededNoise
from dpsynth.transforms.aggregate import Block, PerClassSum
from dpsynth.transforms.keyed_noise import AddNoise


def _pipeline():
    return TestPipeline(runner="FnApiRunner")


def _ledger(sigma, n_labels, sensitivity=1.0):
    ledger = PrivacyLedger(1.0, 1e-5)
    for l in range(n_labels):
        ledger.register(Mechanism(f"class={l}/m", "s", f"class={l}",
                                  sensitivity, sigma))
    return ledger


def test_per_class_sum_covers_every_label_even_empty():
    def block(y, value):
        y = np.array(y)
        return Block(np.full((len(y), 1), value), y, np.zeros((len(y), 1)),
                     np.zeros(len(y), np.int64))

    with _pipeline() as p:
        out = (p | beam.Create([block([1, 1, 2], 1.0), block([2], 10.0)])
               | PerClassSum([0, 1, 2], lambda l, blk: float(blk.x.sum())))
        assert_that(out, equal_to([(0, None), (1, 2.0), (2, 11.0)]))


def test_seeded_noise_transform_is_reproducible():
    ledger = _ledger(2.0, 3)
    values = [(l, np.arange(4.0)) for l in range(3)]
    expected = [(l, np.arange(4.0) + SeededNoise(9).gaussian(
        2.0, (4,), f"class={l}/m", 2.0 ** -24)) for l in range(3)]
    with _pipeline() as p:
        out = (p | beam.Create(values)
               | AddNoise(ledger, lambda l: f"class={l}/m", SeededNoise(9))
               | beam.MapTuple(lambda l, v: (l, v.round(10).tolist())))
        assert_that(out, equal_to([(l, v.round(10).tolist())
                                   for l, v in expected]))


def test_noise_transform_has_each_mechanisms_sigma():
    """Empirical std of each key's noise = its own mechanism's sigma."""
    n_labels, dim, sens = 40, 100, 1.5
    ledger = PrivacyLedger(1.0, 1e-5)
    for l in range(n_labels):
        ledger.register(Mechanism(f"class={l}/m", "s", f"class={l}", sens,
                                  1.0 + l % 2))
    with _pipeline() as p:
        out = (p | beam.Create([(l, np.zeros(dim)) for l in range(n_labels)])
               | AddNoise(ledger, lambda l: f"class={l}/m", SecureNoise())
               | beam.combiners.ToList())

        def check(lists):
            for parity in (0, 1):
                draws = np.concatenate([v for l, v in lists[0]
                                        if l % 2 == parity])
                sigma, n = 1.0 + parity, draws.size
                lo, hi = stats.chi2.ppf([0.0005, 0.9995], n)
                s2 = np.mean(draws ** 2)
                assert lo / n * sigma ** 2 <= s2 <= hi / n * sigma ** 2, s2
        assert_that(out, check)
