"""The list of mechanisms a run will apply, fixed before any data is read."""

from __future__ import annotations

from dp_ops.calibration import Slot, calibrate
from dp_ops.config import GeneratorConfig
from dp_ops.ledger import GLOBAL, PrivacyLedger

# Relative shares inside a stage (per application of each mechanism).
TREE_LEAF_SUM_SHARE = 0.5  # the level counts share the other half
LLOYD_SHARES = {"count": 0.3, "sum": 0.7}
MOMENT_SHARES = {"count": 0.2, "sum": 0.4, "sumsq": 0.4}


def partition(label: int) -> str:
    return f"class={label}"


def name(label: int, *parts: object) -> str:
    return "/".join([partition(label), *map(str, parts)])


def class_slots(cfg: GeneratorConfig, label: int) -> list[Slot]:
    """Mechanisms that read the records of one class.

    Sensitivities (add/remove one record, which lands in exactly one node per
    tree level, one leaf, one cluster per round): counts 1; sums of clipped
    vectors R; sums of squares R^2 (||x*x||_2 <= ||x||_2^2 <= R^2).
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
    slots += [Slot(name(label, "moments", "count"), "moments", p, 1.0,
                   share=MOMENT_SHARES["count"]),
              Slot(name(label, "moments", "sum"), "moments", p, r,
                   share=MOMENT_SHARES["sum"]),
              Slot(name(label, "moments", "sumsq"), "moments", p, r * r,
                   share=MOMENT_SHARES["sumsq"])]
    if cfg.vote_filter:
        slots.append(Slot(name(label, "vote", "histogram"), "vote", p, 1.0))
    return slots


COVARIANCE = "global/covariance/second-moment"


def global_slots(cfg: GeneratorConfig) -> list[Slot]:
    """Mechanisms over all records (every class composes with them).

    The second-moment matrix sum_i x_i x_i^T (upper triangle): adding or
    removing one record changes it by x x^T, Frobenius norm ||x||^2 <= R^2.
    """
    if not cfg.covariance_rank:
        return []
    return [Slot(COVARIANCE, "covariance", GLOBAL, cfg.clip_norm ** 2)]


def plan_slots(cfg: GeneratorConfig) -> list[Slot]:
    return ([s for label in cfg.labels for s in class_slots(cfg, label)]
            + global_slots(cfg))


def make_ledger(cfg: GeneratorConfig) -> PrivacyLedger:
    """Calibrates every mechanism of the run; refuses impossible targets."""
    return calibrate(plan_slots(cfg), cfg.weights(), cfg.epsilon, cfg.delta,
                     cfg.accountant)
