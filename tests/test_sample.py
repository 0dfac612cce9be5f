"""`dpsynth sample` (issue 53): more rows from a published mixture, as a
release of their own that says it is post-processing (~15 s: one small
generate, a few samples)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dpsynth.pipelines import cli, release, sample

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("sample") / "source")
    assert cli.main(["generate", "--output", out, "--noise-seed", "3"]) == 0
    return out


def _by_class(path: str) -> dict[int, np.ndarray]:
    x, y, _ = release.load_release(path)
    return {int(c): x[y == c] for c in np.unique(y)}


def test_rows_are_drawn_from_the_source_mixture(source, tmp_path):
    """With the source's own seed and row count, every class that gets the
    source's number of rows gets the source's very rows: the same mixture,
    the same sampler."""
    src = release.read_manifest(source)
    out = str(tmp_path / "again")
    manifest = sample.run(sample.SampleSpec(
        source, out, src["samples_total"], seed=src["config"]["seed"]))
    assert manifest["samples_total"] == src["samples_total"]
    same = [c["label"] for c, s in zip(manifest["classes"], src["classes"])
            if c["samples"] == s["samples"]]
    assert len(same) >= len(src["classes"]) // 2
    mine, theirs = _by_class(out), _by_class(source)
    for label in same:
        np.testing.assert_array_equal(mine[label], theirs[label])
    a, b = release.load_gmm(out), release.load_gmm(source)
    for label, mix in b.mixtures.items():
        np.testing.assert_array_equal(a.mixtures[label].means, mix.means)


def test_requested_rows_in_the_class_proportions_and_a_post_processing_manifest(
        source, tmp_path, monkeypatch):
    from dpsynth.transforms import io

    def no_private_read(*args, **kwargs):
        raise AssertionError("sample read input rows")
    src = release.read_manifest(source)
    out = str(tmp_path / "more")
    monkeypatch.setattr(io, "ReadEmbeddingBlocks", no_private_read)
    assert cli.main(["sample", source, "--rows", "3001", "--output", out,
                     "--seed", "5"]) == 0
    monkeypatch.undo()
    manifest = release.read_manifest(out)
    x, y, _ = release.load_release(out)
    assert len(y) == manifest["samples_total"] == 3001
    assert x.shape[1] == src["embedding_dim"]
    counts = np.array([c["noisy_count"] for c in src["classes"]])
    share = np.bincount(y, minlength=len(counts)) / 3001
    np.testing.assert_allclose(share, counts / counts.sum(), atol=1 / 3001)
    assert manifest["post_processing"] is True
    assert manifest["source"]["run_id"] == src["run_id"]
    assert manifest["source"]["manifest_sha256"] == \
        release.manifest_digest(source)
    assert manifest["privacy_cost"]["epsilon"] == 0.0
    assert manifest["privacy_cost"]["delta"] == 0.0
    assert manifest["lifetime_budget"] is None
    assert manifest["outputs"]["format"] == src["outputs"]["format"]
    assert manifest["run_id"] != src["run_id"]
    # Another seed: other rows.
    assert not np.array_equal(_by_class(out)[0][:5], _by_class(source)[0][:5])


def test_user_errors_are_one_line_and_write_nothing(source, tmp_path, capsys):
    out = str(tmp_path / "out")
    cases = [
        ([str(tmp_path / "nothing"), "--rows", "10"], "no _manifest.json"),
        ([source, "--rows", "0"], "--rows"),
        ([source, "--rows", "ten"], "--rows"),
        ([source, "--rows", "-3"], "--rows"),
        ([source, "--rows", "10", "--sead", "1"], "--sead"),
    ]
    # An unpublished release: version folder, no manifest.
    half = tmp_path / "half"
    (half / "v-0").mkdir(parents=True)
    cases.append(([str(half), "--rows", "10"], "not a complete release"))
    staged = tmp_path / "rel.staging-run@abc"  # a launch's staged files
    staged.mkdir()
    cases.append(([str(staged), "--rows", "10"], "staging folder"))
    for argv, needle in cases:
        try:
            code = cli.main(["sample"] + argv + ["--output", out])
        except SystemExit as stop:  # argparse's own errors
            code = stop.code
        err = capsys.readouterr().err.strip()
        assert code == 2, argv
        assert len(err.splitlines()) == 1 and err.startswith(
            "dpsynth: error: ") and needle in err, (argv, err)
        assert not os.path.exists(out)
    with pytest.raises(sample.SampleError, match="is the source release"):
        sample.SampleSpec(source, source + "/", 10)


def test_a_release_whose_mixture_fails_verification_is_refused(
        source, tmp_path, capsys):
    import shutil
    copy = tmp_path / "tampered"
    shutil.copytree(source, copy)
    manifest = json.loads((copy / release.MANIFEST).read_text())
    manifest["classes"][0]["noisy_count"] += 1.0  # not the mixture's
    (copy / release.MANIFEST).write_text(json.dumps(manifest))
    out = str(tmp_path / "out")
    assert cli.main(["sample", str(copy), "--rows", "10", "--output",
                     out]) == 2
    err = capsys.readouterr().err
    assert "fails verification" in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists(out)
    assert not [p for p in os.listdir(tmp_path) if ".staging-" in p]
    gmm = copy / manifest["root"] / manifest["outputs"]["gmm"]
    gmm.write_bytes(b"not an npz")
    assert cli.main(["sample", str(source), "--rows", "1", "--output",
                     out]) == 0  # the source itself is fine
    manifest["classes"][0]["noisy_count"] -= 1.0
    (copy / release.MANIFEST).write_text(json.dumps(manifest))
    assert cli.main(["sample", str(copy), "--rows", "10", "--output",
                     str(tmp_path / "out2")]) == 2
    assert "not the ones its manifest lists" in capsys.readouterr().err


def test_sample_help_loads_no_pipeline_library():
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
            "from dpsynth.pipelines import cli\n"
            "try:\n    cli.main(['sample', '--help'])\n"
            "except SystemExit:\n    pass\n"
            "print('HEAVY', [m for m in ('apache_beam', 'numpy', 'pyarrow') "
            "if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=120)
    assert "post_processing" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "HEAVY []"


def test_class_rows_sum_to_the_request_and_skip_empty_classes():
    assert sample.class_rows({0: 10.0, 1: -4.0, 2: 30.0}, 7) == {
        0: 2, 1: 0, 2: 5}
    assert sum(sample.class_rows({0: 1.0, 1: 1.0, 2: 1.0}, 10).values()) == 10
    with pytest.raises(sample.SampleError, match="no class"):
        sample.class_rows({0: -1.0}, 5)


def test_the_api_returns_the_new_release(source, tmp_path):
    from dpsynth.pipelines import api
    out = api.sample(source, str(tmp_path / "api"), 40, seed=2)
    x, y = out.arrays()
    assert len(y) == 40 and out.manifest["post_processing"] is True


def test_a_mixture_swapped_after_the_check_is_not_sampled(source, tmp_path,
                                                          monkeypatch):
    """The mixture is checked on the bytes sample reads: one replaced
    between the release's check and that read (here: by a hook on the
    check) is refused in one line, and nothing is written."""
    import shutil
    src = release.read_manifest(source)
    root = release.release_root(source, src)
    gmm = os.path.join(root, src["outputs"].get("gmm", "gmm.npz"))
    saved = str(tmp_path / "saved.npz")
    shutil.copy(gmm, saved)
    check = release.verify_release

    def check_then_swap(path, manifest=None, **kwargs):
        got = check(path, manifest, **kwargs)
        with open(gmm, "r+b") as f:  # same size, other bytes
            data = bytearray(f.read())
            data[-1] ^= 0xFF
            f.seek(0)
            f.write(data)
        return got

    monkeypatch.setattr(release, "verify_release", check_then_swap)
    out = str(tmp_path / "swapped")
    try:
        with pytest.raises(sample.SampleError, match="not the mixture its "
                           "manifest lists"):
            sample.run(sample.SampleSpec(source, out, 50))
    finally:
        shutil.copy(saved, gmm)
    assert not os.path.exists(out)
