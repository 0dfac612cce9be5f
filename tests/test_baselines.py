"""Baselines: end to end on tiny data, accounting cross-checks, noise checks."""

import importlib
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from dpsynth.dp_ops.calibration import gdp_mu
from dpsynth.dp_ops.ledger import ADD_REMOVE
from dpsynth.dp_ops.noise import SeededNoise
from benchmarks.baselines import METHODS, REGISTRY, make_method
from benchmarks.baselines import dpsgd, pe, psg
from tests.conftest import gmm_data

LABELS = [0, 1, 2]
TINY = {
    "dpgmm": dict(clusters=3, tree_depth=5),
    "dpgmm-vote": dict(clusters=3, tree_depth=5),
    "dpgmm-adaptive": dict(),
    "nonprivate-gmm": dict(clusters=3, tree_depth=5),
    "dpsgd": dict(epochs=4, batch_size=100),
    "dpsgd-linear": dict(epochs=4, batch_size=100),
    "dpsgd-default": dict(epochs=4),
    "dpsgd-linear-default": dict(epochs=4),
    "dpsgd-private-tuning": dict(epochs=4, batch_size=100),
    "dpsgd-linear-private-tuning": dict(epochs=4, batch_size=100),
    "pe": dict(rounds=3, population=40, output_per_class=200),
    "clustmix": dict(clusters=3, tree_depth=5),
    "psg": dict(iterations=15, inner_steps=4, per_class=8),
}


class RecordingNoise(SeededNoise):
    """SeededNoise that records (key, sigma, size) of every draw."""

    def __init__(self, seed=0):
        super().__init__(seed)
        self.draws = []

    def lattice_draw(self, sigma, size, key, grid=None):
        out = super().lattice_draw(sigma, size, key, grid)
        self.draws.append((key, sigma, size))
        return out


@pytest.fixture(scope="module")
def data():
    x, y = gmm_data(900, d=12, classes=3, spread=0.2)
    xt, yt = gmm_data(300, d=12, classes=3, seed=3, spread=0.2)
    return x, y, xt, yt


def accuracy(method, out, xt, yt):
    from dpsynth.models.classifiers import LogRegConfig, train_logreg
    if out.classifier is not None:
        return out.classifier.accuracy(method.preprocess(xt), yt)
    clf = train_logreg(out.x_syn, out.y_syn, LABELS, LogRegConfig(C=1.0))
    return clf.accuracy(method.preprocess(xt), yt)


@pytest.mark.parametrize("name", METHODS)
def test_every_method_runs_end_to_end(name, data):
    x, y, xt, yt = data
    method = make_method(name, **TINY[name])
    out = method.fit(x, y, LABELS, 4.0, 1e-5, seed=0, noise_seed=1)
    assert method.neighbouring == ADD_REMOVE
    assert all(m.neighbouring == ADD_REMOVE for m in out.ledger.mechanisms)
    if method.private:
        assert out.spent_epsilon <= 4.0 * (1 + 1e-9)
        assert all(m.sigma > 0 for m in out.ledger.mechanisms)
    else:
        assert math.isinf(out.spent_epsilon)
    if method.kind == "generator":
        assert out.x_syn.shape[1] == x.shape[1] and len(out.x_syn) == len(out.y_syn)
        assert set(np.unique(out.y_syn)) <= set(LABELS)
        assert np.isfinite(out.x_syn).all()
    else:
        assert out.classifier is not None and out.model in ("mlp", "logreg")
    # Easy, well-separated classes: every method must beat chance clearly.
    assert accuracy(method, out, xt, yt) > 0.6


@pytest.mark.parametrize("module", sorted({v[0] for v in REGISTRY.values()}))
def test_docstrings_state_the_neighbouring_relation(module):
    doc = importlib.import_module(module).__doc__
    assert "add/remove" in doc and "one record" in doc.replace("\n", " ")


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="unknown method"):
        make_method("gan")


def test_dpgmm_vote_pays_for_the_vote(data):
    x, y, _, _ = data
    out = make_method("dpgmm-vote", **TINY["dpgmm-vote"]).fit(
        x, y, LABELS, 2.0, 1e-5, noise_seed=2)
    assert {m.stage for m in out.ledger.mechanisms} >= {"vote", "moments"}


