"""Exact per-class aggregation of numpy blocks (the input side of every DP
mechanism). Outputs stay inside the pipeline until a noise transform."""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, Callable, Iterable, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from dp_ops import clipping, generator, lsh_tree
from dp_ops.config import GeneratorConfig


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


class _PrepareFn(beam.DoFn):
    """Normalise + clip each row (per-record, public rule), then project."""

    def __init__(self, cfg: GeneratorConfig, dim: int) -> None:
        self._cfg, self._dim = cfg, dim
        self._clipped = Metrics.counter("dpsynth", "rows_clipped")

    def setup(self) -> None:
        self._proj = generator.projection(self._dim, self._cfg)
        self._planes = generator.planes(self._cfg, self._dim)

    def process(self, block: tuple[np.ndarray, np.ndarray]):
        x, y = block
        xc, n_clipped = clipping.preprocess(x, self._cfg.normalize,
                                            self._cfg.clip_norm)
        self._clipped.inc(n_clipped)
        z = xc @ self._proj.T
        yield Block(xc, y, z, lsh_tree.leaf_codes(z, self._planes))


class PrepareBlocks(beam.PTransform):
    def __init__(self, cfg: GeneratorConfig, dim: int) -> None:
        super().__init__()
        self._cfg, self._dim = cfg, dim

    def expand(self, blocks):
        return blocks | beam.ParDo(_PrepareFn(self._cfg, self._dim))


class _SumFn(beam.CombineFn):
    """Sums partial aggregates with ``add``; None is the zero."""

    def __init__(self, add: Callable[[Any, Any], Any]) -> None:
        self._add = add

    def create_accumulator(self):
        return None

    def add_input(self, acc, value):
        if value is None:
            return acc
        return value if acc is None else self._add(acc, value)

    def merge_accumulators(self, accs):
        out = None
        for acc in accs:
            out = self.add_input(out, acc)
        return out

    def extract_output(self, acc):
        return acc


class _PartialFn(beam.DoFn):
    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn

    def process(self, block: Block, *side):
        for label in np.unique(block.y).tolist():
            yield label, self._fn(label, block.of_class(label), *side)


class PerClassSum(beam.PTransform):
    """(label, exact aggregate) for *every* configured label.

    ``fn(label, class_block, *side_values)`` computes a block's partial
    aggregate; partials are summed with ``add``. Labels with no rows get
    ``None``, so every class reaches its mechanism: the release never
    reveals by omission that a class is empty.
    """

    def __init__(self, labels: Sequence[int], fn: Callable[..., Any],
                 side_inputs: Iterable = (),
                 add: Callable[[Any, Any], Any] = operator.add) -> None:
        super().__init__()
        self._labels, self._fn = list(labels), fn
        self._side, self._add = list(side_inputs), add

    def expand(self, blocks):
        if self._side:
            # Without a fusion break, runners fuse this ParDo with the other
            # readers of ``blocks``, i.e. with the passes its side inputs
            # come from, and stall (FnApiRunner: "watermark-pending bundles").
            blocks = blocks | "BreakFusion" >> beam.Reshuffle()
        partials = blocks | "Partials" >> beam.ParDo(_PartialFn(self._fn),
                                                     *self._side)
        seeds = (blocks.pipeline
                 | "EveryLabel" >> beam.Create([(l, None) for l in self._labels]))
        return ((partials, seeds) | "WithEveryLabel" >> beam.Flatten()
                | "Sum" >> beam.CombinePerKey(_SumFn(self._add)))
