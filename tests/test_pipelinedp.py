"""PipelineDP (pinned 0.3.1) for the per-class counts, clipped sums and
second moments: what works byte-identically and what the pinned version
cannot do."""

import numpy as np
import pytest

import apache_beam as beam
import pipeline_dp

from dpsynth.dp_ops import adaptive, covariance, generator, plan
from dpsynth.dp_ops.ledger import GLOBAL, Mechanism, PrivacyLedger
from dpsynth.dp_ops.noise import SeededNoise
from dpsynth.transforms.aggregate import Block
from dpsynth.transforms.pipelinedp import (
    PINNED_VERSION, ClassAggregation, ClassSums, KeyedSumCombiner,
    LedgerAccountant, _Concatenated, class_count_family,
    class_second_moment_family, class_sum_family, pieces)

LABELS, D, R, SIGMA = [0, 1, 2, 3], 5, 0.7, 3.0
FAMILY = "moments/sum"


def _ledger(sigma=SIGMA):
    ledger = PrivacyLedger(2.0, 1e-5)
    for c in LABELS:
        ledger.register(Mechanism(adaptive.sum_name(c), "moments",
                                  plan.partition(c), R, sigma))
    return ledger


def _data(n=300, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, D))
    x *= np.minimum(1, R / np.linalg.norm(x, axis=1))[:, None]
    return x, rng.integers(0, 3, n)  # class 3 has no rows


def _blocks(x, y, size):
    out = []
    for i in range(0, len(y), size):
        o = np.argsort(y[i:i + size], kind="stable")
        xx, yy = x[i:i + size][o], y[i:i + size][o]
        out.append(Block(xx, yy, np.zeros((len(yy), 0)),
                         np.zeros(len(yy), np.int64)))
    return out


def _save(folder):
    """A sink for (label, array): one .npy file each (the runner pickles
    the functions, so a closure over a dict would fill a copy)."""
    return beam.Map(lambda kv: np.save(f"{folder}/{kv[0]}.npy", kv[1]))


def _load(folder):
    return {c: np.load(f"{folder}/{c}.npy") for c in LABELS
            if (folder / f"{c}.npy").exists()}


def _pipelinedp_sums(x, y, size, ledger, noise, folder, family=None):
    folder.mkdir()
    with beam.Pipeline() as p:
        t = ClassSums(LABELS, D, family or class_sum_family(R), ledger,
                      noise)
        out = p | beam.Create(_blocks(x, y, size)) | t
        t.aggregation.accountant.compute_budgets()
        out | _save(folder)
    return _load(folder), t.aggregation.explain()


def _today_sums(x, y, ledger, noise):
    """The class sums as the in-memory reference releases them (the Beam
    job's release equals it: tests/test_generate_adaptive.py)."""
    exact = np.stack([adaptive.block_class_sum(x[y == c], R) for c in LABELS])
    return dict(zip(LABELS, adaptive.noisy_class_sums(exact, LABELS, ledger,
                                                      noise)))


def test_pinned_version():
    assert pipeline_dp.__version__ == PINNED_VERSION


def test_release_byte_identical_to_today_for_a_seeded_key(tmp_path):
    x, y = _data()
    ledger = _ledger()
    today = _today_sums(x, y, ledger, SeededNoise(7))
    assert sorted(today) == LABELS
    for size in (64, 37):  # block boundaries never change the bits
        got, _ = _pipelinedp_sums(x, y, size, ledger, SeededNoise(7),
                                  tmp_path / f"p{size}")
        assert sorted(got) == LABELS  # the empty class too
        for c in LABELS:
            assert got[c].tobytes() == today[c].tobytes(), c
    other, _ = _pipelinedp_sums(x, y, 64, ledger, SeededNoise(8),
                                tmp_path / "other")
    assert other[0].tobytes() != today[0].tobytes()