def test_bad_inputs_are_refused(data):
    x, y, _, _ = data
    m = make_method("pe", **TINY["pe"])
    with pytest.raises(ValueError, match="not in the public label set"):
        m.fit(x, y, [0, 1], 1.0, 1e-5)
    with pytest.raises(ValueError, match="delta"):
        m.fit(x, y, LABELS, 1.0, 0.0)


# ------------------------------------------------------------------ DP-SGD

@pytest.mark.parametrize("hidden", [0, 7])
def test_per_example_norms_and_clipped_sum_match_explicit(hidden):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(9, 5))
    yi = rng.integers(0, 3, 9)
    params = dpsgd.init_params(5, hidden, 3, rng)
    if hidden:
        params["b1"] = rng.normal(size=hidden)  # some ReLUs on, some off
    clip = 0.8
    sums, norms = dpsgd.clipped_gradient_sum(params, x, yi, clip)
    explicit = {k: np.zeros_like(v) for k, v in params.items()}
    for i in range(len(x)):
        g, _ = dpsgd.clipped_gradient_sum(params, x[i:i + 1], yi[i:i + 1],
                                          math.inf)
        flat = np.concatenate([v.ravel() for v in g.values()])
        assert np.linalg.norm(flat) == pytest.approx(norms[i], rel=1e-9)
        for k in g:
            explicit[k] += g[k] * min(1.0, clip / np.linalg.norm(flat))
    for k in sums:
        np.testing.assert_allclose(sums[k], explicit[k], atol=1e-12)


def test_per_example_gradient_matches_finite_differences():
    rng = np.random.default_rng(1)
    x, yi = rng.normal(size=(1, 4)), np.array([2])
    params = dpsgd.init_params(4, 6, 3, rng)
    params["b1"] = rng.normal(size=6)
    g, _ = dpsgd.clipped_gradient_sum(params, x, yi, math.inf)

    def loss(p):
        z = dpsgd.logits(p, x)[0]
        return np.log(np.exp(z - z.max()).sum()) + z.max() - z[2]
    eps = 1e-6
    for k in params:
        for idx in [(0,) * params[k].ndim, tuple(s - 1 for s in params[k].shape)]:
            p2 = {kk: v.copy() for kk, v in params.items()}
            p2[k][idx] += eps
            p3 = {kk: v.copy() for kk, v in params.items()}
            p3[k][idx] -= eps
            fd = (loss(p2) - loss(p3)) / (2 * eps)
            assert g[k][idx] == pytest.approx(fd, abs=1e-6)


def test_dpsgd_noise_has_the_ledger_sigma():
    rng = np.random.default_rng(2)
    x, yi = rng.normal(size=(50, 64)), rng.integers(0, 10, 50)
    params = dpsgd.init_params(64, 128, 10, rng)
    clean, _ = dpsgd.clipped_gradient_sum(params, x, yi, 1.0)
    sigma = 1.7
    noisy = dpsgd.noisy_gradient(params, x, yi, 1.0, sigma, 1.0,
                                 SeededNoise(5), "t")
    diff = np.concatenate([(noisy[k] - clean[k]).ravel() for k in clean])
    assert diff.size > 9000
    assert np.std(diff) == pytest.approx(sigma, rel=0.03)
    assert abs(np.mean(diff)) < 4 * sigma / math.sqrt(diff.size)


