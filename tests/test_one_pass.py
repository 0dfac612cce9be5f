"""One read of the blocks feeds every aggregation of a pass
(``aggregate.OnePass``): the same sums as separate aggregations, and no
plan gives a pass's prepared blocks two readers (dpsynth's Dask runner
then kept every block of the pass until the second reader ran: 7.9 GB of
worker memory at 2M x 384 with --clusters 16)."""

import os

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.pvalue import AsDict
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that

from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.transforms import io
from dpsynth.transforms.aggregate import (GlobalSum, OnePass, PerClassSum,
                                  PrepareBlocks, SecondMoment)


def _files(tmp_path, n=900, d=5):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(n, d)).astype(np.float32), rng.integers(0, 3, n)
    y[y == 2] = 1  # label 2 is empty: every aggregation still reports it
    for i in range(3):
        np.savez(tmp_path / f"part-{i}.npz", embeddings=x[i::3],
                 labels=y[i::3])
    return str(tmp_path / "part-*.npz")


class _Count:
    """An accumulator: rows per class and bundle."""

    def zero(self, rows):
        return np.zeros(1)

    def add(self, acc, rows):
        acc += len(rows.y)

    def done(self, acc):
        return acc


def test_one_pass_gives_each_aggregation_its_own_sums(tmp_path):
    """A per-class function with a side input, a per-class accumulator
    and a global accumulator from one ParDo equal the three aggregations
    run on their own (exact bits), with the empty class still reported."""
    from dpsynth.transforms.aggregate import Accumulator
    cfg = GeneratorConfig(labels=(0, 1, 2), cluster_dim=3, tree_depth=3)
    spec = io.InputSpec(_files(tmp_path), labels=(0, 1, 2), block_size=64)
    reader = io.ReadEmbeddingBlocks(spec)
    count = type("Count", (_Count, Accumulator), {})

    def aggregations(scale):
        return {
            "Scaled": PerClassSum([0, 1, 2],
                                  lambda l, b, s: b.x.sum(0) * s[0],
                                  [AsDict(scale)]),
            "Rows": PerClassSum([0, 1, 2], count()),
            "Second": GlobalSum(SecondMoment(cfg.clip_norm))}

    def check(pairs):
        got = dict(pairs)
        one, alone = got["one"], got["alone"]
        for name in ("Scaled", "Rows"):
            assert one[name][2] is None and alone[name][2] is None
            for label in (0, 1):
                assert np.array_equal(one[name][label], alone[name][label])
        assert np.array_equal(one["Second"], alone["Second"])
        assert one["Rows"][0][0] + one["Rows"][1][0] == 900

    with TestPipeline(runner="FnApiRunner") as p:
        scale = p | "Scale" >> beam.Create([(0, 2.0)])
        blocks = p | reader | PrepareBlocks(cfg, reader.dim)
        one = blocks | "One" >> OnePass(aggregations(scale))
        alone = {name: blocks | f"Alone{name}" >> agg
                 for name, agg in aggregations(scale).items()}

        def gather(results, tag):
            return ((p | f"Tag{tag}" >> beam.Create([tag]))
                    | f"Gather{tag}" >> beam.Map(
                        lambda t, s, r, g: (t, {"Scaled": s, "Rows": r,
                                                "Second": g[0]}),
                        AsDict(results["Scaled"]), AsDict(results["Rows"]),
                        beam.pvalue.AsList(results["Second"])))
        both = (gather(one, "one"), gather(alone, "alone")) | beam.Flatten()
        assert_that(both | beam.combiners.ToList(), lambda l: check(l[0]))


