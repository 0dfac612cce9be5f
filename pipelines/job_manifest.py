"""The staged release's manifest: public configuration and DP outputs
only (the privacy ledger, the adaptive plan, the class summary, the
warnings about weak settings); ``graph.stage`` writes it into staging."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from dpsynth.dp_ops import adaptive, plan
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.ledger import PrivacyLedger
from dpsynth.pipelines.job_plan import Job
from dpsynth.pipelines.release import release
from dpsynth.pipelines.spec import GenerateSpec
from dpsynth.transforms.write import describe_outputs


def _budget_manifest(job: Job, spec: GenerateSpec) -> Optional[dict]:
    """Public configuration of the lifetime budget: the store, the dataset
    id and the cap this run was checked against. (What earlier runs and
    attempts spent is not released: how many attempts a run needed may
    depend on the data, e.g. one that ran out of memory.)"""
    if spec.budget.store is None:
        return None
    return {"store": spec.budget.store, "dataset_id": spec.budget.dataset_id,
            "lifetime_cap": job.lifetime_cap}


def pipelinedp_document(job: Job) -> Optional[dict]:
    """Which aggregations ran through PipelineDP, with its own explanation
    (public configuration and the ledger's sigmas)."""
    if not job.pipelinedp_explain:
        return None
    import pipeline_dp
    return {"version": pipeline_dp.__version__,
            "explain_computation": job.pipelinedp_explain}


SEEDED_WARNING = (
    "NOT PRIVATE: the noise came from the secret --noise-seed, for tests and "
    "audits. Anyone holding releases made with the same seed on neighbouring "
    "data can cancel the noise. Never share this release.")


NOISE_DESCRIPTION = (
    "{kind}: exact discrete Gaussian on each aggregate's fixed-point lattice "
    "(Canonne-Kamath-Steinke), drawn from an AES-256-CTR keystream under "
    "{key} (never recorded), so re-executed steps redraw nothing")


def manifest(job: Job, spec: GenerateSpec, dim: int,
             summary: list) -> dict:
    """The release's manifest: public configuration and DP outputs only.

    Not in it: the matched input file names (one file per person would
    reveal membership; they go to the operator's console with --verbose),
    wall times (they grow with n), how many attempts the run took.
    ``created_utc`` is taken before any data is read.
    """
    cfg = job.cfg
    warnings = []
    if cfg.noiseless:
        warnings.append("NOT PRIVATE: epsilon=inf: NO NOISE WAS ADDED. This "
                        "release is NOT differentially private. Never share "
                        "it.")
    elif spec.generator.noise_seed is not None:
        warnings.append(SEEDED_WARNING)
    if not cfg.noiseless:
        warnings += weak_setting_warnings(cfg, summary, job.ledger)
    config = config_document(cfg)
    plan_doc = None if job.structure is None else job.structure.to_manifest()
    if plan_doc is not None and cfg.vote_filter:  # shares of the total mu^2
        v = adaptive.vote_share(cfg)
        plan_doc["shares_of_mu2"] = {
            **{k: w * (1 - v) for k, w in plan_doc["shares_of_mu2"].items()},
            "vote": v}
    if plan_doc is not None and job.vote_note is not None:
        plan_doc["vote_rule"] = job.vote_note
    noise = (NOISE_DESCRIPTION.format(kind="seeded",
                                      key="a key from the secret --noise-seed")
             if spec.generator.noise_seed is not None else
             NOISE_DESCRIPTION.format(kind="secure",
                                      key="a per-run key from os.urandom"))
    return {
        "format": "dpsynth-release/3",
        "run_id": job.run_id,
        "root": job.version,
        "created_utc": job.created_utc,
        "privacy": job.ledger.to_manifest(),
        "pipelinedp": pipelinedp_document(job),
        "adaptive_plan": plan_doc,
        "noise": "none (epsilon=inf)" if cfg.noiseless else noise,
        # False: no noise, or noise from a secret seed (reusing it on
        # neighbouring data cancels the noise): not differentially private.
        "private": not cfg.noiseless and spec.generator.noise_seed is None,
        "config": config,
        "input": {"pattern": job.spec.pattern, "format": job.spec.fmt,
                  "non_finite": job.spec.non_finite},
        "embedding_dim": dim,
        "classes": summary,
        "samples_total": sum(c["samples"] for c in summary),
        "outputs": describe_outputs(cfg, dim, summary,
                                    job.spec.embedding_feature,
                                    job.spec.label_feature,
                                    plan_doc and plan_doc["mode"]),
        "lifetime_budget": _budget_manifest(job, spec),
        "versions": release.versions(),
        "warnings": warnings,
    }


# A class whose noisy count is below this many rows (or 3 noise sigmas)
# tells the user little; above this share of a typical class, the count
# noise dominates the release.
FEW_ROWS = 10


NOISY_SHARE = 0.1  # "a tenth" in the warning's words


def weak_setting_warnings(cfg: GeneratorConfig, summary: list,
                          ledger: PrivacyLedger) -> list[str]:
    """Warnings about weak or risky settings, from DP outputs (the noisy
    class counts) and public configuration (the calibrated sigmas) only,
    so they may go into the manifest and the console."""
    out = []
    counts = [c["noisy_count"] for c in summary]
    names = [plan.class_count_name(ledger, c["label"]) for c in summary]
    sigmas = [ledger.get(n).sigma if n in ledger else None for n in names]
    for c, s in zip(summary, sigmas):
        floor = max(FEW_ROWS, 3 * s) if s else FEW_ROWS
        if c["noisy_count"] < floor:
            why = (f"within three noise sigmas ({s:.1f}) of zero" if s and
                   3 * s > FEW_ROWS else f"below {FEW_ROWS} rows")
            out.append(
                f"class {c['label']}: noisy count {c['noisy_count']:.1f} is "
                f"{why}: its {c['samples']} synthetic rows carry little or no "
                "signal (merge rare classes, or raise --epsilon)")
    known = [s for s in sigmas if s]
    if counts and known:
        typical = float(sorted(counts)[len(counts) // 2])
        noise = float(sorted(known)[len(known) // 2])
        # A typical noisy count at or below zero: noise is all there is.
        if noise > NOISY_SHARE * max(typical, 0.0):
            out.append(
                f"epsilon={cfg.epsilon:g} is low for these class sizes: the "
                f"noise on a class count (sigma {noise:.1f}) is over "
                f"a tenth of a typical noisy class size "
                f"({typical:.0f}), and the means and covariances are noisier "
                "still; expect a release close to noise (raise --epsilon or "
                "use fewer classes)")
    noisy_n = sum(max(c, 0.0) for c in counts)
    if noisy_n > 0 and cfg.delta > 1.0 / noisy_n:
        suggest = 10 ** math.floor(math.log10(0.1 / noisy_n))
        out.append(f"delta={cfg.delta:g} is not far below 1/n for the noisy "
                   f"record count n~{noisy_n:.0f}: a release may then expose "
                   f"a few records outright with probability ~delta*n; pass "
                   f"--delta {suggest:g} or smaller")
    return out


def config_document(cfg: GeneratorConfig) -> dict:
    """The manifest's ``config``: the generator configuration as JSON."""
    config = dataclasses.asdict(cfg)
    config["labels"] = list(cfg.labels)
    return config