@pytest.mark.parametrize("eps", [1.0, 8.0])
def test_dpsgd_epsilon_matches_independent_dp_accounting(eps):
    q, steps, delta = 0.02, 250, 1e-5
    ledger = dpsgd.plan_ledger(eps, delta, q, steps, clip_norm=0.7,
                               accountant="rdp")
    mech = ledger.mechanisms[0]
    assert (mech.sampling_probability, mech.count) == (q, steps)
    assert mech.sigma == pytest.approx(0.7 * mech.noise_multiplier)
    z = mech.noise_multiplier
    # Independent computation straight from dp_accounting.
    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(
        q, dp_accounting.GaussianDpEvent(z)), steps)
    independent = acc.get_epsilon(delta)
    assert 0.98 * eps <= independent <= eps * (1 + 1e-6)
    # The (tighter) PLD accountant agrees the target is met.
    pld = pld_privacy_accountant.PLDAccountant()
    pld.compose(dp_accounting.PoissonSampledDpEvent(
        q, dp_accounting.GaussianDpEvent(z)), steps)
    assert pld.get_epsilon(delta) <= eps
    # Less noise would overspend: z is the smallest certified multiplier.
    acc2 = rdp_privacy_accountant.RdpAccountant()
    acc2.compose(dp_accounting.PoissonSampledDpEvent(
        q, dp_accounting.GaussianDpEvent(0.97 * z)), steps)
    assert acc2.get_epsilon(delta) > eps


def test_dpsgd_uses_the_calibrated_noise(data, monkeypatch):
    x, y, _, _ = data
    seen = []
    real = dpsgd.noisy_gradient

    def spy(params, xb, yb, clip, sigma, denom, noise, key):
        seen.append((sigma, len(xb)))
        return real(params, xb, yb, clip, sigma, denom, noise, key)
    monkeypatch.setattr(dpsgd, "noisy_gradient", spy)
    m = make_method("dpsgd", epochs=3, batch_size=90)
    out = m.fit(x, y, LABELS, 2.0, 1e-5, noise_seed=3)
    mech = out.ledger.mechanisms[0]
    assert len(seen) == mech.count
    assert all(s == mech.sigma for s, _ in seen)
    # Poisson sampling: mean batch ~ q n.
    sizes = np.array([b for _, b in seen])
    qn = mech.sampling_probability * len(x)
    assert abs(sizes.mean() - qn) < 4 * math.sqrt(qn / len(sizes))


# ---------------------------------------------------------------------- PE

def test_pe_gdp_mu_matches_dp_accounting():
    labels, eps, delta = [0, 1], 2.0, 1e-5
    cfg = pe.PEConfig(rounds=6)
    ledger = pe.plan_ledger(labels, cfg, eps, delta)
    sigma = ledger.get(pe.histogram_name(0)).sigma
    mu = math.sqrt(cfg.rounds) / sigma
    # GDP calibration, shrunk only as far as the PLD accountant needs.
    assert 0.9 * gdp_mu(eps, delta) <= mu <= gdp_mu(eps, delta)
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(sigma), cfg.rounds)
    independent = acc.get_epsilon(delta)
    assert 0.9 * eps <= independent <= eps
    # And the equivalent single Gaussian of multiplier 1/mu.
    single = pld_privacy_accountant.PLDAccountant()
    single.compose(dp_accounting.GaussianDpEvent(1 / mu))
    assert single.get_epsilon(delta) == pytest.approx(independent, rel=0.02)


def test_pe_histogram_noise_has_the_ledger_sigma():
    rng = np.random.default_rng(4)
    pop = pe.random_api(3000, 8, "gaussian", rng)
    real = np.repeat(pop, 5, axis=0)  # exactly 5 votes per candidate
    # sigma << 5: the clipping at 0 never binds.
    sigma = 1.0
    hist = pe.dp_histogram(real, pop, sigma, threshold=0.0,
                           noise=SeededNoise(6), key="k")
    assert np.std(hist - 5) == pytest.approx(sigma, rel=0.05)
    assert abs(np.mean(hist - 5)) < 4 * sigma / math.sqrt(3000)
    cut = pe.dp_histogram(real, pop, sigma, 2.0, SeededNoise(6), "k")
    np.testing.assert_allclose(cut, np.maximum(hist - 2 * sigma, 0))


def test_pe_every_draw_is_a_ledger_mechanism(data, monkeypatch):
    x, y, _, _ = data
    rec = RecordingNoise()
    monkeypatch.setattr(pe, "noise_and_sampler", lambda s: (rec, None))
    out = make_method("pe", **TINY["pe"]).fit(x, y, LABELS, 1.0, 1e-5)
    for key, sigma, _ in rec.draws:
        name = key.rsplit("/round-", 1)[0]
        assert out.ledger.get(name).sigma == sigma
    assert len(rec.draws) == 3 * TINY["pe"]["rounds"]


