"""Smoke test of the privacy audit's Beam arm on the real default job.

A few `dpsynth generate` runs with the CLI defaults (every class of a run is
one trial: a few hundred trials in all) must run end to end, keep the lower
bounds below the claimed epsilon, find the canary without noise, and audit
exactly the job the CLI runs by default: if the defaults change, the audit
follows them; if the audit's job drifts from them, this fails.

The threshold attack's bound cannot reach 4 with 100 trials an arm (its
cap is ~3.5), so it proves the harness runs, not the claim; the claim is
checked by the noise-scale bound (the spread of every class's released
count and sum, ``audit.noise_bound``), which the negative control shows
can fail: the same harness on a job with 10x too little noise for
epsilon 4 exceeds 4 (measured: 2.7 on the right job, 200 classes).
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from benchmarks import privacy_audit
from dpsynth.dp_ops import adaptive
from dpsynth.dp_ops.config import GeneratorConfig, labels_from
from dpsynth.pipelines import cli, job_plan
from dpsynth.pipelines.cli import generate

CLASSES, RECORDS, DIM = 100, 40, 8


def cli_default_config(epsilon: float) -> dict:
    """What `dpsynth generate --num-classes N --epsilon E` runs, as JSON."""
    args, _ = cli.build_parser().parse_known_args(
        ["generate", "--num-classes", str(CLASSES), "--epsilon",
         "inf" if math.isinf(epsilon) else str(epsilon)])
    cfg = job_plan.resolve_config(generate.spec_from_args(args), tuple(
        labels_from(args.num_classes, args.labels)))
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def beam_row(epsilon: float, runs: int, seed: int) -> dict:
    [row] = privacy_audit.beam_arm([epsilon], runs, 1, CLASSES, RECORDS,
                                   DIM, alpha=0.05, seed=seed)
    return row


def assert_default_job(row: dict, epsilon: float) -> None:
    manifest = row["manifest"]
    assert manifest["config"] == cli_default_config(epsilon)
    cfg = GeneratorConfig(**dict(manifest["config"],
                                 labels=tuple(manifest["config"]["labels"])))
    # the default job runs the adaptive plan whenever the defaults ask for it
    assert (manifest["adaptive_plan"] is not None) == adaptive.applies(cfg)


# sigma 10x smaller than epsilon 4's: mu-GDP at 10 x mu(4, 1e-5) is
# (81.4, 1e-5)-DP (audit.gaussian_epsilon)
TEN_TIMES_TOO_LITTLE_NOISE = 81.4


def test_beam_arm_audits_the_default_job_below_its_epsilon():
    row = beam_row(4.0, runs=2, seed=11)  # 200 trials, 100 calibrate
    assert_default_job(row, 4.0)
    b = row["bound"]
    assert b.trials_in == b.trials_out == CLASSES // 2
    assert row["calibration"] == CLASSES // 2
    assert sum(row["plans"].values()) == 2
    assert 0.0 <= b.lower < 4.0
    assert 1.0 < row["noise"].lower < 4.0
    assert row["noise"].samples == 2 * CLASSES
    assert row["spent"] <= 4.0 * (1 + 1e-9)
    # negative control: the same harness, on a release whose noise is 10x
    # too small for a claimed 4, exceeds the bound asserted above
    weak = beam_row(TEN_TIMES_TOO_LITTLE_NOISE, runs=2, seed=13)
    assert weak["noise"].lower > 4.0


def test_beam_arm_finds_the_canary_without_noise():
    row = beam_row(math.inf, runs=2, seed=12)  # 200 trials
    assert_default_job(row, math.inf)
    assert row["bound"].tpr == 1.0 and row["bound"].fpr == 0.0
    assert row["bound"].lower > 1.5
    assert row["noise"].lower == math.inf  # no noise: exceeds any claim


def test_check_default_job_refuses_a_job_off_the_defaults():
    manifest = {"config": dict(cli_default_config(2.0), covariance="shared",
                               clip_norm=1.0)}
    with pytest.raises(RuntimeError, match="clip_norm=1.0.*covariance"):
        privacy_audit.check_default_job(manifest, 2.0, CLASSES, DIM)
    privacy_audit.check_default_job({"config": cli_default_config(2.0)},
                                    2.0, CLASSES, DIM)
