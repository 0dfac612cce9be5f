"""Passes over one PCollection of blocks, chained by side inputs, run on the
FnApiRunner without a per-pass Reshuffle; re-read blocks give the same sums."""

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.pvalue import AsDict
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.transforms import io
from dpsynth.transforms.aggregate import (PerClassSum, PrepareBlocks, RereadBlocks,
                                  pass_blocks)


def _chain(blocks, labels):
    """Three passes, each needing the previous pass's result per label."""
    count = (pass_blocks(blocks, "P1")
             | "Count" >> PerClassSum(labels, lambda l, b: len(b.y)))
    total = (pass_blocks(blocks, "P2")
             | "Total" >> PerClassSum(
                 labels, lambda l, b, c: float(b.x.sum()) / (c[l] or 1),
                 [AsDict(count)]))
    return (pass_blocks(blocks, "P3")
            | "Last" >> PerClassSum(
                labels, lambda l, b, c, t: len(b.y) * 0 + (c[l] or 0),
                [AsDict(count), AsDict(total)], add=lambda a, b: a)
            | "Round" >> beam.MapTuple(lambda l, v: (l, v)))


def _data(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(900, 5)), rng.integers(0, 3, 900)
    y[y == 2] = 1  # label 2 is empty: it must still be reported
    for i in range(3):
        np.savez(tmp_path / f"part-{i}.npz", embeddings=x[i::3], labels=y[i::3])
    counts = {l: int((y == l).sum()) or None for l in (0, 1, 2)}
    return str(tmp_path / "part-*.npz"), counts


@pytest.mark.parametrize("layout", ["one-pcollection", "reread"])
def test_chained_passes_give_the_sums_and_do_not_stall(tmp_path, layout):
    """Chained passes over one materialised PCollection of blocks (which
    once stalled the FnApiRunner) or over blocks re-read for every pass."""
    pattern, counts = _data(tmp_path)
    cfg = GeneratorConfig(labels=(0, 1, 2), cluster_dim=3, tree_depth=3)
    spec = io.InputSpec(pattern, labels=(0, 1, 2), block_size=64)
    reader = io.ReadEmbeddingBlocks(spec)
    with TestPipeline(runner="FnApiRunner") as p:
        if layout == "reread":
            blocks = RereadBlocks(p, reader, cfg, reader.dim)
        else:
            blocks = p | reader | PrepareBlocks(cfg, reader.dim)
        out = _chain(blocks, [0, 1, 2])
        assert_that(out, equal_to([(0, counts[0]), (1, counts[1]),
                                   (2, None)]))


@pytest.mark.parametrize("layout", [[], ["--materialise-blocks"]])
def test_both_block_layouts_match_in_memory_reference(tmp_path, layout):
    """The whole graph, re-reading the files every pass (default) or with
    the blocks materialised once, equals the reference with the same seeds,
    over several input files and small blocks."""
    from dpsynth.pipelines import cli
    from dpsynth.pipelines.cli import generate
    from dpsynth.pipelines.release import load_release
    from tests.conftest import assert_release_matches_reference, gmm_data

    x, y = gmm_data(1200, d=10, classes=3, comps=2)
    np.savez(tmp_path / "a.npz", embeddings=x[:700], labels=y[:700])
    np.savez(tmp_path / "b.npz", embeddings=x[700:], labels=y[700:])
    out = tmp_path / "rel"
    argv = ["generate", "--input", str(tmp_path / "*.npz"), "--output",
            str(out), "--num-classes", "3", "--epsilon", "3", "--clusters",
            "4", "--noise-seed", "5", "--block-size", "100", "--vote-filter",
            "--vote-max-candidates", "300", "--covariance-rank", "0",
            *layout]
    assert cli.main(argv) == 0
    args, _ = generate.parser().parse_known_args(argv[1:])
    from dpsynth.pipelines import job_plan
    cfg = job_plan.resolve_config(generate.spec_from_args(args), (0, 1, 2))
    _, _, ys = assert_release_matches_reference(out, x, y, cfg, 5)
    assert len(load_release(str(out))[1]) == len(ys)


def test_accumulated_second_moments_equal_per_block_partials(tmp_path):
    """The per-bundle in-place accumulation of the adaptive plan's class
    moments gives the same bits as summing one partial per block and class
    (exact grid sums; the second moments move as their upper triangles), on
    several files, bundles and small blocks; an empty class is still
    reported."""
    from dpsynth.dp_ops import adaptive, covariance
    from dpsynth.transforms.pipelinedp import (_Concatenated,
                                       class_second_moment_family,
                                       class_sum_family)

    pattern, _ = _data(tmp_path)
    cfg = GeneratorConfig(labels=(0, 1, 2), cluster_dim=3, tree_depth=3)
    spec = io.InputSpec(pattern, labels=(0, 1, 2), block_size=64)
    reader = io.ReadEmbeddingBlocks(spec)

    def per_block(_, b):
        return np.concatenate([adaptive.block_class_sum(b.x, cfg.clip_norm),
                               covariance.triangle(
                                   covariance.block_second_moment(
                                       b.x, cfg.clip_norm))])

    def check(got):
        got = dict(got)
        assert got["accumulated"][2] is None
        for label in (0, 1):
            assert np.array_equal(got["accumulated"][label],
                                  got["per_block"][label])

    with TestPipeline(runner="FnApiRunner") as p:
        blocks = p | reader | PrepareBlocks(cfg, reader.dim)
        acc = (pass_blocks(blocks, "A") | "Acc" >> PerClassSum(
            [0, 1, 2], _Concatenated(
                [class_sum_family(cfg.clip_norm),
                 class_second_moment_family(cfg.clip_norm)], reader.dim)))
        ref = (pass_blocks(blocks, "B")
               | "Ref" >> PerClassSum([0, 1, 2], per_block))
        both = ((p | "Names" >> beam.Create(["accumulated", "per_block"]))
                | beam.Map(lambda name, a, r: (
                    name, a if name == "accumulated" else r),
                    AsDict(acc), AsDict(ref)))
        assert_that(both | beam.combiners.ToList(), lambda l: check(l[0]))