def test_pe_moves_towards_the_data():
    # One class on a small cap of the sphere: PE should approach it.
    rng = np.random.default_rng(7)
    centre = np.abs(rng.normal(size=16))
    x = centre + 0.05 * rng.normal(size=(3000, 16))
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    m = make_method("pe", rounds=6, population=100, output_per_class=500)
    out = m.fit(x, np.zeros(3000, int), [0], 8.0, 1e-5, seed=1, noise_seed=1)
    start = pe.random_api(500, 16, "halfnormal", np.random.default_rng(0))
    c = xn.mean(0) / np.linalg.norm(xn.mean(0))
    assert (out.x_syn @ c).mean() > (start @ c).mean() + 0.05


# ---------------------------------------------------------------- ClustMix

def test_clustmix_every_draw_is_a_ledger_mechanism(data, monkeypatch):
    from benchmarks.baselines import clustmix
    x, y, _, _ = data
    rec = RecordingNoise()
    monkeypatch.setattr(clustmix, "make_noise_source", lambda s: rec)
    out = make_method("clustmix", **TINY["clustmix"]).fit(
        x, y, LABELS, 2.0, 1e-5)
    names = {m.name for m in out.ledger.mechanisms}
    drawn = {key for key, _, _ in rec.draws}
    assert drawn == names  # every mechanism used, nothing unaccounted
    for key, sigma, _ in rec.draws:
        assert out.ledger.get(key).sigma == sigma
    stages = {m.stage for m in out.ledger.mechanisms}
    assert stages == {"tree", "lloyd", "centroids"}
    sums = [m for m in out.ledger.mechanisms if m.name.endswith("centroids/sum")]
    assert all(m.sensitivity == 1.0 for m in sums)  # clip norm R = 1


def test_clustmix_mix_stays_on_segments():
    from benchmarks.baselines import clustmix
    c = np.array([[1.0, 0.0], [0.0, 1.0]])
    out = clustmix.mix(np.array([1.0, 1.0]), c, 200, np.random.default_rng(0))
    assert np.allclose(np.linalg.norm(out, axis=1), 1.0)
    assert (out >= -1e-12).all()


# --------------------------------------------------------------------- PSG

def test_psg_accounting_per_class_matches_dp_accounting():
    cfg = psg.PSGConfig(iterations=20, inner_steps=5, sampling_rate=0.05)
    ledger = psg.plan_ledger([0, 1, 2], cfg, 4.0, 1e-5)
    assert ledger.partitions() == ["class=0", "class=1", "class=2"]
    m = ledger.get(psg.gradient_name(1))
    assert (m.count, m.sampling_probability) == (100, 0.05)
    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(
        0.05, dp_accounting.GaussianDpEvent(m.noise_multiplier)), 100)
    assert 0.98 * 4.0 <= acc.get_epsilon(1e-5) <= 4.0 * (1 + 1e-6)
    # Parallel composition: three classes cost what one does.
    assert ledger.spent_epsilon() == pytest.approx(acc.get_epsilon(1e-5),
                                                   rel=1e-6)


def test_psg_real_gradient_noise_has_the_ledger_sigma():
    rng = np.random.default_rng(8)
    cfg = psg.PSGConfig(sampling_rate=1.0, hidden=32)
    params = dpsgd.init_params(40, 32, 2, rng)
    rows = [rng.normal(size=(30, 40)), rng.normal(size=(20, 40))]
    sigma = 2.5
    g = psg.real_gradients(params, rows, [0, 1], cfg, sigma, SeededNoise(1),
                           rng, 0, ["a", "b"])
    clean = [dpsgd.clipped_gradient_sum(params, r, np.full(len(r), i), 1.0)[0]
             for i, r in enumerate(rows)]
    diff = np.concatenate([(g["w1"][i] - clean[i]["w1"]).ravel()
                           for i in range(2)])
    assert np.std(diff) == pytest.approx(sigma, rel=0.03)
