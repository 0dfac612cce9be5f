"""The per-class mechanisms of the adaptive plan as PipelineDP aggregations
(``pipeline-dp==0.3.1``, pinned: custom combiners are experimental).

``dpsynth.transforms.two_phase`` (the default plan) runs phase 1's class counts (``class=<c>/count``) and
phase 2's class sums (``class=<c>/moments/sum``) and, in the per-class mode,
the classes' d x d second moments (``class=<c>/covariance/second-moment``)
here. Each mechanism family is one ``DPEngine.aggregate`` on PipelineDP's
Beam backend:

* public partitions = the configured labels (no partition selection),
  ``contribution_bounds_already_enforced`` (each row is its own privacy unit
  and is clipped before) and ``public_partitions_already_filtered`` (the
  readers reject labels outside the set), so PipelineDP adds no bounding,
  sampling or filtering stage;
* the ``CustomCombiner`` accumulates dpsynth's exact fixed-point partials
  (grid values: the sum is the same bits in any merge order) and its
  ``compute_metrics`` adds the keyed discrete Gaussian noise of
  ``dpsynth.dp_ops.noise`` under the ledger mechanism's name and sigma, so a release
  is byte-identical to the in-memory reference under ``--noise-seed`` and a
  re-executed step redraws nothing;
* the budget is requested through PipelineDP from ``LedgerAccountant``, a
  view of the run's ``PrivacyLedger`` that refuses any request the ledger
  does not hold: PipelineDP's own accountants cannot take a calibrated sigma
  (see ``benchmarks/results/pipelinedp.md``).

The fixed plans (``dpsynth.transforms.mixture``) release their per-class, per-cluster
moments (count vector, sums, sums of squares: each class's [k] or [k, d]
value) and per-class second moments the same way. Not through PipelineDP:
the global aggregates (the DP centre, the shared second moment), the
subspace mode's class blocks (their partials need the noisy basis, a side
input), the DP k-means passes and the vote counts.

Two things PipelineDP 0.3.1 does that need care here:

* ``compute_metrics(accumulator)`` is not told the partition key, and the
  accumulators PipelineDP makes for public partitions absent from the data
  are ``create_accumulator([])``: they cannot know their class. So the
  accumulator carries its label, and ``ClassSums`` feeds one seed with no
  value per label; a class with no rows still gets its own keyed draw.
* Its Beam combine wraps every input element into an accumulator and merges
  them with a plain callable (new arrays, no in-place accumulation), and
  the Flatten with its empty public partitions moves the elements across a
  stage boundary (encoded). Feeding it the rows of each block tripled the
  pass's wall time, and feeding it one partial per class and bundle made it
  move W x K large partials through three stages (13 s at 16 workers in
  the per-class mode), so ``ClassSums`` sums the bundles' exact partials
  (``dpsynth.transforms.aggregate``'s in-place bundle accumulation, then one Beam
  combine per class) and feeds PipelineDP one exact sum per class: the
  combiner's accumulation is that sum, and PipelineDP adds the noise and
  accounts for it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional, Sequence, Union

import apache_beam as beam
import numpy as np
import pipeline_dp
from pipeline_dp import budget_accounting, combiners, report_generator
from pipeline_dp.aggregate_params import MechanismType

from dpsynth.dp_ops import adaptive, covariance, generator, plan
from dpsynth.dp_ops.calibration import gdp_epsilon
from dpsynth.dp_ops.ledger import Mechanism, PrivacyLedger
from dpsynth.dp_ops.noise import NoiseSource
from dpsynth.transforms import aggregate

PINNED_VERSION = "0.3.1"
GAUSSIAN = MechanismType.GAUSSIAN

# (label or None, exact aggregate or None): None is the zero.
Acc = tuple[Optional[int], Optional[np.ndarray]]
# (ledger, noise, mechanism name, exact aggregate) -> released value.
Release = Callable[[PrivacyLedger, NoiseSource, str, np.ndarray], np.ndarray]


def second_moment_release(ledger: PrivacyLedger, noise: NoiseSource,
                          name: str, exact: np.ndarray) -> np.ndarray:
    """``generator.noisy_second_moment`` with ``Release``'s arguments."""
    return generator.noisy_second_moment(exact, ledger, noise, name)