def test_global_second_moment_accumulated_per_bundle_equals_per_block_sum(
        tmp_path):
    """GlobalSum(SecondMoment): one in-place partial per bundle gives the
    bits of summing x^T x block by block (exact grid sums); no rows: None."""
    from dpsynth.dp_ops import covariance
    from dpsynth.transforms.aggregate import (Block, GlobalSum, SecondMoment,
                                              sum_present)

    pattern, _ = _data(tmp_path)
    cfg = GeneratorConfig(labels=(0, 1, 2), cluster_dim=3, tree_depth=3)
    spec = io.InputSpec(pattern, labels=(0, 1, 2), block_size=64)
    reader = io.ReadEmbeddingBlocks(spec)

    def check(pair):
        (acc,), (ref,) = pair
        assert acc.shape == ref.shape and np.array_equal(acc, ref)

    with TestPipeline(runner="FnApiRunner") as p:
        blocks = p | reader | PrepareBlocks(cfg, reader.dim)
        acc = pass_blocks(blocks, "A") | "Acc" >> GlobalSum(
            SecondMoment(cfg.clip_norm))
        ref = (pass_blocks(blocks, "B")
               | "Per" >> beam.Map(lambda b: covariance.block_second_moment(
                   b.x, cfg.clip_norm))
               | "Ref" >> beam.CombineGlobally(sum_present))
        both = ((p | "One" >> beam.Create([None]))
                | beam.Map(lambda _, a, r: (a, r),
                           beam.pvalue.AsList(acc), beam.pvalue.AsList(ref)))
        assert_that(both, lambda l: check(l[0]))
        # typed as the step takes it (Beam 2.78 refuses object -> Block)
        empty = ((p | "NoBlocks" >> beam.Create([]).with_output_types(Block))
                 | "AccEmpty" >> GlobalSum(SecondMoment(cfg.clip_norm)))
        assert_that(empty, equal_to([None]), label="none")


@pytest.mark.parametrize("centre", [False, True])
def test_a_clustering_pass_block_has_the_projections_without_the_rows(centre):
    """``prepare_block(rows=False)`` (the tree and Lloyd passes, which read
    only z and the codes) gives the bits of the full block's z, codes and
    clipped count, and no prepared rows."""
    from dpsynth.dp_ops import generator
    from dpsynth.dp_ops.config import GeneratorConfig
    from dpsynth.transforms.aggregate import prepare_block
    rng = np.random.default_rng(2)
    d = 384  # above the clustering dimension: a real projection
    x = (rng.standard_normal((1000, d)) * rng.uniform(0.2, 2, (1000, 1))
         ).astype(np.float32)
    y = rng.integers(0, 4, 1000)
    cfg = GeneratorConfig(labels=(0, 1, 2, 3), epsilon=2.0, clusters=4)
    proj, planes = generator.projection(d, cfg), generator.planes(cfg, d)
    c = rng.standard_normal(d) * 0.01 if centre else None
    full, n_full = prepare_block(x, y, cfg, proj, planes, c)
    lean, n_lean = prepare_block(x, y, cfg, proj, planes, c, rows=False)
    assert full.x.shape == (1000, d) and lean.x.shape == (1000, 0)
    assert n_full == n_lean and n_full > 0
    for field in ("y", "z", "codes"):
        assert np.array_equal(getattr(full, field), getattr(lean, field))
    assert [k for k, _ in lean.by_class()] == [0, 1, 2, 3]


def test_second_moments_accumulate_in_place_with_the_same_bits():
    """``add_second_moment_upper`` (BLAS syrk with beta 1, no d x d
    temporary) gives the upper triangle of the summed
    ``block_second_moment``s, over
    blocks of any length (an empty one, a strided class slice); the
    ``SecondMoment`` accumulator then mirrors it into the same full matrix."""
    from dpsynth.dp_ops import covariance
    from dpsynth.transforms.aggregate import Block, SecondMoment
    rng = np.random.default_rng(6)
    d = 40
    blocks = [rng.standard_normal((n, d)) * 0.2 for n in (0, 1, 57, 300)]
    blocks.append(rng.standard_normal((200, d))[::2] * 0.2)  # not contiguous
    want, got = np.zeros((d, d)), np.zeros((d, d))
    for x in blocks:
        want += covariance.block_second_moment(x, 0.7)
        covariance.add_second_moment_upper(got, x, 0.7)
    upper = np.triu_indices(d)
    assert np.array_equal(got[upper], want[upper])
    acc = SecondMoment(0.7)
    total = acc.zero(Block(blocks[2], np.zeros(57), np.zeros((57, 0)),
                           np.zeros(57, np.int64)))
    for x in blocks:
        acc.add(total, Block(x, np.zeros(len(x)), np.zeros((len(x), 0)),
                             np.zeros(len(x), np.int64)))
    assert np.array_equal(acc.done(total), want)
