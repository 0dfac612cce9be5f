"""A mixture per class on the adaptive plan (issue 74, opt-in study).

Mechanisms ``class=<c>/components/sum`` (the [k, d] per-component sums of
the class's clipped rows by nearest public centre, L2 sensitivity R) and
``class=<c>/components/count`` (the [k] counts, L2 sensitivity 1): one
record is in one class and one component. The component count k_c and the
centres are public (noisy count, epsilon, d; the class's released mean and
covariance), and the pass's sigmas do not depend on k_c.
"""

import math

import numpy as np
import pytest

from dpsynth.dp_ops import clipping
from benchmarks.studies import components
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.noise import SeededNoise
from tests.conftest import gmm_data

R = 2.0


def test_neighbouring_component_aggregates_differ_by_the_sensitivity():
    rng = np.random.default_rng(3)
    d = 5
    base = np.abs(rng.normal(size=(120, d))) * -0.3
    canary = np.zeros((1, d))
    canary[0, 0] = 10.0  # clipped onto the sphere of radius R
    x, _ = clipping.preprocess(base, "none", R)
    xp, _ = clipping.preprocess(np.vstack([base, canary]), "none", R)
    centres = np.array([[-0.3] * d, [0.3] + [-0.3] * (d - 1), [0.0] * d])
    c0, s0 = components.exact_component_aggregates(x, centres, R)
    c1, s1 = components.exact_component_aggregates(xp, centres, R)
    assert np.linalg.norm(c1 - c0) == pytest.approx(1.0)
    assert np.linalg.norm(s1 - s0) <= R + 1e-12
    assert np.linalg.norm(s1 - s0) == pytest.approx(R, rel=1e-6)
    # one record changes one component only
    assert np.count_nonzero(np.abs(s1 - s0).sum(1)) == 1


def test_ledger_sensitivities_and_sigmas_do_not_depend_on_k():
    cfg = GeneratorConfig(labels=(0, 1), epsilon=4.0, clip_norm=R)
    mechs = {m.name: m for m in components.pass_mechanisms(cfg, 1.5, 0.25)}
    assert mechs["class=0/components/sum"].sensitivity == R
    assert mechs["class=0/components/count"].sensitivity == 1.0
    # the pass holds share of mu^2: sum 0.8 of it, count 0.2
    mu2 = sum((m.sensitivity / m.sigma) ** 2 for n, m in mechs.items()
              if n.startswith("class=0/"))
    assert mu2 == pytest.approx(0.25 * 1.5 ** 2)


def test_component_count_is_a_public_clipped_rule():
    k = components.ComponentConstants(c=4.0, kmax=8)
    assert components.component_count(10.0, 0.5, 384, k) == 1
    assert components.component_count(450.0, 1.0, 384, k) == 5
    assert components.component_count(1e6, 1.0, 384, k) == 8
    assert components.component_count(-5.0, 1.0, 384, k) == 1
    assert components.component_count(5.0, math.inf, 384, k) == 8


@pytest.mark.parametrize("epsilon,extra", [(1.0, {}), (8.0, {}),
                                           (8.0, {"proj": 2, "pool": True})])
def test_generate_stays_within_budget_and_lists_the_pass(epsilon, extra):
    x, y = gmm_data(1500, d=8, classes=3, spread=0.2)
    cfg = GeneratorConfig(labels=(0, 1, 2), epsilon=epsilon,
                          covariance="auto")
    mixes, xs, ys, ledger, _, ks = components.generate(
        x, y, cfg, SeededNoise(1), components.ComponentConstants(c=1.0, **extra))
    names = {m.name for m in ledger.mechanisms}
    for c in cfg.labels:
        assert f"class={c}/components/sum" in names
        assert f"class={c}/components/count" in names
    assert ledger.spent_epsilon() <= epsilon * (1 + 1e-9)
    assert len(xs) == len(ys) > 0
    for c, kc in zip(cfg.labels, ks):
        assert 1 <= kc <= 8
        assert mixes[c].means.shape[0] in (1, kc)
