"""The vote as a histogram the release samples from (issue 74).

Mechanism ``class=<c>/vote/histogram``: every record of class c votes for
its nearest candidate (public post-processing of the class mixture); the
histogram is dense over the candidates, so adding or removing one record
changes one bin by 1 (L2 sensitivity 1). The release draws the class's DP
row count from the candidates in proportion to the clipped noisy votes
(post-processing). In the adaptive plan (the default) the vote takes
``adaptive.vote_share`` of the per-class mu^2.
"""

import json
import math

import numpy as np
import pytest

from dpsynth.dp_ops import adaptive, generator, vote
from benchmarks import reference
from dpsynth.dp_ops.calibration import gdp_mu
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.ledger import PrivacyLedger, Mechanism
from dpsynth.dp_ops.noise import SeededNoise
from dpsynth.pipelines import cli
from dpsynth.pipelines.release.reading import load_release
from dpsynth.transforms import write
from tests.conftest import gmm_data

EPS, SEED = 4.0, 7


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    x, y = gmm_data(1800, d=12, classes=3, spread=0.2)
    path = tmp_path_factory.mktemp("vote") / "in.npz"
    np.savez(path, embeddings=x, labels=y)
    return x, y, str(path)


def _cfg(**kw):
    return GeneratorConfig(labels=(0, 1, 2), epsilon=EPS, vote_filter=True,
                           covariance="auto", **kw)


# ------------------------------------------------------------ accounting

@pytest.mark.parametrize("epsilon", [1.0, 2.0, 4.0, 8.0])
def test_the_vote_is_in_the_adaptive_ledger_within_budget(data, epsilon):
    x, y, _ = data
    cfg = GeneratorConfig(labels=(0, 1, 2), epsilon=epsilon,
                          vote_filter=True, covariance="auto")
    *_, ledger, structure = reference.generate_adaptive(x, y, cfg,
                                                        SeededNoise(1))
    votes = {m.name: m for m in ledger.mechanisms if "/vote/" in m.name}
    assert set(votes) == {f"class={c}/vote/histogram" for c in cfg.labels}
    mu = adaptive.calibrate_mu(cfg, x.shape[1])
    for m in votes.values():
        assert m.sensitivity == 1.0
        assert m.sigma == pytest.approx(1 / adaptive.vote_mu(cfg, mu))
    # the vote holds vote_share of each class's total mu^2 (GDP)
    per_class = {}
    for m in ledger.mechanisms:
        per_class.setdefault(m.partition, 0.0)
        per_class[m.partition] += (m.sensitivity / m.sigma) ** 2
    glob = per_class.pop("global")
    share = 1 / votes["class=0/vote/histogram"].sigma ** 2 / (
        per_class["class=0"] + glob)
    assert share == pytest.approx(adaptive.vote_share(cfg), rel=1e-6)
    assert ledger.spent_epsilon() <= epsilon * (1 + 1e-9)
    # and it costs: the plan's mu is below the one without a vote
    assert mu < adaptive.calibrate_mu(
        GeneratorConfig(labels=(0, 1, 2), epsilon=epsilon), x.shape[1])


def test_the_reservation_includes_the_vote():
    cfg = _cfg()
    mu = adaptive.calibrate_mu(cfg, 12)
    names = {m.name for m in adaptive.reserved_mechanisms(cfg, mu)}
    assert {f"class={c}/vote/histogram" for c in cfg.labels} <= names


def test_vote_share_is_a_public_constant_or_the_flag():
    for eps in (0.5, 1, 2, 4, 8, 100):
        share = adaptive.vote_share(GeneratorConfig(
            labels=(0,), epsilon=eps, vote_filter=True))
        assert 0 < share < 1
    assert adaptive.vote_share(GeneratorConfig(labels=(0,))) == 0.0
    assert adaptive.vote_share(_cfg(vote_share=0.3)) == 0.3
    with pytest.raises(ValueError, match="--vote-share"):
        _cfg(vote_share=1.0)


# ------------------------------------------------ neighbouring datasets

@pytest.mark.parametrize("worst", ["far", "on-candidate", "duplicate"])
def test_one_record_moves_one_bin_by_one(worst):
    """Add/remove one record (worst cases: far from every candidate, on a
    candidate, a copy of an existing row): the dense histograms of D and
    D' differ in exactly one bin, by 1 (L2 distance 1 = the ledger's
    sensitivity)."""
    rng = np.random.default_rng(3)
    cands = rng.normal(size=(300, 8)) * 0.3
    x = rng.normal(size=(200, 8)) * 0.3
    extra = {"far": np.full((1, 8), 1e3), "on-candidate": cands[17:18],
             "duplicate": x[5:6]}[worst]
    a = vote.block_votes(x, cands)
    b = vote.block_votes(np.vstack([x, extra]), cands)
    diff = b - a
    assert np.count_nonzero(diff) == 1 and diff.sum() == 1
    assert np.linalg.norm(diff) == 1.0


