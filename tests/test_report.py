"""`dpsynth report`: the page renders in a real headless browser (Chromium),
is self-contained, and is written atomically."""

from __future__ import annotations

import base64
import html
import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

import sys
from pathlib import Path

from dpsynth.pipelines import cli, report_page
from tests.conftest import gmm_data

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gcs_emulator import gcs, gcs_server  # noqa: E402,F401  (fixtures)

HEADINGS = ("dpsynth release report", "Privacy budget", "Classes",
            "Synthetic rows in 2-D", "Utility (dpsynth evaluate)",
            "Reading the release", "Configuration")
IMAGES = ("privacy-by-stage.png", "privacy-by-mechanism.png",
          "class-sizes.png", "projection.png")


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    x, y = gmm_data(1500, d=12, classes=4, spread=0.2)
    np.savez(tmp / "train.npz", embeddings=x, labels=y)
    out = tmp / "release"
    assert cli.main(["generate", "--input", str(tmp / "train.npz"),
                     "--output", str(out), "--num-classes", "4",
                     "--epsilon", "2", "--clusters", "2",
                     "--noise-seed", "3"]) == 0
    return out


@pytest.fixture(scope="module")
def page(release):
    assert cli.main(["report", str(release)]) == 0
    return release.parent / "release-report"


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no headless Chromium on PATH (apt-get install chromium; "
                ".ci/run installs it when it can)")


