"""Adaptive two-phase generator plan: pure functions.

Why adaptive: no fixed covariance model wins on every dataset. A per-class
covariance pays off for large classes at moderate epsilon and loses on
small ones; the split of the budget between class means and covariance
should follow how noisy each is. Class sizes are private, so the plan
spends a small first budget on noisy class counts and derives everything
else from public inputs and those DP counts.

Phase 1 (read with the DP centre, one pass): per class, the noisy row count
(``class=<c>/count``, sensitivity 1); globally the DP centre
(``global/centre/sum``, sensitivity B = 1 for unit rows, and
``global/centre/count``, sensitivity 1). Its share of the budget is fixed.

Rule (``choose_structure``): a documented, public function of (epsilon,
delta, d, the noisy counts) and this module's constants; it fixes the
structure of phase 2 (see ``Structure``). Nothing in it reads private data.

Phase 2 (one pass over the centred, clipped rows given the structure):
exact per-class sums and per-class d x d second moments (the shared second
moment is their sum, computed before any noise). Mechanisms, all Gaussian,
add/remove one record, clip radius R, by mode (``Structure``):

- every mode: ``class=<c>/moments/sum``, the sum of the class's clipped
  rows, sensitivity R.
- "shared" and "subspace": ``global/covariance/second-moment``,
  sum_i x_i x_i^T over all rows, released as its isometric upper triangle
  (covariance.upper), sensitivity ||x x^T||_F = ||x||^2 <= R^2.
- "subspace" (rank r): ``class=<c>/covariance/subspace``,
  P^T (sum_{i in c} x_i x_i^T) P for the [d, r] orthonormal basis P of the
  top-r eigenvectors of the *noisy* shared within-class covariance
  (post-processing of the previous mechanism, so P is public by then);
  sensitivity ||P^T x||^2 <= ||x||^2 <= R^2 (isometric upper triangle).
- "per-class": ``class=<c>/covariance/second-moment``, the class's d x d
  second moment (isometric upper triangle), sensitivity R^2, and no
  global matrix (the ``--covariance per-class`` mechanism).

Accounting: every mechanism is Gaussian, so one class (with the global
mechanisms) is mu-GDP with mu^2 = sum 1/z_i^2. Phase 1 takes the fixed
share PHASE1 of mu^2; phase 2 gets the rest, whatever the rule picks
(fully adaptive composition of Gaussian mechanisms with a fixed total
mu^2 is mu-GDP: Smith & Thakurta 2022, "Fully adaptive composition for
Gaussian differential privacy"). ``calibrate_mu`` additionally certifies
with dp_accounting that EVERY structure the rule can return (``menu``)
meets (epsilon, delta), shrinking mu until all do; the ledger lists
exactly the mechanisms that ran (phase 1 + the chosen phase 2).

Post-processing (free): class means from noisy sums and counts; the shared
within-class covariance W from the global matrix; in the subspace mode,
per class, the top-r block of W is replaced by the class's own DP block
(a hierarchy: per-class inside the subspace, shared outside), repaired to
be positive semi-definite; in the per-class mode each class's factors come
from its own released matrix alone ("spiked": its eigenvalues above its
mechanism's noise edge, debiased, and a flat bulk, ``spiked_within``; or
"raw", as released), on the worker that released it
(``per_class_mixture``). Every class is released as factors [d, r'] + a
diagonal, so sampling stays two matrix products. Post-processings measured
and not adopted (pooling the class matrices, "spectral" / "shrunk", and
the subspace blocks' "spectral") are study code
(benchmarks/studies/class_deviations.py): they hand their matrices to
``within_mixture``, the per-class mode's last step.

The package: ``rule`` (the structure from public inputs and the noisy
counts), ``ledgers`` (the mechanisms: slots, mu, the two phases' ledgers,
the noisy aggregates) and ``postprocess`` (noisy moments to covariances
and class Gaussians); this module exposes their names as ``adaptive.X``.
How the rule's constants were fitted: docs/method.md, "The rule's
constants".
"""

from dpsynth.dp_ops.adaptive.ledgers import (
    add_phase2, block_class_sum, calibrate_mu, class_matrix_name,
    count_name, exact_class_counts, mechanisms, noisy_class_block,
    noisy_class_second_moments, noisy_class_sums, noisy_counts,
    phase1_ledger, phase1_slots, phase2_slots, projected_block_moment,
    reserved_mechanisms, resolve_vote, shared_stage, sum_name, VOTE_MIN_SNR,
    VOTE_SHARE, vote_gated, vote_mechanisms, vote_mu, vote_share,
    vote_signal, vote_slots)
from dpsynth.dp_ops.adaptive.postprocess import (
    SharedModel, class_block, class_factors, class_means, class_within,
    eigen, noise_edge, per_class_mixture, shared_mixtures, shared_model,
    shared_within, spike_shrink, spiked_within, variance_floor,
    within_mixture)
from dpsynth.dp_ops.adaptive.rule import (
    CENTRE_SPLIT, CLASS_DEVIATIONS, MODES, PHASE1,
    RuleConstants, Structure, TWO_PHASE, applies, choose_mode,
    choose_structure, class_signal, constants_for, make_structure, menu,
    spiked_band, sum_grid, sum_share_rule, two_phase, typical_count)

__all__ = [
    "add_phase2", "applies", "block_class_sum", "calibrate_mu",
    "CENTRE_SPLIT", "choose_mode", "choose_structure", "class_block",
    "CLASS_DEVIATIONS", "class_factors", "class_matrix_name",
    "class_means", "class_signal", "class_within", "constants_for",
    "count_name", "eigen", "exact_class_counts", "make_structure",
    "mechanisms", "menu", "MODES", "noise_edge",
    "noisy_class_block", "noisy_class_second_moments", "noisy_class_sums",
    "noisy_counts", "per_class_mixture", "PHASE1",
    "phase1_ledger", "phase1_slots", "phase2_slots",
    "projected_block_moment", "reserved_mechanisms", "resolve_vote",
    "RuleConstants",
    "shared_mixtures", "shared_model", "shared_stage", "shared_within",
    "SharedModel", "spike_shrink", "spiked_band", "spiked_within", "Structure", "sum_grid", "sum_name",
    "sum_share_rule", "TWO_PHASE", "two_phase", "typical_count",
    "variance_floor", "VOTE_MIN_SNR", "VOTE_SHARE", "vote_gated",
    "vote_mechanisms", "vote_mu", "vote_share", "vote_signal", "vote_slots",
    "within_mixture",
]