@dataclasses.dataclass(frozen=True)
class Family:
    """A per-class mechanism family: ``class=<c>/<name>``, the exact
    partial of a class's rows of one block, and how the noise is added.
    ``symmetric``: the value is a symmetric d x d matrix, moved between
    stages as its upper triangle (``covariance.triangle``: half the bytes,
    the same exact values)."""

    name: str
    partial: Callable[[np.ndarray], np.ndarray]
    release: Release = generator.add_noise
    symmetric: bool = False
    # acc += partial(rows) in place without the partial's temporary, where
    # the family has one (None: the plain sum). A symmetric family's may
    # update only the upper triangle, the part that moves.
    add_into: Optional[Callable[[np.ndarray, np.ndarray], None]] = None

    def zero(self, dim: int) -> np.ndarray:
        """The family's value of no rows (its shape)."""
        return self.partial(np.zeros((0, dim)))


def class_count_family() -> Family:
    """``class=<c>/count`` (sensitivity 1), phase 1 of the adaptive plan:
    the partial of some rows is their number (a one-element array)."""
    return Family("count", _count)


def _count(rows: np.ndarray) -> np.ndarray:
    return np.array([float(len(rows))])


def released_family(name: str, shape: tuple[int, ...]) -> Family:
    """``class=<c>/<name>`` for a ``ClassAggregation`` fed exact per-class
    values computed elsewhere (the fixed plans' per-cluster moments, whose
    partials need the DP centres as a side input): ``shape`` is a class's
    value with no rows (zeros), released with ``generator.add_noise``."""
    return Family(name, _Zeros(tuple(shape)))


@dataclasses.dataclass(frozen=True)
class _Zeros:
    shape: tuple[int, ...]

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        return np.zeros(self.shape)


def class_sum_family(clip_norm: float) -> Family:
    """``class=<c>/moments/sum`` (sensitivity R), as ``dpsynth.transforms.two_phase``."""
    return Family("moments/sum", _ClassSum(clip_norm))


def class_second_moment_family(clip_norm: float) -> Family:
    """``class=<c>/covariance/second-moment`` (R^2, isometric upper
    triangle), as the per-class mode of ``dpsynth.transforms.two_phase``."""
    return Family("covariance/second-moment", _SecondMoment(clip_norm),
                  second_moment_release, symmetric=True,
                  add_into=_AddSecondMoment(clip_norm))


@dataclasses.dataclass(frozen=True)
class _ClassSum:
    clip_norm: float

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        return adaptive.block_class_sum(rows, self.clip_norm)


@dataclasses.dataclass(frozen=True)
class _SecondMoment:
    clip_norm: float

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        return covariance.block_second_moment(rows, self.clip_norm)


@dataclasses.dataclass(frozen=True)
class _AddSecondMoment:
    clip_norm: float

    def __call__(self, acc: np.ndarray, rows: np.ndarray) -> None:
        covariance.add_second_moment_upper(acc, rows, self.clip_norm)


def family_mechanisms(ledger: PrivacyLedger, labels: Sequence[int],
                      family: str) -> list[Mechanism]:
    """The ledger mechanisms ``class=<c>/<family>`` of every label; one
    PipelineDP mechanism stands for all of them (classes compose in
    parallel), so they must share sensitivity and sigma."""
    mechs = []
    for c in labels:
        name = plan.name(c, family)
        if name not in ledger:
            raise ValueError(f"PipelineDP aggregation {family}: mechanism "
                             f"{name} is not in the ledger")
        mechs.append(ledger.get(name))
    if len({(m.sensitivity, m.sigma) for m in mechs}) != 1:
        raise ValueError(f"PipelineDP aggregation {family}: the classes' "
                         "mechanisms differ in sensitivity or sigma; one "
                         "PipelineDP mechanism cannot stand for them")
    return mechs