def test_vote_noise_has_the_ledger_sigma():
    """Empirical sigma of the released histogram minus the exact one, over
    many keyed runs, against the ledger's sigma."""
    cfg = _cfg()
    mu = adaptive.calibrate_mu(cfg, 12)
    ledger = PrivacyLedger(cfg.epsilon, cfg.delta)
    for m in adaptive.vote_mechanisms(cfg, mu):
        ledger.register(m)
    sigma = ledger.get("class=0/vote/histogram").sigma
    exact = np.arange(400, dtype=float) % 5
    draws = np.concatenate([
        generator.noisy_votes(exact, 0, ledger, SeededNoise(s)) - exact
        for s in range(50)])
    assert np.std(draws) == pytest.approx(sigma, rel=0.03)
    assert abs(np.mean(draws)) < 4 * sigma / math.sqrt(len(draws))


# ------------------------------------------------------ post-processing

@pytest.mark.parametrize("scale", [0.0, 1.0, 1e3])
def test_the_release_keeps_the_row_count(scale):
    """Whatever the noise (none, some, swamping), the class writes the
    rows asked for: the vote never shrinks the release."""
    rng = np.random.default_rng(0)
    votes = rng.poisson(0.5, size=600) + scale * rng.normal(size=600)
    copies = vote.resample_copies(votes, 250, np.random.default_rng(1))
    assert copies.sum() == 250 and (copies >= 0).all()


def test_selection_follows_the_clipped_votes():
    noisy = np.array([-3.0, 0.0, 1.0, 3.0])
    np.testing.assert_allclose(vote.selection_weights(noisy),
                               [0, 0, 0.25, 0.75])
    np.testing.assert_allclose(vote.selection_weights(-np.ones(4)),
                               np.full(4, 0.25))  # all swamped: the mixture
    copies = vote.resample_copies(noisy, 40_000, np.random.default_rng(2))
    assert copies[:2].sum() == 0
    assert copies[3] / copies[2] == pytest.approx(3, rel=0.05)


def test_the_legacy_threshold_is_opt_in():
    cfg = GeneratorConfig(labels=(0,), vote_filter=True)
    assert cfg.vote_threshold is None
    ledger = PrivacyLedger(1.0, 1e-5)
    ledger.register(Mechanism("class=0/vote/histogram", "vote", "class=0",
                              1.0, 0.0))
    votes = np.array([0.0, 7.0, 6.0, 1.0])
    copies = generator.vote_copies(votes, 0, 10, cfg, ledger, SeededNoise(0))
    assert copies.sum() == 10 and copies[[0, 3]].sum() <= 10
    legacy = GeneratorConfig(labels=(0,), vote_filter=True,
                             vote_threshold=6.0)
    kept = generator.vote_copies(votes, 0, 10, legacy, ledger,
                                 SeededNoise(0))
    assert kept.tolist() == [0, 1, 1, 0]


def test_voted_shards_split_the_written_rows():
    copies = np.zeros(1000, np.int64)
    copies[::3] = np.arange(334) % 4  # 0..3 copies
    tasks = list(write.shard_tasks((2, write.KeptRows(1000, copies)), 100))
    written = [int(t[2][3].sum()) for t in tasks]
    assert sum(written) == copies.sum()
    assert max(written) <= 100 + 3  # whole candidates per shard
    starts = [t[2][0] for t in tasks]
    assert starts == sorted(starts)


# ---------------------------------------------------------- Beam == numpy

def test_beam_release_equals_reference(tmp_path, data):
    """`dpsynth generate --vote-filter` (the adaptive plan with the vote):
    the rows of every class and the ledger are the reference's."""
    x, y, path = data
    out = tmp_path / "rel"
    assert cli.main(["generate", "--input", path, "--output", str(out),
                     "--num-classes", "3", "--epsilon", str(EPS),
                     "--noise-seed", str(SEED), "--block-size", "400",
                     "--rows-per-shard", "150", "--vote-filter",
                     "--vote-share", str(adaptive.VOTE_SHARE)]) == 0
    mixes, xs, ys, ledger, _ = reference.generate_adaptive(
        x, y, _cfg(vote_share=adaptive.VOTE_SHARE), SeededNoise(SEED))
    xr, yr, _ = load_release(str(out))
    for c in (0, 1, 2):
        assert (yr == c).sum() == (ys == c).sum() == \
            generator.num_samples(mixes[c], _cfg(vote_share=0.05))
        got = np.asarray(xr[yr == c], np.float32)
        want = np.asarray(xs[ys == c], np.float32)
        order = lambda a: a[np.lexsort(a.T[::-1])]  # noqa: E731
        np.testing.assert_array_equal(order(got), order(want))
    manifest = json.loads((out / "_manifest.json").read_text())
    mechs = {m["name"]: m for m in manifest["privacy"]["mechanisms"]}
    assert set(mechs) == {m.name for m in ledger.mechanisms}
    for m in ledger.mechanisms:
        assert mechs[m.name]["sigma"] == pytest.approx(m.sigma)
    assert manifest["privacy"]["spent"]["epsilon"] <= EPS
    shares = manifest["adaptive_plan"]["shares_of_mu2"]
    assert shares["vote"] == adaptive.VOTE_SHARE
    assert sum(shares.values()) == pytest.approx(1.0)