def test_class_second_moments_byte_identical(tmp_path):
    """The per-class mode's d x d moments: isometric upper-triangle noise."""
    x, y = _data()
    ledger = PrivacyLedger(2.0, 1e-5)
    for c in LABELS:
        ledger.register(Mechanism(plan.class_covariance(c), "covariance",
                                  plan.partition(c), R * R, SIGMA))
    got, text = _pipelinedp_sums(x, y, 37, ledger, SeededNoise(3),
                                 tmp_path / "m", class_second_moment_family(R))
    for c in LABELS:
        exact = covariance.block_second_moment(x[y == c], R)
        want = generator.noisy_second_moment(exact, ledger, SeededNoise(3),
                                             plan.class_covariance(c))
        assert got[c].tobytes() == want.tobytes(), c
    assert "class=<c>/covariance/second-moment" in text


def test_explain_computation_text_names_our_mechanism(tmp_path):
    x, y = _data(60)
    _, text = _pipelinedp_sums(x, y, 64, _ledger(), SeededNoise(1),
                               tmp_path / "p")
    assert "Partition selection: public partitions" in text
    assert "contribution_bounds_already_enforced=True" in text
    assert "class=<c>/moments/sum" in text and "sigma=3;" in text
    # PipelineDP adds no stage of its own but the empty public partitions:
    # no bounding, sampling, partition selection or noise.
    stages = [s for s in text.split("Computation graph:")[1].splitlines()
              if s.strip()]
    assert len(stages) == 2 and "empty partitions" in stages[0]


def test_empty_public_partition_has_no_key_without_seeds():
    """Limitation: compute_metrics is not given the partition key and the
    empty public partitions' accumulators are create_accumulator([]), so a
    class without rows could not get its keyed draw; ClassSums seeds each
    label."""
    ledger, (x, y) = _ledger(), _data(60)
    comb = KeyedSumCombiner(class_sum_family(R), LABELS, D, ledger,
                            SeededNoise(1))
    accountant = LedgerAccountant(ledger)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
    params = pipeline_dp.AggregateParams(
        noise_kind=pipeline_dp.NoiseKind.GAUSSIAN, metrics=[],
        max_partitions_contributed=1, max_contributions_per_partition=1,
        contribution_bounds_already_enforced=True,
        public_partitions_already_filtered=True, custom_combiners=[comb])
    rows = [(int(c), (int(c), adaptive.block_class_sum(x[i:i + 1], R)))
            for i, c in enumerate(y)]
    out = engine.aggregate(rows, params, pipeline_dp.DataExtractors(
        partition_extractor=lambda kv: kv[0], value_extractor=lambda kv: kv[1]),
        public_partitions=LABELS)
    accountant.compute_budgets()
    with pytest.raises(ValueError, match="without its label"):
        dict(out)


def test_stock_accountants_cannot_take_our_sigma():
    naive = pipeline_dp.NaiveBudgetAccountant(2.0, 1e-5)
    with pytest.raises(NotImplementedError):
        naive.request_budget(pipeline_dp.aggregate_params.MechanismType
                             .GAUSSIAN, sensitivity=R,
                             noise_standard_deviation=SIGMA)
    # The naive accountant splits (eps, delta) by weight: three mechanisms
    # get eps/3 each, not what a PLD-composed calibration spends.
    naive = pipeline_dp.NaiveBudgetAccountant(2.0, 1e-5)
    specs = [naive.request_budget(
        pipeline_dp.aggregate_params.MechanismType.GAUSSIAN, name=str(i))
        for i in range(3)]
    naive.compute_budgets()
    assert [s.eps for s in specs] == pytest.approx([2 / 3] * 3)
    # The PLD accountant is refused with custom combiners by DPEngine.
    pld = pipeline_dp.PLDBudgetAccountant(2.0, 1e-5)
    engine = pipeline_dp.DPEngine(pld, pipeline_dp.LocalBackend())
    comb = KeyedSumCombiner(class_sum_family(R), LABELS, D, _ledger(),
                            SeededNoise(1))
    params = pipeline_dp.AggregateParams(
        noise_kind=pipeline_dp.NoiseKind.GAUSSIAN, metrics=[],
        max_partitions_contributed=1, max_contributions_per_partition=1,
        contribution_bounds_already_enforced=True, custom_combiners=[comb])
    with pytest.raises(ValueError, match="custom combiners"):
        engine.aggregate([(0, (0, np.zeros((1, D))))], params,
                         pipeline_dp.DataExtractors(
                             partition_extractor=lambda kv: kv[0],
                             value_extractor=lambda kv: kv[1]),
                         public_partitions=LABELS)


