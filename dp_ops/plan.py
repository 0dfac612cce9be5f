"""The list of mechanisms a run will apply, fixed before any data is read."""

from __future__ import annotations

from dpsynth.dp_ops.calibration import Slot, calibrate
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.ledger import GLOBAL, PrivacyLedger

# Relative shares inside a stage (per application of each mechanism).
TREE_LEAF_SUM_SHARE = 0.5  # the level counts share the other half
LLOYD_SHARES = {"count": 0.3, "sum": 0.7}
MOMENT_SHARES = {"count": 0.2, "sum": 0.4, "sumsq": 0.4}
# With covariance factors the diagonal comes from the second-moment matrix,
# so there is no sum of squares and the means get most of the stage.
MOMENT_SHARES_WITH_COVARIANCE = {"count": 0.05, "sum": 0.95}


def moment_fields(cfg: GeneratorConfig) -> tuple[str, ...]:
    return tuple(moment_shares(cfg))


def moment_shares(cfg: GeneratorConfig) -> dict[str, float]:
    return MOMENT_SHARES_WITH_COVARIANCE if cfg.covariance_rank else MOMENT_SHARES


def partition(label: int) -> str:
    return f"class={label}"


def name(label: int, *parts: object) -> str:
    return "/".join([partition(label), *map(str, parts)])


def class_count_name(ledger: PrivacyLedger, label: int) -> str:
    """The class's noisy-count mechanism: ``class=<c>/count`` in the
    adaptive plan (phase 1), ``class=<c>/moments/count`` in the fixed ones."""
    adaptive_name = name(label, "count")
    return (adaptive_name if adaptive_name in ledger
            else name(label, "moments", "count"))


def class_slots(cfg: GeneratorConfig, label: int) -> list[Slot]:
    """Mechanisms that read the records of one class.

    Sensitivities (add/remove one record, which lands in exactly one node per
    tree level, one leaf, one cluster per round): counts 1; sums of clipped
    vectors R; sums of squares R^2 (||x*x||_2 <= ||x||_2^2 <= R^2); the
    class's second-moment matrix ("per-class" covariance) R^2 (x x^T has
    Frobenius norm ||x||^2, see covariance.py).
    """
    r, p, d = cfg.clip_norm, partition(label), cfg.tree_depth
    slots = []
    if "tree" in cfg.stages:
        slots += [Slot(name(label, "tree", f"level-{lvl}", "count"), "tree", p,
                       1.0, share=(1 - TREE_LEAF_SUM_SHARE) / d)
                  for lvl in range(1, d + 1)]
        slots.append(Slot(name(label, "tree", "leaf-sum"), "tree", p, r,
                          share=TREE_LEAF_SUM_SHARE))
    for rnd in range(1, cfg.lloyd_rounds + 1 if "lloyd" in cfg.stages else 1):
        slots.append(Slot(name(label, "lloyd", f"round-{rnd}", "count"),
                          "lloyd", p, 1.0, share=LLOYD_SHARES["count"]))
        slots.append(Slot(name(label, "lloyd", f"round-{rnd}", "sum"),
                          "lloyd", p, r, share=LLOYD_SHARES["sum"]))
    sens = {"count": 1.0, "sum": r, "sumsq": r * r}
    slots += [Slot(name(label, "moments", f), "moments", p, sens[f], share=s)
              for f, s in moment_shares(cfg).items()]
    if cfg.covariance_rank and cfg.covariance == "per-class":
        slots.append(Slot(class_covariance(label), "covariance", p, r * r))
    if cfg.vote_filter:
        slots.append(Slot(name(label, "vote", "histogram"), "vote", p, 1.0))
    return slots


COVARIANCE = "global/covariance/second-moment"
CENTRE_SUM = "global/centre/sum"
CENTRE_COUNT = "global/centre/count"
CENTRE_SHARES = {"sum": 0.8, "count": 0.2}


def class_covariance(label: int) -> str:
    return name(label, "covariance", "second-moment")


def covariance_name(label: int, cfg: GeneratorConfig) -> str:
    """The mechanism whose matrix gives this class its factors."""
    return class_covariance(label) if cfg.covariance == "per-class" else COVARIANCE


def global_slots(cfg: GeneratorConfig) -> list[Slot]:
    """Mechanisms over all records (every class composes with them).

    The centre (``--center``): the sum of the normalised rows, each clipped
    to ``centre_bound`` B (sensitivity B), and the row count (sensitivity
    1). The shared second-moment matrix sum_i x_i x_i^T of the centred,
    clipped rows: adding or removing one record changes it by x x^T,
    Frobenius norm ||x||^2 <= R^2.
    """
    slots = []
    if cfg.center:
        slots += [Slot(CENTRE_SUM, "centre", GLOBAL, cfg.centre_bound,
                       share=CENTRE_SHARES["sum"]),
                  Slot(CENTRE_COUNT, "centre", GLOBAL, 1.0,
                       share=CENTRE_SHARES["count"])]
    if cfg.covariance_rank and cfg.covariance == "shared":
        slots.append(Slot(COVARIANCE, "covariance", GLOBAL, cfg.clip_norm ** 2))
    return slots


def plan_slots(cfg: GeneratorConfig) -> list[Slot]:
    return ([s for label in cfg.labels for s in class_slots(cfg, label)]
            + global_slots(cfg))


def make_ledger(cfg: GeneratorConfig) -> PrivacyLedger:
    """Calibrates every mechanism of the run; refuses impossible targets."""
    if cfg.covariance in ("auto", "subspace"):  # two phases: dp_ops.adaptive
        raise ValueError(f"covariance {cfg.covariance!r} is planned by "
                         "dpsynth.dp_ops.adaptive")
    return calibrate(plan_slots(cfg), cfg.weights(), cfg.epsilon, cfg.delta,
                     cfg.accountant)