def _browse(tmp_path, url: str, *flags: str) -> subprocess.CompletedProcess:
    """One headless Chromium run, offline-safe, with a fresh profile."""
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu",
           "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update",
           "--disable-sync", f"--user-data-dir={profile}",
           "--enable-logging=stderr", "--v=0", *flags, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_page_renders_in_chromium_without_errors(page, tmp_path):
    url = (page / "index.html").as_uri()
    done = _browse(tmp_path, url, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    for heading in HEADINGS:
        assert heading in dom, heading
    # Set by the page's own check once loaded: every image decoded.
    assert f'data-images-ok="{len(IMAGES)}"' in dom, dom[:300]
    assert 'data-images-broken="0"' in dom
    console = [l for l in done.stderr.splitlines() if "CONSOLE" in l]
    assert not console, console
    assert "net::ERR" not in done.stderr  # nothing fetched, nothing failed


def test_screenshot_is_not_blank(page, tmp_path):
    from PIL import Image
    shot = tmp_path / "shot.png"
    done = _browse(tmp_path, (page / "index.html").as_uri(),
                   f"--screenshot={shot}", "--window-size=1000,1400",
                   "--hide-scrollbars")
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    with Image.open(shot) as im:
        rgb = np.asarray(im.convert("RGB"))
    assert rgb.shape[:2] == (1400, 1000)
    colours = np.unique(rgb.reshape(-1, 3), axis=0)
    assert len(colours) > 50  # text, charts: not a blank or error page
    assert (rgb < 128).any(axis=2).mean() > 0.005  # some dark ink
    blue = np.array([0x4C, 0x72, 0xB0])  # the stage chart's bars
    assert (np.abs(rgb.astype(int) - blue).sum(axis=2) < 30).any()


def test_page_is_self_contained(page):
    text = (page / "index.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//|file:)""",
                         text, re.I)
    assert "@import" not in text and "url(" not in text
    uris = re.findall(r'src="data:image/png;base64,([^"]+)"', text)
    assert len(uris) == len(IMAGES)
    for name in IMAGES:  # the PNGs next to the page are the embedded ones
        assert base64.b64encode((page / name).read_bytes()).decode() in uris
    assert sorted(os.listdir(page)) == sorted(("index.html",) + IMAGES)


def test_page_holds_the_release_numbers(page, release):
    text = (page / "index.html").read_text()
    manifest = json.loads((release / "_manifest.json").read_text())
    spent = manifest["privacy"]["spent"]
    assert f"{spent['epsilon']:.4g} / 2" in text  # ε spent / target
    assert "add/remove one record" in text and "pld" in text
    for m in manifest["privacy"]["mechanisms"]:
        assert m["name"] in text
    assert "tree" in text and "lloyd" in text  # --clusters 2 stages
    assert "No evaluation embedded" in text  # none is looked for
    assert "real (private) data: NOT" not in text
    # --noise-seed: reproducible noise, so the page says the release is not DP
    assert "This release is NOT differentially private: " in text


def test_budget_shares_follow_the_configured_weights(release):
    manifest = json.loads((release / "_manifest.json").read_text())
    mechs = manifest["privacy"]["mechanisms"]
    worst, rows = report_page.worst_partition(mechs)
    assert worst.startswith("class=")
    shares = report_page.stage_shares(rows)
    assert sum(shares.values()) == pytest.approx(1.0)
    weights = report_page.configured_weights(manifest["config"])
    assert set(shares) == set(weights)
    for stage, weight in weights.items():  # calibration splits mu^2 so
        assert shares[stage] == pytest.approx(weight, abs=0.02), stage


def test_subsample_is_bounded_and_covers_the_classes(release):
    rel = report_page.read_release(str(release))
    x, y = report_page.sample_rows(rel, 200, seed=0)
    assert x.shape == (200, 12) and set(y.tolist()) == {0, 1, 2, 3}
    again = report_page.sample_rows(rel, 200, seed=0)
    np.testing.assert_array_equal(again[0], x)
    total = rel.manifest["samples_total"]
    assert len(report_page.sample_rows(rel, total + 10, seed=0)[1]) == total


def test_existing_output_needs_overwrite_and_is_replaced_whole(release,
                                                                tmp_path,
                                                                capsys):
    out = tmp_path / "page"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert cli.main(["report", str(release), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--overwrite" in err and len(err.strip().splitlines()) == 1
    assert os.listdir(out) == ["keep.txt"]
    assert cli.main(["report", str(release), "--output", str(out),
                     "--overwrite", "--max-points", "300"]) == 0
    assert "keep.txt" not in os.listdir(out)
    assert "index.html" in os.listdir(out)
    assert sorted(os.listdir(tmp_path)) == ["page"]  # no temp dirs left


def test_evaluation_table_is_shown_and_marked_not_dp(release, tmp_path):
    manifest = json.loads((release / "_manifest.json").read_text())
    doc = {"synthetic_trained": {"logreg": {"mean": 0.8123, "std": 0.01}},
           "real_trained_ceiling": {"logreg": {"mean": 0.9001, "std": 0.0}},
           "protocol": {"seeds": [0, 1]},
           "distribution": {"mean": {"frechet": 0.5}},
           "synthetic": {"run_id": manifest["run_id"]},
           "privacy_note": "computed on real data"}
    found = tmp_path / "rel-evaluation.json"
    found.write_text(json.dumps(doc))
    out = tmp_path / "page"
    assert cli.main(["report", str(release), "--evaluation", str(found),
                     "--output", str(out), "--max-points", "300"]) == 0
    text = (out / "index.html").read_text()
    assert "0.8123 ± 0.0100" in text and "0.9001 ± 0.0000" in text
    assert report_page.NOT_DP_EVALUATION in text and "Fréchet distance" in text


def test_evaluation_of_another_run_is_refused(release, tmp_path, capsys):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"synthetic_trained": {},
                                 "synthetic": {"run_id": "someone-else"}}))
    assert cli.main(["report", str(release), "--evaluation", str(other),
                     "--output", str(tmp_path / "page")]) == 2
    assert "someone-else" in capsys.readouterr().err
    assert not (tmp_path / "page").exists()


def test_missing_release_is_one_clear_line(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert "nope" in err and "_manifest.json" in err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "nope-report").exists()


def test_report_of_a_gcs_release(release, gcs, tmp_path):
    from apache_beam.io.filesystems import FileSystems
    for path in release.rglob("*"):
        if path.is_file():
            rel = path.relative_to(release).as_posix()
            with FileSystems.create(gcs.uri("rel", rel)) as f:
                f.write(path.read_bytes())
    assert report_page.default_output(gcs.uri("rel")) == "rel-report"
    out = tmp_path / "page"
    assert cli.main(["report", gcs.uri("rel"), "--output", str(out),
                     "--max-points", "300"]) == 0
    text = (out / "index.html").read_text()
    assert gcs.uri("rel") in text and "projection.png" in os.listdir(out)


