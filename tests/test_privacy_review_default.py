"""Privacy-ledger review of the DEFAULT plan (``--covariance auto``).

``test_privacy_review.py`` reviews a fixed plan field by field (clusters,
vote filter). The default run is two pipeline runs with a structure chosen
in between from noisy counts; this module checks the same invariants on it:
every manifest field tagged, the privacy block and the rule's record equal
to the in-memory adaptive reference's, every noise draw made under a
registered mechanism with its sigma (as often as accounted), no file
metadata, no exact count and no unexplained number in any output or log.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import reference
from tests.test_privacy_review import (_NUMBER, OPERATOR, SIZES, RecordingNoise,
                                       _allowed_numbers, _explained,
                                       _int_token, _leaves,
                                       _scrub, _tag, _texts,
                                       assert_draws_registered,
                                       manifest_config, review_run)

NOISE_SEED = 20261127  # its noisy counts make the rule pick the subspace


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return review_run(tmp_path_factory, "review-default", [
        "--num-classes", "3", "--epsilon", "1",
        "--noise-seed", str(NOISE_SEED), "--rows-per-shard", "100"])


@pytest.fixture(scope="module")
def expected(run):
    cfg = manifest_config(run)
    noise = RecordingNoise(NOISE_SEED)
    mixes, xs, ys, ledger, structure = reference.generate_adaptive(
        run["x"], run["y"], cfg, noise)
    return dict(cfg=cfg, noise=noise, ledger=ledger, structure=structure,
                mixes=mixes, ys=ys)


def test_the_default_ran_the_adaptive_plan(run):
    m = run["manifest"]
    assert m["config"]["covariance"] == "auto"
    assert m["adaptive_plan"]["mode"] == "subspace"  # three passes, two runs
    for c, size in zip(m["classes"], SIZES):
        assert abs(c["noisy_count"] - size) > 2  # a meaningful probe


def test_every_manifest_field_is_tagged(run):
    untagged = sorted({p for p, _ in _leaves(run["manifest"])
                       if _tag(p) is None})
    assert not untagged, f"manifest fields with no privacy tag: {untagged}"


def test_privacy_block_and_rule_record_match_the_reference(run, expected):
    m = run["manifest"]
    assert m["privacy"] == json.loads(json.dumps(
        expected["ledger"].to_manifest()))
    assert m["adaptive_plan"] == json.loads(json.dumps(
        expected["structure"].to_manifest()))
    assert m["samples_total"] == len(expected["ys"])


def test_pipelinedp_explanation_is_the_plan(run, expected):
    """PipelineDP ran the per-class counts and sums (the subspace blocks and
    global matrices are not per-class families); its explanation names each
    family with the ledger's sensitivity and sigma, public partitions and
    no bounding or selection stage of its own."""
    doc = run["manifest"]["pipelinedp"]
    assert doc["version"] == "0.3.1"
    texts = doc["explain_computation"]
    ledger = expected["ledger"]
    for text, family in zip(texts, ["count", "moments/sum"]):
        m = ledger.get(f"class=0/{family}")
        assert f"class=<c>/{family}, L2 sensitivity={m.sensitivity:.6g}, " \
            f"sigma={m.sigma:.6g};" in text
        assert "Partition selection: public partitions" in text
        assert "contribution_bounds_already_enforced=True" in text
    assert len(texts) == 2


def test_every_noise_draw_is_a_registered_mechanism(expected):
    assert_draws_registered(expected["ledger"], expected["noise"].draws)


def test_no_private_file_metadata_in_the_release(run):
    import hashlib
    out, private = Path(run["out"]), run["tmp"] / "patient-0001.npz"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["_manifest.json", run["manifest"]["root"]])
    data = private.read_bytes()
    needles = {private.name, str(len(data)), hashlib.sha256(data).hexdigest()}
    for path in out.rglob("*"):
        assert "phase1" not in path.name  # phase 1's file stays in staging
        if path.suffix == ".json":
            text = path.read_text()
            for needle in needles:
                assert needle not in text, f"{needle} in {path.name}"


def test_exact_counts_appear_nowhere(run):
    exact = [*SIZES, sum(SIZES)]
    for where, text in _texts(run).items():
        if not where.endswith((".json", ".npz")) and where not in (
                "logs", "stdout", "stderr"):
            continue
        text = _scrub(text, run)
        for value in exact:
            assert not _int_token(value).search(text), \
                f"exact private count {value} found in {where}"


def test_every_number_in_our_logs_is_public_or_dp(run):
    mechanisms = run["manifest"]["privacy"]["mechanisms"]
    phase1 = [m for m in mechanisms  # plan line: a count of public config
              if m["name"].endswith(("/count", "centre/sum"))]
    allowed = _allowed_numbers(run) + [
        len(phase1), len(run["manifest"]["config"]["labels"])]
    ours = [m for n, m in run["logs"]
            if n.startswith("dpsynth") and n != OPERATOR]
    lines = ours + run["stdout"].splitlines()
    assert any("covariance rule" in line for line in lines)
    for line in lines:
        for token in _NUMBER.findall(_scrub(line, run)):
            assert _explained(token, allowed), \
                f"number {token} in log line {line!r} is not public/DP"