class LedgerAccountant(budget_accounting.NaiveBudgetAccountant):
    """PipelineDP's budget accountant as a view of a ``PrivacyLedger``.

    ``request_budget`` takes the ledger's calibrated sigma (stock
    accountants raise NotImplementedError for it) and returns a spec that
    already holds that sigma and the (epsilon, delta) of its one mechanism at
    the run's delta. ``compute_budgets`` reconciles: every request names
    mechanisms of the ledger with that sensitivity and sigma, and the
    ledger's composed epsilon meets its target. (It subclasses the naive
    accountant because DPEngine 0.3.1 rejects custom combiners with any
    other accountant.)
    """

    def __init__(self, ledger: PrivacyLedger) -> None:
        super().__init__(ledger.target_epsilon, ledger.target_delta)
        self.ledger = ledger
        self.requests: list[tuple[str, float, float]] = []

    def request_budget(self, mechanism_type=GAUSSIAN, sensitivity: float = 1,
                       weight: float = 1, count: int = 1,
                       noise_standard_deviation: Optional[float] = None,
                       name: str = "") -> budget_accounting.MechanismSpec:
        if self._finalized:
            raise ValueError("request_budget after compute_budgets")
        if mechanism_type != GAUSSIAN or noise_standard_deviation is None:
            raise ValueError(f"{name}: only Gaussian mechanisms with the "
                             "ledger's sigma are accounted here")
        spec = budget_accounting.MechanismSpec(GAUSSIAN, name=name,
                                               _count=count)
        spec.set_noise_standard_deviation(noise_standard_deviation)
        # This one mechanism's own (epsilon, delta), for the explain text:
        # exact for a Gaussian (mu-GDP); the ledger composes all of them.
        # (--epsilon inf runs with sigma 0: no privacy, epsilon inf.)
        eps = (math.inf if noise_standard_deviation == 0 else gdp_epsilon(
            math.sqrt(count) * sensitivity / noise_standard_deviation,
            self.ledger.target_delta))
        spec.set_eps_delta(eps, self.ledger.target_delta)
        self._register_mechanism(budget_accounting.MechanismSpecInternal(
            sensitivity=sensitivity, weight=weight, mechanism_spec=spec))
        self.requests.append((name, sensitivity, noise_standard_deviation))
        return spec

    def compute_budgets(self) -> None:
        self._finalize()
        for name, sensitivity, sigma in self.requests:
            family = name.split("/", 1)[1] if name.startswith("class=") else name
            mechs = [m for m in self.ledger.mechanisms
                     if m.name.startswith("class=")
                     and m.name.split("/", 1)[1] == family]
            if not mechs or any((m.sensitivity, m.sigma) != (sensitivity, sigma)
                                for m in mechs):
                raise ValueError(f"PipelineDP requested {name} (sensitivity "
                                 f"{sensitivity}, sigma {sigma}): not what "
                                 "the ledger holds")
        spent = self.ledger.spent_epsilon()
        if spent > self.ledger.target_epsilon * (1 + 1e-9):
            raise ValueError(f"ledger spends epsilon {spent} > target "
                             f"{self.ledger.target_epsilon}")


class KeyedSumCombiner(combiners.CustomCombiner):
    """Exact per-class sum of ``family.partial(rows)``, released by
    ``family.release`` (the class mechanism's keyed noise). Values are
    (label, rows); the accumulator is (label, sum)."""

    def __init__(self, family: Family, labels: Sequence[int], dim: int,
                 ledger: PrivacyLedger, noise: NoiseSource,
                 piece: Optional["Piece"] = None) -> None:
        self._family, self._release = family.name, family.release
        self._piece = piece
        zero = family.zero(dim)  # a class's value with no rows, as it moves
        self._zero = zero if piece is None else piece.pack(zero)
        self._ledger, self._noise = ledger, noise
        mech = family_mechanisms(ledger, labels, family.name)[0]
        self._sensitivity, self._sigma = mech.sensitivity, mech.sigma
        self._spec = None

    def request_budget(self, budget_accountant) -> None:
        self._spec = budget_accountant.request_budget(
            GAUSSIAN, sensitivity=self._sensitivity,
            noise_standard_deviation=self._sigma,
            name=plan.name("*", self._family))

    def create_accumulator(self, values) -> Acc:
        """values: (label, exact partial) pairs (``ClassSums``)."""
        label, total = None, None
        for c, part in values:
            label = c
            if part is None:  # a label's seed: no rows
                continue
            if self._piece is not None:  # this family's slice of a flat value
                part = self._piece.take(part)  # (summed as it moves)
            total = part if total is None else total + part
        return label, total

    def merge_accumulators(self, a: Acc, b: Acc) -> Acc:
        if a[0] is not None and b[0] is not None and a[0] != b[0]:
            raise AssertionError(f"merging classes {a[0]} and {b[0]}")
        label = a[0] if a[0] is not None else b[0]
        if a[1] is None or b[1] is None:
            return label, a[1] if b[1] is None else b[1]
        return label, a[1] + b[1]  # new array: inputs may be shared

    def compute_metrics(self, acc: Acc) -> np.ndarray:
        label, total = acc
        if label is None:
            raise ValueError(f"{self._family}: a class reached the noise "
                             "without its label (seed every label)")
        if total is None:  # a class with no rows: the exact sum is zero
            total = self._zero
        if self._piece is not None:
            total = self._piece.value(total)
        return self._release(self._ledger, self._noise,
                             plan.name(label, self._family), total)

    def metrics_names(self) -> list[str]:
        return [self._family]

    def explain_computation(self):
        spec = self._spec
        return lambda: (
            f"Computed {self._family} per class: exact fixed-point sum, keyed "
            f"discrete Gaussian noise (dpsynth ledger class=<c>/{self._family},"
            f" L2 sensitivity={self._sensitivity:.6g}, "
            f"sigma={spec.noise_standard_deviation:.6g}; on its own "
            f"eps={spec.eps:.6g} at delta={spec.delta:.3g} per class, classes "
            f"in parallel; the ledger composes every mechanism)")

    def expects_per_partition_sampling(self) -> bool:
        return False