def test_plots_come_first_and_the_mechanism_table_is_collapsed(page):
    text = (page / "index.html").read_text()
    table = text.index("<details id=mechanisms>")  # no "open": collapsed
    for name in ("privacy-by-stage.png", "privacy-by-mechanism.png"):
        assert text.index(f'title="{name}"') < table, name
    assert "<details open" not in text and "<details id=mechanisms open" not in text


def test_collapsed_in_chromium_too(page, tmp_path):
    done = _browse(tmp_path, (page / "index.html").as_uri(), "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    tag = re.search(r"<details id=\"mechanisms\"[^>]*>", done.stdout).group(0)
    assert "open" not in tag


def test_stage_bars_say_shares_plainly(page, release):
    manifest = json.loads((release / "_manifest.json").read_text())
    rows = report_page.worst_partition(manifest["privacy"]["mechanisms"])[1]
    shares = report_page.stage_shares(rows)
    planned = report_page.planned_shares(manifest)
    # The bars' cost shares are the plan's: no "72.5 % (weight 0.39)".
    for stage, share in shares.items():
        assert share == pytest.approx(planned[stage], abs=0.005), stage
        assert report_page.stage_note(share, planned[stage]) == f"{100 * share:.1f} %"
    assert report_page.stage_note(0.725, 0.39) == "72.5 % (planned 39.0 %)"
    text = re.sub(r"<[^>]+>", " ", (page / "index.html").read_text())
    assert "How to read the bars." in text and "noise multiplier" in text
    for jargon in ("weight 0.", "mu^2", "signal", "Σ 1/z² (z"):
        assert jargon not in text, jargon


def test_adaptive_plan_sets_the_planned_shares():
    manifest = {"adaptive_plan": {"shares_of_mu2": {"moments": 0.7251,
                                                    "covariance": 0.2749}},
                "config": {}}
    assert report_page.planned_shares(manifest) == {"moments": 0.7251,
                                               "covariance": 0.2749}


def test_projection_legend_is_outside_the_plot_area():
    rng = np.random.default_rng(0)
    points, labels = rng.normal(size=(500, 2)), np.arange(500) % 10
    fig = report_page.projection_figure(points, labels, points[:10], list(range(10)),
                                   np.array([0.2, 0.1]))
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1  # right of the axes


def test_pipelinedp_explanation_is_in_the_report(tmp_path):
    """The default plan's PipelineDP aggregations, explained by PipelineDP,
    in a collapsed block of the privacy section."""
    x, y = gmm_data(600, d=6, classes=3, spread=0.2)
    np.savez(tmp_path / "train.npz", embeddings=x, labels=y)
    out = tmp_path / "release"
    assert cli.main(["generate", "--input", str(tmp_path / "train.npz"),
                     "--output", str(out), "--num-classes", "3",
                     "--epsilon", "2", "--noise-seed", "3"]) == 0
    assert cli.main(["report", str(out)]) == 0
    text = (tmp_path / "release-report" / "index.html").read_text()
    manifest = json.loads((out / "_manifest.json").read_text())
    assert "<details id=pipelinedp>" in text
    for t in manifest["pipelinedp"]["explain_computation"]:
        assert html.escape(t, quote=False).splitlines()[-1] in text


def test_projection_says_the_means_are_drawn_before_renormalisation():
    # --normalize unit rescales each sampled row; the mixture's means are
    # not: the page says which step each mark shows (issue 72 item 9).
    png = {"projection.png": b"\x89PNG"}
    unit = report_page._projection_section(png, 5, 10, "unit")
    assert "before renormalisation" in unit and "rows are drawn after" in unit
    assert "renormalisation" not in report_page._projection_section(png, 5, 10, "none")