# ------------------------------------------------------ the signal rule

GRID = [0.5, 1.0, 2.0, 4.0, 8.0, 32.0, 128.0, 512.0, 1000.0]


def test_the_vote_runs_only_where_its_histogram_can_carry_signal():
    """A candidate expects 1 / vote_oversample votes; the vote runs when
    that reaches VOTE_MIN_SNR noise sigmas. A public function of (epsilon,
    delta, d, the plan): skipped at every epsilon the issue measured,
    running at very large epsilon, and monotone in epsilon."""
    ran = []
    for eps in GRID:
        cfg = GeneratorConfig(labels=(0, 1, 2), epsilon=eps,
                              vote_filter=True, covariance="auto")
        out, note = adaptive.resolve_vote(cfg, 12)
        assert note["sigma"] == pytest.approx(
            1 / adaptive.vote_mu(cfg, adaptive.calibrate_mu(cfg, 12)))
        assert note["ran"] == (note["votes_per_candidate"]
                               >= adaptive.VOTE_MIN_SNR * note["sigma"])
        assert out.vote_filter == note["ran"]
        assert out == (cfg if note["ran"] else
                       GeneratorConfig(labels=(0, 1, 2), epsilon=eps,
                                       covariance="auto"))
        ran.append(note["ran"])
    assert ran[:5] == [False] * 5 and ran[-1]
    assert ran == sorted(ran)  # once it runs, it runs at every larger eps


@pytest.mark.parametrize("kw", [dict(vote_share=0.05),
                                dict(vote_threshold=6.0),
                                dict(epsilon=math.inf),
                                dict(vote_filter=False)])
def test_what_the_user_asked_explicitly_is_not_gated(kw):
    cfg = GeneratorConfig(**{**dict(labels=(0, 1, 2), epsilon=EPS,
                                    vote_filter=True, covariance="auto"),
                             **kw})
    assert adaptive.resolve_vote(cfg, 12) == (cfg, None)


def test_a_skipped_vote_releases_the_plain_release(tmp_path, data, capsys):
    """`--vote-filter` where the vote cannot pay: the rows are the default
    release's, byte for byte; no vote mechanism is charged; the manifest
    and the console say why."""
    _, _, path = data
    flags = ["--input", path, "--num-classes", "3", "--epsilon", str(EPS),
             "--noise-seed", str(SEED), "--block-size", "400",
             "--rows-per-shard", "150"]
    plain, voted = tmp_path / "plain", tmp_path / "voted"
    assert cli.main(["generate", *flags, "--output", str(plain)]) == 0
    capsys.readouterr()
    assert cli.main(["generate", *flags, "--output", str(voted),
                     "--vote-filter"]) == 0
    assert "--vote-filter: skipped" in capsys.readouterr().err
    xp, yp, _ = load_release(str(plain))
    xv, yv, _ = load_release(str(voted))
    np.testing.assert_array_equal(xp, xv)
    np.testing.assert_array_equal(yp, yv)
    manifest = json.loads((voted / "_manifest.json").read_text())
    assert not any("/vote/" in m["name"]
                   for m in manifest["privacy"]["mechanisms"])
    rule = manifest["adaptive_plan"]["vote_rule"]
    assert rule["asked"] and not rule["ran"]
    assert rule["votes_per_candidate"] < rule["sigma"]
    assert manifest["privacy"] == json.loads(
        (plain / "_manifest.json").read_text())["privacy"]


def test_the_plan_says_whether_the_vote_runs(data, capsys):
    _, _, path = data
    for eps, verdict in (("4", "vote: skipped"), ("1000", "vote: runs")):
        assert cli.main(["generate", "--plan-only", "--input", path,
                         "--num-classes", "3", "--epsilon", eps,
                         "--vote-filter"]) == 0
        out = capsys.readouterr().out
        assert verdict in out
        assert ("stage vote" in out) == (verdict == "vote: runs")