def test_ledger_accountant_reconciles_with_the_ledger():
    acc = LedgerAccountant(_ledger())
    spec = acc.request_budget(sensitivity=R, noise_standard_deviation=SIGMA,
                              name=plan.name("*", FAMILY))
    acc.compute_budgets()
    assert spec.noise_standard_deviation == SIGMA and spec.delta == 1e-5
    bad = LedgerAccountant(_ledger())
    bad.request_budget(sensitivity=R, noise_standard_deviation=SIGMA / 2,
                       name=plan.name("*", FAMILY))
    with pytest.raises(ValueError, match="not what the ledger holds"):
        bad.compute_budgets()
    over = LedgerAccountant(_ledger(sigma=0.05))  # spends more than 2.0
    over.request_budget(sensitivity=R, noise_standard_deviation=0.05,
                        name=plan.name("*", FAMILY))
    with pytest.raises(ValueError, match="> target"):
        over.compute_budgets()


def test_class_counts_byte_identical(tmp_path):
    """Phase 1's counts: (label, count) partials of raw blocks, any number
    per label, released as ``adaptive.noisy_counts`` releases them."""
    x, y = _data()
    ledger = PrivacyLedger(2.0, 1e-5)
    ledger.register(Mechanism("global/centre/count", "centre", GLOBAL, 1.0,
                              SIGMA * 2))  # same family suffix, other sigma
    for c in LABELS:
        ledger.register(Mechanism(adaptive.count_name(c), "count",
                                  plan.partition(c), 1.0, SIGMA))
    parts = [(int(c), np.array([float(n)])) for i in range(0, len(y), 50)
             for c, n in zip(*np.unique(y[i:i + 50], return_counts=True))]
    folder = tmp_path / "counts"
    folder.mkdir()
    with beam.Pipeline() as p:
        t = ClassAggregation(LABELS, D, class_count_family(), ledger,
                             SeededNoise(2))
        p | beam.Create(parts) | t | _save(folder)
        t.aggregation.accountant.compute_budgets()
    got = _load(folder)
    want = adaptive.noisy_counts(adaptive.exact_class_counts(y, LABELS),
                                 LABELS, ledger, SeededNoise(2))
    assert [got[c][0] for c in LABELS] == list(want)  # the empty class too


def test_accountant_refuses_a_sigma_the_ledger_does_not_hold():
    acc = LedgerAccountant(_ledger())
    acc.request_budget(sensitivity=R, noise_standard_deviation=SIGMA * 2,
                       name=plan.name("*", FAMILY))
    with pytest.raises(ValueError, match="not what the ledger holds"):
        acc.compute_budgets()


def test_explain_epsilon_is_the_gaussian_alone():
    """The explain text's per-mechanism epsilon is exact (mu-GDP) and
    agrees with dp_accounting's PLD for that one Gaussian."""
    from dpsynth.dp_ops.ledger import compose_epsilon
    acc = LedgerAccountant(_ledger())
    spec = acc.request_budget(sensitivity=R, noise_standard_deviation=SIGMA,
                              name=plan.name("*", FAMILY))
    one = Mechanism("m", "s", "p", R, SIGMA)
    assert spec.eps == pytest.approx(compose_epsilon([one], 1e-5), rel=1e-4)


