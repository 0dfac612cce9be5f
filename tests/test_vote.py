import numpy as np

from dp_ops import vote


def test_votes_count_every_record_once_and_dense():
    rng = np.random.default_rng(0)
    cands = rng.normal(size=(50, 4))
    x = rng.normal(size=(1000, 4))
    hist = vote.block_votes(x, cands, chunk=128)
    assert hist.shape == (50,)
    assert hist.sum() == 1000
    # add/remove one record changes one bin by one (L2 sensitivity 1)
    more = vote.block_votes(np.vstack([x, cands[3:4]]), cands)
    diff = more - hist
    assert np.linalg.norm(diff) == 1 and diff[3] == 1


def test_keep_mask():
    assert vote.keep_mask(np.array([5.9, 6.0, 7]), 6).tolist() == [False, True, True]
