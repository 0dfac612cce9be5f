"""`dpsynth report` never embeds real-data (non-DP) numbers unless named,
marks them when it does, and marks a release that is not DP itself."""

from __future__ import annotations

import html
import json
import shutil

import numpy as np
import pytest

from dpsynth.pipelines import cli, report_page
from tests.conftest import gmm_data

BANNER = "This release is NOT differentially private: "
# Numbers only an evaluation file holds: none may reach the page unnamed.
REAL_NUMBERS = ("0.8123", "0.9001", "Fréchet distance", "0.4321")


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """A small release with secure (per-run, os.urandom) noise."""
    tmp = tmp_path_factory.mktemp("privacy-report")
    x, y = gmm_data(600, d=8, classes=3, spread=0.2)
    np.savez(tmp / "train.npz", embeddings=x, labels=y)
    out = tmp / "release"
    assert cli.main(["generate", "--input", str(tmp / "train.npz"),
                     "--output", str(out), "--num-classes", "3",
                     "--epsilon", "2"]) == 0
    return out


def _copy(release, tmp_path, **changes):
    """The release copied into ``tmp_path``, its manifest updated."""
    out = tmp_path / "release"
    shutil.copytree(release, out)
    manifest = json.loads((out / "_manifest.json").read_text())
    manifest.update(changes)
    (out / "_manifest.json").write_text(json.dumps(manifest))
    return out, manifest


def _evaluation(run_id: str) -> dict:
    return {"synthetic_trained": {"logreg": {"mean": 0.8123, "std": 0.01}},
            "real_trained_ceiling": {"logreg": {"mean": 0.9001, "std": 0.0}},
            "protocol": {"seeds": [0]},
            "distribution": {"mean": {"frechet": 0.4321}},
            "synthetic": {"run_id": run_id},
            "privacy_note": "computed on real data"}


def _report(release, tmp_path, *flags) -> str:
    out = tmp_path / "page"
    assert cli.main(["report", str(release), "--output", str(out),
                     "--max-points", "200", *flags]) == 0
    return (out / "index.html").read_text()


def _warnings(err: str) -> list[str]:
    return [l for l in err.splitlines() if "warning" in l]


def test_secure_release_has_no_banner(release, tmp_path, capsys):
    manifest = json.loads((release / "_manifest.json").read_text())
    assert manifest["noise"].startswith("secure")
    assert report_page.not_private_reason(manifest) is None
    text = _report(release, tmp_path)
    assert "NOT differentially private" not in text
    assert "class=notprivate" not in text
    assert "a DP output of the release" in text
    assert _warnings(capsys.readouterr().err) == []


def test_evaluation_files_lying_around_are_ignored(release, tmp_path,
                                                   monkeypatch, capsys):
    rel, manifest = _copy(release, tmp_path)
    doc = json.dumps(_evaluation(manifest["run_id"]))
    # Every place the old automatic search looked, all for this very run.
    for path in (rel / "evaluation.json", tmp_path / "release-evaluation.json",
                 tmp_path / "release.evaluation.json",
                 tmp_path / "evaluation.json"):
        path.write_text(doc)
    monkeypatch.chdir(tmp_path)
    text = _report(rel, tmp_path)
    for number in REAL_NUMBERS:
        assert number not in text, number
    assert report_page.NOT_DP_EVALUATION not in text
    assert "No evaluation embedded" in text
    assert _warnings(capsys.readouterr().err) == []


def test_named_evaluation_is_marked_on_header_section_and_console(
        release, tmp_path, capsys):
    manifest = json.loads((release / "_manifest.json").read_text())
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(_evaluation(manifest["run_id"])))
    text = _report(release, tmp_path, "--evaluation", str(path))
    for number in REAL_NUMBERS:
        assert number in text, number
    header, body = text.split("<h1>", 1)
    assert report_page.NOT_DP_EVALUATION in header.split("<body>")[1]
    section = body.split("<h2 id=evaluation>")[1].split("<h2")[0]
    assert section.index(report_page.NOT_DP_EVALUATION) < section.index("0.8123")
    assert "real (private) data: NOT differentially private — do not " \
           "publish this page with them" in report_page.NOT_DP_EVALUATION
    lines = _warnings(capsys.readouterr().err)
    assert len(lines) == 1 and report_page.NOT_DP_EVALUATION in lines[0]
    assert str(path) in lines[0]


def test_unreadable_evaluation_is_one_clear_line(release, tmp_path, capsys):
    missing = tmp_path / "nope.json"
    assert cli.main(["report", str(release), "--evaluation", str(missing),
                     "--output", str(tmp_path / "page")]) == 2
    err = capsys.readouterr().err.strip()
    assert "nope.json" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "page").exists()


@pytest.mark.parametrize("changes, reason", [
    ({"noise": "seeded Gaussian noise: a key from the secret --noise-seed"},
     "secret seed"),
    ({"noise": "none (epsilon=inf)",
      "warnings": ["epsilon=inf: NO NOISE WAS ADDED. This release is NOT "
                   "differentially private. Never share it."]},
     "no noise was added"),
    ({"private": False},
     '"private": false'),
    ({"private": False,
      "noise": "seeded Gaussian noise: a key from the secret --noise-seed",
      "warnings": ["NOT PRIVATE: --noise-seed makes the noise reproducible; "
                   "reused on neighbouring data it cancels",
                   "delta=0.1 is larger than 1/n"]},
     "--noise-seed makes the noise reproducible"),
])
def test_non_private_release_gets_a_red_banner(release, tmp_path, capsys,
                                               changes, reason):
    rel, manifest = _copy(release, tmp_path, **changes)
    text = _report(rel, tmp_path)
    header = text.split("<body>")[1].split("<h1>")[0]
    assert "class=notprivate" in header
    assert html.escape(BANNER) in header
    assert html.escape(reason) in header
    for warning in manifest["warnings"]:  # every warning is on the page
        assert f"⚠ {html.escape(warning)}" in text
    assert "a DP output of the release" not in text
    lines = _warnings(capsys.readouterr().err)
    assert len(lines) == 1
    assert "release is NOT differentially private: " in lines[0]
    assert reason in lines[0]


def test_every_manifest_warning_is_shown(release, tmp_path):
    warnings = ["delta=0.1 is larger than 1/n <check>", "second & last"]
    rel, _ = _copy(release, tmp_path, warnings=warnings)
    text = _report(rel, tmp_path)
    for warning in warnings:
        assert f"<p class=warn>⚠ {html.escape(warning)}</p>" in text
    assert BANNER not in text


def test_not_private_reason_rules():
    reason = report_page.not_private_reason
    assert reason({}) is None
    assert reason({"noise": "secure Gaussian noise", "private": True}) is None
    assert reason({"noise": "secure Gaussian noise",
                   "warnings": ["NOT PRIVATE: stale"]}) is None
    assert "secret seed" in reason({"noise": "seeded x"})
    assert "epsilon=inf" in reason({"noise": "none (epsilon=inf)"})
    assert reason({"private": False, "warnings": "NOT PRIVATE: one"}) == "one"
    assert reason({"private": False,
                   "warnings": ["NOT PRIVATE — a.", "NOT PRIVATE: b"]}) \
        == "a. b"
