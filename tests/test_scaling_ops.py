"""The vectorised / linear-time versions of the per-block steps equal the
straightforward ones (ISSUE 6: speed must not change results)."""

import dataclasses

import numpy as np
import pytest

from dpsynth.dp_ops import generator, lsh_tree, vote
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.transforms.aggregate import Block, _SumFn, add_inplace, prepare_block


def _naive_level_counts(codes, depth):
    out = []
    for level in range(1, depth + 1):
        keys, counts = np.unique(lsh_tree.level_code(codes, level, depth),
                                 return_counts=True)
        out.append(dict(zip(keys.tolist(), counts.tolist())))
    return out


def _naive_leaf_index(tree, codes):
    """The original per-level searchsorted (shallowest matching leaf)."""
    out = np.full(codes.shape, -1, dtype=np.int64)
    leaves = np.array(tree.leaves, dtype=np.int64).reshape(-1, 2)
    for level in range(1, tree.depth + 1):
        idx = np.flatnonzero(leaves[:, 0] == level)
        if idx.size == 0:
            continue
        order = np.argsort(leaves[idx, 1])
        keys, idx = leaves[idx[order], 1], idx[order]
        prefix = lsh_tree.level_code(codes, level, tree.depth)
        pos = np.minimum(np.searchsorted(keys, prefix), keys.size - 1)
        hit = (keys[pos] == prefix) & (out < 0)
        out[hit] = idx[pos[hit]]
    return out


def _codes(n, d, depth, seed):
    x = np.random.default_rng(seed).normal(size=(n, d))
    return lsh_tree.leaf_codes(x, lsh_tree.hyperplanes(d, depth, seed))


@pytest.mark.parametrize("depth,seed", [(1, 0), (4, 1), (8, 2), (14, 3)])
def test_level_counts_equal_per_level_unique(depth, seed):
    codes = _codes(3000, 6, depth, seed)
    assert lsh_tree.level_counts(codes, depth) == _naive_level_counts(codes,
                                                                      depth)
    assert lsh_tree.level_counts(codes[:0], depth) == [{}] * depth


@pytest.mark.parametrize("depth,threshold,seed",
                         [(3, 5.0, 0), (8, 40.0, 1), (8, 400.0, 2),
                          (12, 20.0, 3)])
def test_vectorised_leaf_index_equals_naive(depth, threshold, seed):
    codes = _codes(4000, 8, depth, seed)
    rng = np.random.default_rng(seed)
    tree = lsh_tree.build_tree(
        lsh_tree.level_counts(codes, depth), depth, threshold,
        lambda level, size: rng.normal(0, 10, size))
    fast = tree.leaf_index(codes)
    np.testing.assert_array_equal(fast, _naive_leaf_index(tree, codes))
    assert (fast >= 0).all()
    # every possible code, not only those seen
    every = np.arange(2 ** depth, dtype=np.int64)
    np.testing.assert_array_equal(tree.leaf_index(every),
                                  _naive_leaf_index(tree, every))


def test_merge_level_counts_into_updates_in_place():
    a = [{0: 1, 1: 2}, {3: 1}]
    b = [{1: 3, 5: 1}, {}]
    pure = lsh_tree.merge_level_counts(a, b)
    assert a == [{0: 1, 1: 2}, {3: 1}]
    assert lsh_tree.merge_level_counts_into(a, b) is a
    assert a == pure == [{0: 1, 1: 5, 5: 1}, {3: 1}]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tiled_nearest_candidate_matches_brute_force(dtype):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(700, 24))
    cands = rng.normal(size=(1000, 24))
    cands[10] = cands[500]  # a tie across tiles: the lower id must win
    x[:5] = cands[500]
    index = vote.CandidateIndex(cands, dtype)
    got = index.nearest(x, row_tile=64, cand_tile=128)
    d2 = ((x[:, None, :] - cands[None, :, :]) ** 2).sum(-1)
    want = d2.argmin(axis=1)
    assert (got[:5] == 10).all()
    if dtype == np.float64:
        np.testing.assert_array_equal(got, want)
    else:  # nearest up to float32 rounding
        chosen = d2[np.arange(len(x)), got]
        assert np.all(chosen <= d2.min(axis=1) + 1e-4)
        assert np.mean(got == want) > 0.99
    # tiles do not change the answer
    np.testing.assert_array_equal(got, index.nearest(x))


def test_block_votes_are_one_per_row_whatever_the_tiles():
    rng = np.random.default_rng(1)
    cands = rng.normal(size=(300, 8))
    x = rng.normal(size=(2000, 8))
    index = vote.CandidateIndex(cands)
    whole = vote.block_votes(x, index)
    parts = sum(vote.block_votes(x[s:s + 333], index)
                for s in range(0, len(x), 333))
    np.testing.assert_array_equal(whole, parts)
    assert whole.sum() == len(x) and whole.shape == (300,)
    assert vote.block_votes(x[:0], index).tolist() == [0.0] * 300
    assert vote.block_votes(x, np.zeros((0, 8))).shape == (0,)


