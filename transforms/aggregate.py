"""Exact per-class aggregation of numpy blocks (the input side of every DP
mechanism). Outputs stay inside the pipeline until a noise transform.

Elements are blocks of rows (``--block-size``, 1-10k), never single rows:
all per-row work is vectorised numpy, and each block contributes one partial
aggregate per class, merged by a combiner. Nothing collects the rows.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Union

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.pvalue import AsDict, AsSingleton, PCollection
from apache_beam.transforms.window import GlobalWindows

from dpsynth.dp_ops import clipping, covariance, generator, lsh_tree
from dpsynth.dp_ops.kmeans import blas_threads
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.transforms import heap_pages
from dpsynth.transforms.coders import ArraysCoder
from dpsynth.transforms.progress import BundleSpan, ProgressFile, ReportProgress


@dataclasses.dataclass
class Block:
    """A block of clipped rows of many classes, with its projections."""

    x: np.ndarray  # clipped rows [b, d]
    y: np.ndarray  # labels [b]
    z: np.ndarray  # public projection into the clustering space [b, p]
    codes: np.ndarray  # full-depth LSH codes of z [b]

    def of_class(self, label: int) -> "Block":
        m = self.y == label
        return Block(self.x[m], self.y[m], self.z[m], self.codes[m])

    def by_class(self) -> Iterator[tuple[int, "Block"]]:
        """(label, rows of that label) for each label present.

        Prepared blocks are sorted by label, so these are views (no copy).
        """
        y = self.y
        if len(y) == 0:
            return
        if len(y) > 1 and np.any(y[1:] < y[:-1]):
            for label in np.unique(y).tolist():
                yield label, self.of_class(label)
            return
        cuts = np.concatenate([[0], np.flatnonzero(y[1:] != y[:-1]) + 1,
                               [len(y)]])
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            yield int(y[a]), Block(self.x[a:b], y[a:b], self.z[a:b],
                                   self.codes[a:b])


# Blocks carry a size estimate that does not pickle them (transforms/coders).
beam.coders.registry.register_coder(Block, ArraysCoder)


def prepare_block(x: np.ndarray, y: np.ndarray, cfg: GeneratorConfig,
                  proj: np.ndarray, planes: np.ndarray,
                  centre: Optional[np.ndarray] = None,
                  rows: bool = True) -> tuple[Block, int]:
    """Normalise, subtract the DP centre (if any), clip each row
    (per-record, public rule), project, hash (with more than one cluster:
    the projection and LSH codes only serve the clustering).

    Rows are reordered by label (a stable sort; row order carries no
    information the aggregates use) so that classes are contiguous slices.
    ``rows`` False: a clustering pass that reads only the projections and
    codes; the block's x then has no columns, and each chunk of prepared
    rows is projected while it is still in cache and dropped (the pass
    never writes or re-reads the float64 rows).
    """
    order = np.argsort(y, kind="stable")
    if np.any(order[1:] < order[:-1]):
        x, y = x[order], y[order]
    if cfg.clusters == 1:  # one cluster: no tree, no nearest-centre search
        xc, n_clipped = clipping.preprocess(x, cfg.normalize, cfg.clip_norm,
                                            centre)
        return Block(xc, y, np.zeros((len(y), 0)),
                     np.zeros(len(y), np.int64)), n_clipped
    xc, z, n_clipped = _prepared_projected(x, cfg, proj, centre, rows)
    return Block(xc, y, z, lsh_tree.leaf_codes(z, planes)), n_clipped


def _prepared_projected(x: np.ndarray, cfg: GeneratorConfig,
                        proj: np.ndarray, centre: Optional[np.ndarray],
                        rows: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """(prepared rows, or [n, 0] without ``rows``; their projections z;
    rows clipped), ``clipping.chunk_rows`` rows at a time: each chunk is
    projected while it is in cache."""
    n, d = x.shape
    xc = np.empty((n, d) if rows else (min(n, clipping.chunk_rows(d)), d))
    z = np.empty((n, proj.shape[0]))
    n_clipped = 0
    for a, b in clipping.row_chunks(n, d):
        part = xc[a:b] if rows else xc[:b - a]  # without rows: one buffer
        n_clipped += clipping.prepare_into(part, x[a:b], cfg.normalize,
                                           cfg.clip_norm, centre)
        np.matmul(part, proj.T, out=z[a:b])
    return (xc if rows else np.empty((n, 0))), z, n_clipped


class _PrepareFn(beam.DoFn):
    def __init__(self, cfg: GeneratorConfig, dim: int,
                 stage: str = "blocks", rows: bool = True) -> None:
        self._cfg, self._dim, self._rows = cfg, dim, rows
        self._clipped = Metrics.counter("dpsynth", "rows_clipped")
        self._span = BundleSpan(f"read:{stage}")

    def setup(self) -> None:
        heap_pages.keep_heap_pages()
        with blas_threads(1):  # a small QR
            self._proj = generator.projection(self._dim, self._cfg)
        self._planes = generator.planes(self._cfg, self._dim)

    def start_bundle(self) -> None:
        self._span.start()

    def finish_bundle(self) -> None:
        self._span.end()

    def process(self, block: tuple[np.ndarray, np.ndarray], centre=None):
        self._span.mark()
        x, y = block
        with blas_threads(1):
            prepared, n_clipped = prepare_block(x, y, self._cfg, self._proj,
                                                self._planes, centre,
                                                self._rows)
        self._clipped.inc(n_clipped)
        yield prepared


class PrepareBlocks(beam.PTransform):
    """Raw (x, y) blocks -> ``Block``s; ``centre``: the one-element
    PCollection of the DP centre (``dpsynth.transforms.centre``), or None; ``rows``
    False: blocks for a clustering pass, without x (``prepare_block``)."""

    def __init__(self, cfg: GeneratorConfig, dim: int,
                 centre: Optional[PCollection] = None,
                 stage: str = "blocks", rows: bool = True) -> None:
        super().__init__()
        self._cfg, self._dim, self._centre = cfg, dim, centre
        self._stage = stage  # the pass's name in the stage trace
        self._rows = rows

    def expand(self, blocks):
        side = [] if self._centre is None else [AsSingleton(self._centre)]
        return blocks | beam.ParDo(_PrepareFn(self._cfg, self._dim,
                                              self._stage, self._rows),
                                   *side).with_output_types(Block)


class RereadBlocks:
    """Prepared blocks that every pass reads afresh from the input files.

    The alternative to one materialised PCollection of blocks: no stage
    holds the dataset (the runner's shuffle buffers included), so memory is
    the block and the model state at any n; each pass pays one read and one
    cheap ``PrepareBlocks`` (clip, project, hash) instead.
    """

    def __init__(self, pipeline: beam.Pipeline, reader: beam.PTransform,
                 cfg: GeneratorConfig, dim: int,
                 centre: Optional[PCollection] = None,
                 progress: Optional[ProgressFile] = None) -> None:
        self.pipeline, self._reader = pipeline, reader
        self._cfg, self._dim, self._centre = cfg, dim, centre
        self._progress = progress

    def read(self, name: str, rows: bool = True) -> PCollection:
        return (self.pipeline
                | f"{name}Read" >> self._reader
                | f"{name}Progress" >> ReportProgress(self._progress, name)
                | f"{name}Prepare" >> PrepareBlocks(self._cfg, self._dim,
                                                    self._centre, name, rows))


Blocks = Union[PCollection, RereadBlocks]


def pass_blocks(blocks: Blocks, name: str, rows: bool = True) -> PCollection:
    """The blocks one pass reads: the shared PCollection or a fresh read
    (``rows`` False: a pass that reads only the projections and codes, so
    a fresh read need not keep the prepared rows)."""
    return (blocks.read(name, rows) if isinstance(blocks, RereadBlocks)
            else blocks)


def add_inplace(acc: Any, value: Any) -> Any:
    """acc + value, into acc's memory when it is a numpy array that can
    hold the result (saves one allocation per block and class)."""
    if (isinstance(acc, np.ndarray) and isinstance(value, np.ndarray)
            and acc.shape == value.shape
            and acc.dtype == np.result_type(acc, value)):
        acc += value
        return acc
    return acc + value


def sum_present(values: Iterable[Any]) -> Any:
    """Sum of the values that are not None (None if there are none): the
    combine function of a global sum over blocks."""
    total = None
    for v in values:
        if v is not None:
            total = copy.deepcopy(v) if total is None else add_inplace(total, v)
    return total


class _SumFn(beam.CombineFn):
    """Sums partial aggregates with ``add``; None is the zero.

    ``add(acc, value)`` may update ``acc`` in place: the accumulator is
    always the combiner's own object (the first input is copied).
    """

    def __init__(self, add: Callable[[Any, Any], Any]) -> None:
        self._add = add

    def create_accumulator(self):
        return None

    def add_input(self, acc, value):
        if value is None:
            return acc
        return copy.deepcopy(value) if acc is None else self._add(acc, value)

    def merge_accumulators(self, accs):
        out = None
        for acc in accs:  # accumulators are ours: no copy needed
            if acc is not None:
                out = acc if out is None else self._add(out, acc)
        return out

    def extract_output(self, acc):
        return acc


def _stage_name(fn: Any) -> str:
    """``sums:<function or accumulator>`` for the stage trace."""
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return "sums:" + name.split(".<locals>")[0].lstrip("_")


class _BundleSums:
    """Per-label sums of one bundle's partials, with the combiner's ``add``
    (the first value copied, as ``_SumFn`` does; None is the zero): one
    partial per class and bundle leaves the DoFn, not one per block (on
    Dask a bundle's outputs are one list held until the combine runs; a
    vote histogram per class and block, for instance)."""

    def __init__(self, add: Callable[[Any, Any], Any]) -> None:
        self._add, self._sums = add, {}

    def add(self, label: int, value: Any) -> None:
        old = self._sums.get(label)
        if value is None:
            self._sums.setdefault(label, None)
        elif old is None:
            self._sums[label] = copy.deepcopy(value)
        else:
            self._sums[label] = self._add(old, value)

    def take(self) -> list:
        """The (label, sum) pairs by label; the sums start again empty."""
        out = [(label, self._sums[label]) for label in sorted(self._sums)]
        self._sums = {}
        return out


class Accumulator:
    """In-place aggregation of a class's blocks within one bundle, for
    aggregates whose per-block partials are large (d x d): ``zero(rows)``
    makes a class's accumulator from its first block, ``add(acc, rows)``
    adds a block into it in place, ``done(acc)`` turns it into the bundle's
    partial. One partial per class and bundle reaches the combiner instead
    of one per class and block (at d = 384: 1.2 MB each)."""

    def zero(self, rows: Block) -> Any:
        raise NotImplementedError

    def add(self, acc: Any, rows: Block) -> None:
        raise NotImplementedError

    def done(self, acc: Any) -> Any:
        return acc


class SecondMoment(Accumulator):
    """Exact second moment x^T x on the grid of the rows it is given (a
    class's, or all rows with ``GlobalSum``), in place per bundle (see
    ``covariance.add_second_moment_upper``)."""

    def __init__(self, clip_norm: float) -> None:
        self._clip = clip_norm

    def zero(self, rows: Block) -> np.ndarray:
        d = rows.x.shape[1]
        return np.zeros((d, d))

    def add(self, acc: np.ndarray, rows: Block) -> None:
        covariance.add_second_moment_upper(acc, rows.x, self._clip)

    def done(self, acc: np.ndarray) -> np.ndarray:
        return covariance.mirror_upper(acc)


@dataclasses.dataclass(frozen=True)
class Part:
    """One aggregation's partials of a block: ``fn(label, rows, *side)``
    per class, or an ``Accumulator`` per class (``per_class``) or over all
    the block's rows (one partial per bundle)."""

    fn: Union[Callable[..., Any], Accumulator]
    per_class: bool = True
    side: tuple = ()
    add: Optional[Callable[[Any, Any], Any]] = None  # a function's sums


class _PartsFn(beam.DoFn):
    """(i, partial) for aggregation i of ``parts``, from one look at each
    block; one partial per class (or one in all) and bundle. Without
    ``tagged`` (one part): the partials alone."""

    def __init__(self, parts: Sequence[Part], threads: Optional[int],
                 tagged: bool = True) -> None:
        self._parts, self._threads = list(parts), threads
        self._tagged = tagged  # False: one part, its partials as they are
        self._open: list = []
        self._span = BundleSpan("sums:" + "+".join(
            _stage_name(p.fn)[len("sums:"):] for p in self._parts))

    def start_bundle(self) -> None:
        # per part: label (None: all rows) -> accumulator, or _BundleSums
        self._open = [{} if isinstance(p.fn, Accumulator)
                      else _BundleSums(p.add or add_inplace)
                      for p in self._parts]  # a retry starts from nothing
        self._span.start()

    def process(self, block: Block, *side):
        self._span.mark()
        classes, at = None, 0
        with blas_threads(self._threads):
            for i, part in enumerate(self._parts):
                args, at = side[at:at + len(part.side)], at + len(part.side)
                if not part.per_class:
                    if len(block.y):
                        self._accumulate(i, None, block)
                    continue
                if classes is None:
                    classes = list(block.by_class())
                for label, rows in classes:
                    if isinstance(part.fn, Accumulator):
                        self._accumulate(i, label, rows)
                    else:
                        self._open[i].add(label, part.fn(label, rows, *args))
        return ()

    def _accumulate(self, i: int, label: Optional[int], rows: Block) -> None:
        acc, fn = self._open[i], self._parts[i].fn
        if label not in acc:
            acc[label] = fn.zero(rows)
        fn.add(acc[label], rows)

    def finish_bundle(self):
        for i in range(len(self._parts)):
            for value in self._done(i):
                yield GlobalWindows.windowed_value(
                    (i, value) if self._tagged else value)
        self._open = []
        self._span.end()

    def _done(self, i: int) -> list:
        """Part i's partials of the bundle: (label, partial), or the one
        partial over all rows (none without rows)."""
        open_, fn = self._open[i], self._parts[i].fn
        if isinstance(open_, _BundleSums):
            return open_.take()
        if None in open_:
            return [fn.done(open_[None])]
        return [(c, fn.done(open_[c])) for c in sorted(open_)]


class _PartialFn(_PartsFn):
    """``PerClassSum``'s partials of a function: (label, bundle sum)."""

    def __init__(self, part: Part, threads: Optional[int]) -> None:
        super().__init__([part], threads, tagged=False)
        self._fn = part.fn  # Dask's step trace names the step by it


class _AccumulateAllFn(_PartsFn):
    """Every row of a bundle into one accumulator; the partial is emitted
    when the bundle finishes (nothing for a bundle without rows)."""

    def __init__(self, accumulator: Accumulator,
                 threads: Optional[int]) -> None:
        super().__init__([Part(accumulator, per_class=False)], threads,
                         tagged=False)


class _AccumulateFn(_PartsFn):
    """A class's rows of a bundle into its accumulator: (label, partial)
    per class when the bundle finishes."""

    def __init__(self, accumulator: Accumulator,
                 threads: Optional[int]) -> None:
        super().__init__([Part(accumulator)], threads, tagged=False)


class GlobalSum(beam.PTransform):
    """Blocks -> one element: the exact aggregate of all their rows (None
    without rows). One partial per bundle reaches the combiner (a d x d
    matrix is 1.2 MB at d = 384, 13 MB at 1280) rather than one per block,
    and the products run on ``threads`` BLAS threads (default 1: workers
    get their parallelism from bundles)."""

    def __init__(self, accumulator: Accumulator,
                 threads: Optional[int] = 1) -> None:
        super().__init__()
        self._acc, self._threads = accumulator, threads

    def part(self) -> "Part":
        """How this aggregation turns blocks into partials (``OnePass``)."""
        return Part(self._acc, per_class=False)

    def expand(self, blocks):
        return self.from_partials(
            blocks | "Partials" >> beam.ParDo(_AccumulateAllFn(
                self._acc, self._threads)))

    def from_partials(self, partials: PCollection) -> PCollection:
        """Per-bundle partials -> the one total (None without rows)."""
        return partials | "Total" >> beam.CombineGlobally(sum_present)


def _label_sum(label: int, sums: dict) -> tuple:
    return label, sums.get(label)


class PerClassSum(beam.PTransform):
    """(label, exact aggregate) for *every* configured label.

    ``fn(label, class_block, *side_values)`` computes a block's partial
    aggregate (or ``fn`` is an ``Accumulator``: one partial per class and
    bundle); partials are summed with ``add`` (a combiner: partial sums
    per bundle, then merged; ``add`` may update its first argument). Labels
    with no rows get ``None``, so every class reaches its mechanism: the
    release never reveals by omission that a class is empty. ``threads``:
    BLAS threads for ``fn`` (default 1, see ``blas_threads``; None for
    large products such as the vote search).

    The labels are completed after the combine, from a Create of the labels
    that reads the sums as a side input (one element per label, so a runner
    that keeps created elements apart, e.g. dpsynth's Dask runner, holds one
    class's outputs per task downstream). (Flattening per-label seeds into the
    partials instead makes the FnApiRunner stall with "watermark-pending
    bundles" when several passes read one PCollection of blocks: a
    multi-input Flatten's watermark waits for every reader of the blocks,
    including later passes that wait on this one. The old fix, a Reshuffle
    of all blocks before each pass, re-shuffled the whole dataset.)
    ``every_label=False`` skips that completion (one stage fewer): for a
    consumer that reads the sums as one dict side input and takes a
    missing label as the zero aggregate itself (``dpsynth.transforms.two_phase``).
    """

    def __init__(self, labels: Sequence[int],
                 fn: Union[Callable[..., Any], Accumulator],
                 side_inputs: Iterable = (),
                 add: Callable[[Any, Any], Any] = add_inplace,
                 threads: Optional[int] = 1,
                 every_label: bool = True) -> None:
        super().__init__()
        self._labels, self._fn = list(labels), fn
        self._side, self._add = list(side_inputs), add
        self._threads, self._every_label = threads, every_label

    def part(self) -> "Part":
        """How this aggregation turns blocks into partials (``OnePass``)."""
        return Part(self._fn, True, tuple(self._side), self._add)

    def expand(self, blocks):
        if isinstance(self._fn, Accumulator):
            assert not self._side, "accumulators take no side inputs"
            partials = beam.ParDo(_AccumulateFn(self._fn, self._threads))
        else:
            partials = beam.ParDo(_PartialFn(self.part(), self._threads),
                                  *self._side)
        return self.from_partials(blocks | "Partials" >> partials)

    def from_partials(self, partials: PCollection) -> PCollection:
        """(label, partial) pairs -> the per-label sums."""
        sums = partials | "Sum" >> beam.CombinePerKey(_SumFn(self._add))
        if not self._every_label:
            return sums
        return (partials.pipeline
                | "Labels" >> beam.Create(self._labels)
                | "EveryLabel" >> beam.Map(_label_sum, AsDict(sums)))


def _select(item: tuple, index: int):
    if item[0] == index:
        yield item[1]


class _FromPartials(beam.PTransform):
    def __init__(self, aggregation: Any) -> None:
        super().__init__()
        self._aggregation = aggregation

    def expand(self, partials):
        return self._aggregation.from_partials(partials)


class OnePass(beam.PTransform):
    """Blocks -> {name: result} for several aggregations of the same blocks
    (``PerClassSum``, ``GlobalSum``, ``pipelinedp.ClassSums``: anything
    with ``part()`` and ``from_partials()``), fed by one ParDo.

    The alternative, each aggregation reading the blocks itself, gives the
    blocks two readers: DirectRunner fuses them, but dpsynth's Dask runner
    computes such a collection once and keeps each partition until its
    last reader has run, and Dask ran every partition's first reader
    before any second one, so the workers held every prepared block of the
    pass (7.9 GB at 2M x 384 in the --clusters 16 plan). The partials are
    one collection with two readers instead: small. No tagged outputs:
    Beam's Dask runner puts every tag's elements in every output."""

    def __init__(self, aggregations: dict, threads: Optional[int] = 1
                 ) -> None:
        super().__init__()
        self._aggregations, self._threads = dict(aggregations), threads

    def expand(self, blocks):
        parts = [a.part() for a in self._aggregations.values()]
        side = [s for part in parts for s in part.side]
        tagged = blocks | "Partials" >> beam.ParDo(
            _PartsFn(parts, self._threads), *side)
        return {name: (tagged
                       | f"{name}Partials" >> beam.FlatMap(_select, i)
                       | name >> _FromPartials(agg))
                for i, (name, agg) in enumerate(self._aggregations.items())}
