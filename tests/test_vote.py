import numpy as np

from dpsynth.dp_ops import vote


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


def _exact_nearest(x, cands):
    """Brute force on the float32-rounded rows and candidates, each score
    summed pair by pair in float64; lowest id on ties."""
    x64 = np.asarray(x, np.float32).astype(np.float64)
    c64 = np.asarray(cands, np.float32).astype(np.float64)
    half = 0.5 * np.einsum("ij,ij->i", c64, c64)
    scores = (x64[:, None, :] * c64[None, :, :]).sum(-1) - half
    return scores.argmax(axis=1)


def test_near_ties_are_decided_exactly_whatever_the_tiles_and_threads():
    """Votes must not depend on BLAS rounding (tiling, block, threads):
    candidates one float32 ulp apart and exact duplicates are decided as
    the exact rule says, identically for every tiling and thread count."""
    from threadpoolctl import threadpool_limits
    rng = np.random.default_rng(7)
    d = 48
    base = rng.normal(size=(60, d)).astype(np.float32) * 0.1
    nudged = np.nextafter(base, np.float32(1))  # one ulp up, every entry
    cands = np.vstack([base, nudged, base[:10]])  # ties and duplicates
    x = np.vstack([base + rng.normal(size=base.shape) * 1e-3,
                   rng.normal(size=(300, d)) * 0.1]).astype(np.float32)
    want = _exact_nearest(x, cands)
    index = vote.CandidateIndex(cands)
    answers = []
    for threads in (1, 2):
        with threadpool_limits(threads):
            for rt, ct in ((1024, 8192), (7, 16), (64, 50), (1, 130)):
                answers.append(index.nearest(x, row_tile=rt, cand_tile=ct))
    for got in answers:
        np.testing.assert_array_equal(got, want)
    # block boundaries (what a record arrives with) do not matter either
    parts = np.concatenate([index.nearest(x[:37]), index.nearest(x[37:])])
    np.testing.assert_array_equal(parts, want)


def test_tolerance_bounds_the_blas_error():
    rng = np.random.default_rng(3)
    cands = rng.normal(size=(500, 384)).astype(np.float32) * 0.05
    x = rng.normal(size=(200, 384)).astype(np.float32) * 0.05
    index = vote.CandidateIndex(cands)
    blas = x @ index.points.T - index.half_sq
    x64, c64 = x.astype(np.float64), index.points.astype(np.float64)
    exact = (x64[:, None, :] * c64[None]).sum(-1) - index.half_sq64
    err = np.abs(blas - exact).max(axis=1)
    assert np.all(err <= index.tolerance(x) / 2)


def test_identical_candidates_vote_for_the_lowest_id():
    """Every candidate ties (a collapsed mixture): all are contenders, the
    exact step runs in chunks, the lowest id wins for every row."""
    rng = np.random.default_rng(0)
    c = np.tile(rng.normal(size=(1, 16)).astype(np.float32), (20000, 1))
    x = rng.normal(size=(300, 16)).astype(np.float32)
    assert set(vote.CandidateIndex(c).nearest(x).tolist()) == {0}


def test_half_squares_by_chunks_equal_one_float64_copy():
    """The index's |c|^2 / 2, computed a chunk of rows at a time (no
    float64 copy of every candidate), has the same bits as from one copy
    of them all, whatever the chunk."""
    from dpsynth.dp_ops import vote
    rng = np.random.default_rng(7)
    for m, d in ((1, 3), (1000, 384), (4097, 65)):
        c = (rng.standard_normal((m, d)) * rng.uniform(0.1, 10, (m, 1))
             ).astype(np.float32)
        whole = c.astype(np.float64)
        expected = 0.5 * np.einsum("ij,ij->i", whole, whole)
        for chunk in (1, 7, 4096, 65536):
            got = vote.half_squares(c, chunk)
            assert got.tobytes() == expected.tobytes(), (m, d, chunk)
    assert vote.half_squares(np.zeros((0, 4), np.float32)).shape == (0,)