def _readers_of_prepared_blocks(p: beam.Pipeline) -> dict:
    """Each prepared-blocks PCollection -> how many transforms read it as
    their main input (side inputs excluded)."""
    readers: dict = {}

    class Visitor(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            side = {s.pvalue for s in node.side_inputs}
            for pcoll in node.inputs:
                if pcoll in side or pcoll.producer is None:
                    continue
                if "_PrepareFn" in pcoll.producer.full_label:
                    readers.setdefault(pcoll.producer.full_label, 0)
                    readers[pcoll.producer.full_label] += 1

    p.visit(Visitor())
    return readers


def _job(tmp_path, *flags):
    from dpsynth.pipelines import job_plan
    from dpsynth.pipelines.cli import generate
    x = np.random.default_rng(1).normal(size=(60, 8)).astype(np.float32)
    np.savez(tmp_path / "a.npz", embeddings=x, labels=np.arange(60) % 3)
    args, beam_argv = generate.parser().parse_known_args(
        ["--input", str(tmp_path / "a.npz"), "--output",
         str(tmp_path / "out"), "--num-classes", "3", "--noise-seed", "1",
         *flags])
    spec = generate.spec_from_args(args, beam_argv)
    return job_plan.prepare(spec), spec


@pytest.mark.parametrize("flags", [
    ["--clusters", "4"],  # the fixed plan with the shared matrix
    ["--clusters", "4", "--covariance", "per-class"],
    ["--clusters", "4", "--vote-filter"]])
def test_no_pass_of_a_fixed_plan_has_two_readers(tmp_path, flags):
    from dpsynth.pipelines import graph, job_plan
    j, spec = _job(tmp_path, *flags)
    p = beam.Pipeline()
    graph.build(p, j, job_plan.make_reader(j, spec), spec)
    readers = _readers_of_prepared_blocks(p)
    assert any("Moments" in name for name in readers), readers
    assert set(readers.values()) == {1}, readers


@pytest.mark.parametrize("counts", [[20.0] * 3, [2000.0] * 3])
def test_no_pass_of_the_adaptive_plan_has_two_readers(tmp_path, counts):
    """Phase 2 in the shared mode (class sums + the global second moment)
    and in the per-class mode."""
    from dpsynth.pipelines import graph, job_plan
    j, spec = _job(tmp_path)
    mode = graph.choose_phase2(j, 8, counts).mode
    assert mode == ("shared" if counts[0] < 100 else "per-class")
    p = beam.Pipeline()
    graph.build_adaptive(p, j, job_plan.make_reader(j, spec), spec,
                         np.zeros(8), counts)
    readers = _readers_of_prepared_blocks(p)
    assert any("Moments" in name for name in readers), readers
    assert set(readers.values()) == {1}, readers


def test_a_bundle_emits_one_partial_per_class():
    """Per-block partials are summed within the bundle (the combiner's
    add, the first value copied; a class with only None partials still
    comes out, as None): on Dask a bundle's outputs are held as one list
    until the combine runs."""
    from dpsynth.transforms.aggregate import Block, Part, _PartialFn

    def block(labels):
        y = np.array(labels)
        return Block(np.ones((len(y), 2)), y, np.zeros((len(y), 0)),
                     np.zeros(len(y), np.int64))

    def fn(label, rows):
        return None if label == 2 else rows.x.sum(0)

    dofn = _PartialFn(Part(fn), 1)
    for _ in range(2):  # a retried bundle starts from nothing
        dofn.start_bundle()
        for labels in ([0, 0, 1], [1, 2], [0]):
            assert list(dofn.process(block(labels))) == []
        out = [wv.value for wv in dofn.finish_bundle()]
        assert [label for label, _ in out] == [0, 1, 2]
        assert np.array_equal(out[0][1], [3.0, 3.0])
        assert np.array_equal(out[1][1], [2.0, 2.0]) and out[2][1] is None


def test_vote_candidates_are_indexed_once_per_process():
    """Every copy of the vote DoFn (Dask unpickles one per task) finds the
    index its process built; a new mixture of a class replaces the old."""
    import pickle

    from dpsynth.dp_ops import generator
    from dpsynth.transforms import mixture
    cfg = GeneratorConfig(labels=(0, 1), vote_filter=True,
                          vote_max_candidates=50)

    def mix(label, shift):
        return generator.ClassMixture(
            label, np.array([20.0]), np.full((1, 3), shift),
            np.ones((1, 3)), 20.0)

    votes = mixture._Votes(cfg)
    a = mixture.candidate_index(mix(0, 0.0), cfg)
    copy = pickle.loads(pickle.dumps(votes))
    assert mixture.candidate_index(mix(0, 0.0), cfg) is a
    x = np.zeros((4, 3))
    rows = type("Rows", (), {"x": x})()
    assert np.array_equal(copy(0, rows, {0: mix(0, 0.0)}),
                          votes(0, rows, {0: mix(0, 0.0)}))
    b = mixture.candidate_index(mix(0, 1.0), cfg)
    assert b is not a
    assert sum(k[0] == 0 for k in mixture._INDEXES) == 1
    other = GeneratorConfig(labels=(0, 1), vote_filter=True,
                            vote_max_candidates=40)
    mixture.candidate_index(mix(1, 0.0), other)  # another job's config
    assert all(k[2] == other for k in mixture._INDEXES)