@dataclasses.dataclass
class Aggregation:
    """What ``ClassSums`` built: the accountant (call ``compute_budgets``
    before running) and the explain-computation report (text after)."""

    accountant: LedgerAccountant
    report: report_generator.ExplainComputationReport

    def explain(self) -> str:
        return self.report.text()


@dataclasses.dataclass(frozen=True)
class Piece:
    """Where one family's value sits in a flat concatenation of several,
    in the form it moves in (raveled, or a symmetric matrix's triangle)."""

    start: int
    stop: int
    shape: tuple[int, ...]
    symmetric: bool = False

    def take(self, flat: np.ndarray) -> np.ndarray:
        """This family's part of ``flat``, as it moves (sums stay exact)."""
        return flat[self.start:self.stop]

    def pack(self, value: np.ndarray) -> np.ndarray:
        """A value of the family's shape -> the form it moves in."""
        return covariance.triangle(value) if self.symmetric else np.ravel(
            value)

    def value(self, moved: np.ndarray) -> np.ndarray:
        """``take``'s part -> the value of the family's shape."""
        if self.symmetric:
            return covariance.symmetric_from_triangle(moved, self.shape[0])
        return moved.reshape(self.shape)


def pieces(families: Sequence[Family], dim: int) -> list[Piece]:
    """Each family's slice of the concatenated value (its zero's shape)."""
    out, start = [], 0
    for f in families:
        shape = f.zero(dim).shape
        size = (covariance.upper_size(shape[0]) if f.symmetric
                else int(np.prod(shape)))
        out.append(Piece(start, start + size, tuple(shape), f.symmetric))
        start += size
    return out


class ClassAggregation(beam.PTransform):
    """(label, exact partial) pairs -> (label, released aggregate) for every
    label, through one ``DPEngine.aggregate`` with one custom combiner per
    mechanism family in ``families``: one Family (values of its shape), or
    several whose values come as one flat concatenation, in order (one pass
    feeds them all; the output is then a tuple of the released values). A
    symmetric family's part of a value is its triangle (``Piece``: what
    ``ClassSums`` emits), also when it comes alone.

    The partials are exact values on the families' public grids (their sum
    is the same bits in any order); a label may come any number of times or
    never. ``aggregation`` holds the accountant and the explain report."""

    def __init__(self, labels: Sequence[int], dim: int,
                 families: Union[Family, Sequence[Family]],
                 ledger: PrivacyLedger, noise: NoiseSource,
                 accountant: Optional[LedgerAccountant] = None) -> None:
        super().__init__()
        self._labels = [int(c) for c in labels]
        self._single = isinstance(families, Family)
        self._families = [families] if self._single else list(families)
        self._pieces = pieces(self._families, dim)
        self._combiners = [KeyedSumCombiner(f, self._labels, dim, ledger,
                                            noise, place)
                           for f, place in zip(self._families, self._pieces)]
        self.aggregation = Aggregation(accountant or LedgerAccountant(ledger),
                                       report_generator.ExplainComputationReport())

    def expand(self, partials):
        single = self._single
        size = self._pieces[-1].stop
        # one flat value per element (a view for one family's array)
        keyed = partials | "Keyed" >> beam.MapTuple(
            lambda c, v: (c, (c, _flat(v, size))))
        # The public labels, created once: the seeds below and PipelineDP's
        # public partitions (given a list, it creates its own). No
        # redistributing reshuffle: both go into PipelineDP's combine per
        # label, which spreads the labels itself (two stages fewer each).
        labels = partials.pipeline | "Labels" >> beam.Create(
            self._labels, reshuffle=False)
        # One seed per label, (label, None): the accumulator of a class
        # absent from the data then still knows its label (see the module
        # doc); no zero array (a class's second moments are ~0.6 MB at
        # d=384), the combiner knows its family's zero.
        seeds = labels | "Seeds" >> beam.Map(lambda c: (c, (c, None)))
        col = (keyed, seeds) | "WithSeeds" >> beam.Flatten()
        params = pipeline_dp.AggregateParams(
            noise_kind=pipeline_dp.NoiseKind.GAUSSIAN, metrics=[],
            max_partitions_contributed=1, max_contributions_per_partition=1,
            contribution_bounds_already_enforced=True,
            public_partitions_already_filtered=True,
            custom_combiners=self._combiners)
        engine = pipeline_dp.DPEngine(self.aggregation.accountant,
                                      pipeline_dp.BeamBackend())
        out = engine.aggregate(
            col, params,
            pipeline_dp.DataExtractors(partition_extractor=lambda kv: kv[0],
                                       value_extractor=lambda kv: kv[1]),
            public_partitions=labels,
            out_explain_computation_report=self.aggregation.report)
        return out | "Unwrap" >> beam.MapTuple(
            lambda c, m: (c, m[0] if single else tuple(m)))