def _mixture(label=0, d=6, count=1000.0):
    k = 3
    return generator.ClassMixture(label, np.array([0.5, 0.3, 0.2]) * count,
                                  np.eye(k, d) * 0.5, np.full((k, d), 0.01),
                                  count)


def test_vote_candidate_cap_is_public_and_respected():
    base = GeneratorConfig(labels=(0,), vote_filter=True, vote_oversample=6)
    mix = _mixture()
    uncapped = generator.candidates(mix, base)
    np.testing.assert_array_equal(uncapped, generator.candidates(mix, base))
    assert len(uncapped) == 6000
    capped = dataclasses.replace(base, vote_max_candidates=2500)
    assert len(generator.candidates(mix, capped)) == 2500
    roomy = dataclasses.replace(base, vote_max_candidates=10 ** 6)
    np.testing.assert_array_equal(generator.candidates(mix, roomy), uncapped)
    no_vote = dataclasses.replace(base, vote_filter=False)
    assert len(generator.candidates(mix, no_vote)) == 1000
    with pytest.raises(ValueError, match="vote-max-candidates"):
        object.__setattr__(capped, "vote_max_candidates", 0)  # bypass config
        generator.candidates(mix, capped)


def test_blocks_are_sorted_by_label_and_split_into_views():
    cfg = GeneratorConfig(labels=(0, 1, 2), cluster_dim=4, tree_depth=5)
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(500, 10)), rng.integers(0, 3, 500)
    proj, planes = generator.projection(10, cfg), generator.planes(cfg, 10)
    block, _ = prepare_block(x, y, cfg, proj, planes)
    assert np.all(np.diff(block.y) >= 0)
    parts = dict(block.by_class())
    assert sorted(parts) == [0, 1, 2]
    for label, part in parts.items():
        assert np.shares_memory(part.x, block.x)
        ref = block.of_class(label)
        np.testing.assert_array_equal(part.x, ref.x)
        np.testing.assert_array_equal(part.codes, ref.codes)
        # same rows as preparing the class alone (order aside)
        alone, _ = prepare_block(x[y == label], y[y == label], cfg, proj,
                                 planes)
        np.testing.assert_allclose(np.sort(part.x, axis=0),
                                   np.sort(alone.x, axis=0))
    shuffled = Block(block.x[::-1], block.y[::-1], block.z[::-1],
                     block.codes[::-1])
    for label, part in shuffled.by_class():
        np.testing.assert_array_equal(part.x, shuffled.of_class(label).x)


def test_sum_combiner_never_mutates_its_inputs():
    fn = _SumFn(add_inplace)
    a, b = np.ones(3), np.full(3, 2.0)
    acc = fn.add_input(fn.add_input(fn.create_accumulator(), a), b)
    assert acc.tolist() == [3.0, 3.0, 3.0] and a.tolist() == [1.0] * 3
    merged = fn.merge_accumulators([None, acc, fn.add_input(None, b)])
    assert merged.tolist() == [5.0] * 3 and b.tolist() == [2.0] * 3
    assert add_inplace(np.ones(2, int), np.full(2, 0.5)).tolist() == [1.5] * 2


@pytest.mark.parametrize("dim,label", [(1, 0), (5, 3), (384, -2), (700, 1234567)])
def test_vectorised_tfrecords_parse_like_tensorflow_examples(tmp_path, dim,
                                                             label):
    import io as _io

    from apache_beam.io.tfrecordio import _TFRecordUtil

    from dpsynth.transforms import io as tio
    from dpsynth.transforms.write import tfrecord_bytes
    x = np.random.default_rng(dim).normal(size=(37, dim)).astype(np.float32)
    data = tfrecord_bytes(x, label, "emb", "lab")
    handle, records = _io.BytesIO(data), []
    while handle.tell() < len(data):  # checks both CRCs of every record
        records.append(_TFRecordUtil.read_record(handle))
    assert len(records) == 37
    path = tmp_path / "rows.tfrecord"
    path.write_bytes(data)
    xs, ys = tio.load_arrays(str(path), embedding_feature="emb",
                             label_feature="lab")
    np.testing.assert_array_equal(xs, x.astype(np.float64))
    assert ys.tolist() == [label] * 37
    assert tfrecord_bytes(x[:0], label) == b""


def test_blas_threads_limit_is_scoped():
    from threadpoolctl import threadpool_info

    from dpsynth.dp_ops.kmeans import blas_threads

    def blas():
        return [i["num_threads"] for i in threadpool_info()
                if i["user_api"] == "blas"]
    before = blas()
    with blas_threads(1):
        assert all(n == 1 for n in blas())
    assert blas() == before
    with blas_threads(None):
        assert blas() == before
