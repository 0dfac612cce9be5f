import numpy as np
import pytest

from dpsynth.dp_ops import clipping
from dpsynth.dp_ops.clipping import clip_rows, normalize_rows, preprocess


def test_clip_bounds_every_row_and_counts_clipped():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 20)) * rng.uniform(0, 3, size=(500, 1))
    out, n = clip_rows(x, 2.0)
    norms = np.linalg.norm(out, axis=1)
    assert norms.max() <= 2.0
    assert n == int((np.linalg.norm(x, axis=1) > 2.0).sum())
    small = np.linalg.norm(x, axis=1) <= 2.0
    np.testing.assert_allclose(out[small], x[small], rtol=1e-9)


def test_clip_keeps_direction():
    out, _ = clip_rows(np.array([[30.0, 40.0]]), 1.0)
    np.testing.assert_allclose(out, [[0.6, 0.8]], rtol=1e-9)


def test_unit_normalisation_and_zero_rows():
    x = np.array([[3.0, 4.0], [0.0, 0.0]])
    out = normalize_rows(x, "unit")
    np.testing.assert_allclose(out, [[0.6, 0.8], [0, 0]])


@pytest.mark.parametrize("r", [0, -1])
def test_bad_clip_norm(r):
    with pytest.raises(ValueError, match="--clip-norm"):
        clip_rows(np.ones((2, 2)), r)


def test_preprocess_is_per_record():
    x = np.random.default_rng(1).normal(size=(10, 4))
    full, _ = preprocess(x, "unit", 0.5)
    one, _ = preprocess(x[3:4], "unit", 0.5)
    np.testing.assert_array_equal(full[3:4], one)


@pytest.mark.parametrize("chunk", [None, 7])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", ["unit", "none"])
def test_preprocess_in_place_equals_the_step_by_step_composition(
        dtype, mode, chunk, monkeypatch):
    """preprocess / centre_sum work on one copy in place, a chunk of rows
    at a time (``chunk``: 7 rows, else the default ~1 MB): the same bits as
    normalize_rows -> minus the centre -> clip_rows (-> quantize), and the
    caller's rows are left untouched."""
    from dpsynth.dp_ops.moments import quantize
    if chunk is not None:
        monkeypatch.setattr(clipping, "PREPARE_CHUNK_BYTES", 8 * 32 * chunk)
        assert clipping.chunk_rows(32) == chunk
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((300, 32))
         * rng.uniform(0, 3, (300, 1))).astype(dtype)
    x[5] = 0  # a zero row stays zero
    before = x.copy()
    centre = rng.standard_normal(32) * 0.1
    for c in (None, centre):
        steps = normalize_rows(np.asarray(x, np.float64), mode)
        if c is not None:
            steps = steps - c[None, :]
        want, want_clipped = clip_rows(steps, 0.7)
        got, clipped = preprocess(x, mode, 0.7, c)
        assert np.array_equal(got, want) and clipped == want_clipped
    total, count = clipping.centre_sum(x, mode, 1.0)
    rows, _ = clip_rows(normalize_rows(np.asarray(x, np.float64), mode), 1.0)
    assert np.array_equal(total, quantize(rows, 1.0).sum(axis=0))
    assert count == len(x)
    assert np.array_equal(x, before)