def test_two_families_in_one_aggregation(tmp_path):
    """The per-class mode's sums and d x d second moments share one pass and
    one aggregation (one custom combiner each): the same bits as each
    family alone."""
    x, y = _data()
    ledger = _ledger()
    for c in LABELS:
        ledger.register(Mechanism(plan.class_covariance(c), "covariance",
                                  plan.partition(c), R * R, SIGMA))
    families = [class_sum_family(R), class_second_moment_family(R)]
    folder = tmp_path / "both"
    folder.mkdir()
    with beam.Pipeline() as p:
        t = ClassSums(LABELS, D, families, ledger, SeededNoise(4))
        out = p | beam.Create(_blocks(x, y, 37)) | t
        t.aggregation.accountant.compute_budgets()
        out | beam.Map(lambda kv: np.savez(f"{folder}/{kv[0]}.npz", *kv[1]))
    for c in LABELS:
        with np.load(folder / f"{c}.npz") as got:
            want_sum = _today_sums(x, y, ledger, SeededNoise(4))[c]
            exact = covariance.block_second_moment(x[y == c], R)
            want_m = generator.noisy_second_moment(
                exact, ledger, SeededNoise(4), plan.class_covariance(c))
            assert got["arr_0"].tobytes() == want_sum.tobytes(), c
            assert got["arr_1"].tobytes() == want_m.tobytes(), c
    text = t.aggregation.explain()
    assert "class=<c>/moments/sum" in text
    assert "class=<c>/covariance/second-moment" in text


def test_second_moments_move_as_their_exact_upper_triangle():
    """A class's d x d second moment crosses the stages as its upper
    triangle (half the bytes) and comes back with the same bits."""
    x, _ = _data()
    m = covariance.block_second_moment(x, R)
    tri = covariance.triangle(m)
    assert tri.size == covariance.upper_size(D) == D * (D + 1) // 2
    back = covariance.symmetric_from_triangle(tri, D)
    assert back.tobytes() == m.tobytes()
    family = class_second_moment_family(R)
    acc = _Concatenated([class_sum_family(R), family], D)
    total = acc.zero(None)
    acc.add(total, _blocks(x, np.zeros(len(x), int), len(x))[0])
    flat = acc.done(total)
    sum_piece, moment_piece = pieces([class_sum_family(R), family], D)
    assert flat.size == D + tri.size
    assert moment_piece.value(moment_piece.take(flat)).tobytes() == m.tobytes()
    assert sum_piece.value(sum_piece.take(flat)).tobytes() == \
        adaptive.block_class_sum(x, R).tobytes()


def test_a_whole_matrix_for_a_triangle_is_refused(tmp_path):
    """ClassAggregation takes a symmetric family's triangle: a whole d x d
    value (d^2 numbers, not d (d + 1) / 2) is an error, not a silent cut."""
    ledger = PrivacyLedger(2.0, 1e-5)
    for c in LABELS:
        ledger.register(Mechanism(plan.class_covariance(c), "covariance",
                                  plan.partition(c), R * R, SIGMA))
    with pytest.raises(Exception, match="partial of 25 values where the "
                       "families take 15"):
        with beam.Pipeline() as p:
            t = ClassAggregation(LABELS, D, class_second_moment_family(R),
                                 ledger, SeededNoise(1))
            _ = p | beam.Create([(0, np.eye(D))]) | t
            t.aggregation.accountant.compute_budgets()


def test_labels_are_created_once_without_a_reshuffle():
    """The public labels feed both the seeds and PipelineDP's public
    partitions from one Create, with no redistributing reshuffle (PipelineDP's
    combine per label spreads them): each such Create or reshuffle was a
    stage of its own on every run."""
    p = beam.Pipeline()
    t = ClassSums(LABELS, D, class_sum_family(R), _ledger(), SeededNoise(4))
    _ = p | beam.Create(_blocks(*_data(), 100)) | "Sums" >> t
    labels = []

    class Visit(beam.pipeline.PipelineVisitor):
        def enter_composite_transform(self, node):
            labels.append(node.full_label)

        def visit_transform(self, node):
            labels.append(node.full_label)
    p.visit(Visit())
    creates = [x for x in labels if x.startswith("Sums/")
               and x.endswith("/Impulse")]
    assert creates == ["Sums/Aggregate/Labels/Impulse"], creates
    reshuffles = [x for x in labels if x.startswith("Sums/")
                  and x.endswith("/Reshuffle")]
    assert not reshuffles, reshuffles
