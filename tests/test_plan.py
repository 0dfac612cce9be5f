import pytest

from dpsynth.dp_ops import plan
from dpsynth.dp_ops.config import GeneratorConfig


def _class_sensitivities(cfg: GeneratorConfig) -> dict:
    return {m.name.split("/", 1)[1]: m.sensitivity
            for m in plan.make_ledger(cfg).mechanisms
            if m.partition == "class=0"}


def test_sensitivities_follow_the_clip_norm():
    cfg = GeneratorConfig(labels=(0, 1), clip_norm=3.0, vote_filter=True,
                          clusters=4, lloyd_rounds=1, covariance_rank=0)
    ledger = plan.make_ledger(cfg)
    sens = _class_sensitivities(cfg)
    assert sens["tree/level-1/count"] == 1
    assert sens["tree/leaf-sum"] == 3.0
    assert sens["lloyd/round-1/sum"] == 3.0
    assert sens["moments/count"] == 1
    assert sens["moments/sum"] == 3.0
    assert sens["moments/sumsq"] == 9.0
    assert sens["vote/histogram"] == 1
    assert all(m.neighbouring == "add/remove one record"
               for m in ledger.mechanisms)


def test_every_class_gets_identical_noise():
    cfg = GeneratorConfig(labels=(3, 7, 9))
    ledger = plan.make_ledger(cfg)
    by_class = {}
    for m in ledger.mechanisms:
        if m.partition == "global":
            continue
        by_class.setdefault(m.partition, []).append(
            (m.name.split("/", 1)[1], m.sigma))
    assert len({tuple(v) for v in by_class.values()}) == 1


def test_tree_has_one_count_mechanism_per_level():
    cfg = GeneratorConfig(labels=(0,), clusters=4, tree_depth=5)
    names = [m.name for m in plan.make_ledger(cfg).mechanisms]
    assert sum("/count" in n and "tree" in n for n in names) == 5


@pytest.mark.parametrize("kwargs", [dict(labels=()), dict(labels=(1, 1)),
                                    dict(clusters=0), dict(clip_norm=0),
                                    dict(clip_norm=-2), dict(tree_depth=0),
                                    dict(epsilon=0), dict(delta=1.5),
                                    dict(normalize="zscore"),
                                    dict(covariance="full")])
def test_bad_config_refused(kwargs):
    with pytest.raises(ValueError):
        GeneratorConfig(**{"labels": (0,), **kwargs})


def test_covariance_is_one_global_mechanism_with_sensitivity_r_squared():
    cfg = GeneratorConfig(labels=(0, 1), clip_norm=2.0, covariance_rank=8,
                          covariance="shared", center=False)
    glob = [m for m in plan.make_ledger(cfg).mechanisms
            if m.partition == "global"]
    assert [(m.stage, m.sensitivity) for m in glob] == [("covariance", 4.0)]
    off = GeneratorConfig(labels=(0, 1), covariance_rank=0, center=False)
    assert all(m.partition != "global" for m in plan.make_ledger(off).mechanisms)


def test_per_class_covariance_is_one_mechanism_per_class():
    cfg = GeneratorConfig(labels=(0, 1), clip_norm=2.0, covariance_rank=8,
                          covariance="per-class", center=False)
    ledger = plan.make_ledger(cfg)
    assert all(m.partition != "global" for m in ledger.mechanisms)
    for label in (0, 1):
        m = ledger.get(plan.class_covariance(label))
        assert (m.stage, m.partition, m.sensitivity) == (
            "covariance", f"class={label}", 4.0)
    # the diagonal comes from the matrix: no sum of squares is released
    assert "moments/sumsq" not in _class_sensitivities(cfg)


def test_centre_is_two_global_mechanisms():
    unit = GeneratorConfig(labels=(0, 1), clip_norm=0.5, center=True)
    ledger = plan.make_ledger(unit)
    assert ledger.get(plan.CENTRE_SUM).sensitivity == 1.0  # unit rows
    assert ledger.get(plan.CENTRE_COUNT).sensitivity == 1.0
    assert {ledger.get(n).partition for n in
            (plan.CENTRE_SUM, plan.CENTRE_COUNT)} == {"global"}
    raw = GeneratorConfig(labels=(0,), clip_norm=3.0, normalize="none")
    assert plan.make_ledger(raw).get(plan.CENTRE_SUM).sensitivity == 3.0
    off = GeneratorConfig(labels=(0,), center=False)
    assert plan.CENTRE_SUM not in plan.make_ledger(off)