def _flat(value: np.ndarray, size: int) -> np.ndarray:
    flat = np.ravel(value)
    if flat.size != size:  # e.g. a whole d x d matrix for its triangle
        raise ValueError(f"a partial of {flat.size} values where the "
                         f"families take {size}")
    return flat


class _Concatenated(aggregate.Accumulator):
    """One or more families' exact partials of a bundle's rows of one
    class (accumulated in place, each in its family's shape), emitted side
    by side in one flat array in the form they move in (``Piece``)."""

    def __init__(self, families: Sequence[Family], dim: int) -> None:
        self._families, self._dim = list(families), dim
        self._pieces = pieces(self._families, dim)
        self.__qualname__ = ("ClassSums[" + "+".join(
            f.name for f in self._families) + "]")  # the stage trace's name

    def zero(self, rows) -> list[np.ndarray]:
        return [f.zero(self._dim).copy() for f in self._families]

    def add(self, acc: list[np.ndarray], rows) -> None:
        for f, value in zip(self._families, acc):
            if f.add_into is not None:
                f.add_into(value, rows.x)
            else:
                value += f.partial(rows.x)

    def done(self, acc: list[np.ndarray]) -> np.ndarray:
        return np.concatenate([place.pack(value)
                               for place, value in zip(self._pieces, acc)])


class ClassSums(beam.PTransform):
    """Prepared ``Block``s -> (label, released aggregate) for every label:
    one exact partial per class and bundle (in-place accumulation), then
    ``ClassAggregation``. Several ``families`` share the one pass over the
    blocks (the output is then a tuple per label)."""

    def __init__(self, labels: Sequence[int], dim: int,
                 families: Union[Family, Sequence[Family]],
                 ledger: PrivacyLedger, noise: NoiseSource,
                 accountant: Optional[LedgerAccountant] = None) -> None:
        super().__init__()
        self._acc = _Concatenated(
            [families] if isinstance(families, Family) else families, dim)
        self._aggregate = ClassAggregation(labels, dim, families, ledger,
                                           noise, accountant)
        self.aggregation = self._aggregate.aggregation

    def expand(self, blocks):
        # Summed per class before PipelineDP: its aggregation moves every
        # element through three stages (the Flatten with the label seeds,
        # the join with the public partitions, its combine), and with one
        # partial per class and bundle (1.2 MB each at d = 384 in the
        # per-class mode) that took 13 s after the moments pass at 16
        # DirectRunner workers against 1.3 s at 2. Summed first, the
        # partials cross one shuffle and PipelineDP moves one value a class.
        return self.from_partials(blocks | "Partials" >> beam.ParDo(
            aggregate._AccumulateFn(self._acc, 1)))

    def part(self) -> aggregate.Part:
        """How this aggregation turns blocks into partials
        (``aggregate.OnePass``)."""
        return aggregate.Part(self._acc)

    def from_partials(self, partials):
        """(label, bundle partial) pairs -> (label, released aggregate)."""
        return (partials
                | "Sum" >> beam.CombinePerKey(
                    aggregate._SumFn(aggregate.add_inplace))
                | "Aggregate" >> self._aggregate)
