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

from dpsynth.pipelines import cli
from dpsynth.pipelines.release import reading, release, sample

REPO = Path(__file__).resolve().parent.parent


def _by_class(path: str) -> dict[int, np.ndarray]:
    x, y, _ = reading.load_release(path)
    return {int(c): x[y == c] for c in np.unique(y)}


def test_rows_are_drawn_from_the_source_mixture(sample_source, tmp_path):
    """With the source's own seed and row count, every class that gets the
    source's number of rows gets the source's very rows: the same mixture,
    the same sampler."""
    src = release.read_manifest(sample_source)
    out = str(tmp_path / "again")
    manifest = sample.run(sample.SampleSpec(
        sample_source, out, src["samples_total"], seed=src["config"]["seed"]))
    assert manifest["samples_total"] == src["samples_total"]
    same = [c["label"] for c, s in zip(manifest["classes"], src["classes"])
            if c["samples"] == s["samples"]]
    assert len(same) >= len(src["classes"]) // 2
    mine, theirs = _by_class(out), _by_class(sample_source)
    for label in same:
        np.testing.assert_array_equal(mine[label], theirs[label])
    a, b = reading.load_gmm(out), reading.load_gmm(sample_source)
    for label, mix in b.mixtures.items():
        np.testing.assert_array_equal(a.mixtures[label].means, mix.means)


def test_requested_rows_in_the_class_proportions_and_a_post_processing_manifest(
        sample_source, tmp_path, monkeypatch):
    from dpsynth.transforms import io

    def no_private_read(*args, **kwargs):
        raise AssertionError("sample read input rows")
    src = release.read_manifest(sample_source)
    out = str(tmp_path / "more")
    monkeypatch.setattr(io, "ReadEmbeddingBlocks", no_private_read)
    assert cli.main(["sample", sample_source, "--rows", "3001", "--output",
                     out, "--seed", "5"]) == 0
    monkeypatch.undo()
    manifest = release.read_manifest(out)
    x, y, _ = reading.load_release(out)
    assert len(y) == manifest["samples_total"] == 3001
    assert x.shape[1] == src["embedding_dim"]
    counts = np.array([c["noisy_count"] for c in src["classes"]])
    share = np.bincount(y, minlength=len(counts)) / 3001
    np.testing.assert_allclose(share, counts / counts.sum(), atol=1 / 3001)
    assert manifest["post_processing"] is True
    assert manifest["source"]["run_id"] == src["run_id"]
    assert manifest["source"]["manifest_sha256"] == \
        release.manifest_digest(sample_source)
    assert manifest["privacy_cost"]["epsilon"] == 0.0
    assert manifest["privacy_cost"]["delta"] == 0.0
    assert manifest["lifetime_budget"] is None
    assert manifest["outputs"]["format"] == src["outputs"]["format"]
    assert manifest["run_id"] != src["run_id"]
    # Another seed: other rows.
    assert not np.array_equal(_by_class(out)[0][:5],
                              _by_class(sample_source)[0][:5])


def test_user_errors_are_one_line_and_write_nothing(sample_source, tmp_path,
                                                    capsys):
    out = str(tmp_path / "out")
    cases = [
        ([str(tmp_path / "nothing"), "--rows", "10"], "no _manifest.json"),
        ([sample_source, "--rows", "0"], "--rows"),
        ([sample_source, "--rows", "ten"], "--rows"),
        ([sample_source, "--rows", "-3"], "--rows"),
        ([sample_source, "--rows", "10", "--sead", "1"], "--sead"),
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
        sample.SampleSpec(sample_source, sample_source + "/", 10)


def test_a_release_whose_mixture_fails_verification_is_refused(
        sample_source, tmp_path, capsys):
    import shutil
    copy = tmp_path / "tampered"
    shutil.copytree(sample_source, copy)
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
    assert cli.main(["sample", str(sample_source), "--rows", "1", "--output",
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


def test_the_api_returns_the_new_release(sample_source, tmp_path):
    from dpsynth.pipelines import api
    out = api.sample(sample_source, str(tmp_path / "api"), 40, seed=2)
    x, y = out.arrays()
    assert len(y) == 40 and out.manifest["post_processing"] is True


def test_a_mixture_swapped_after_the_check_is_not_sampled(sample_source,
                                                          tmp_path,
                                                          monkeypatch):
    """The mixture is checked on the bytes sample reads: one replaced
    between the release's check and that read (here: by a hook on the
    check) is refused in one line, and nothing is written."""
    import shutil
    src = release.read_manifest(sample_source)
    root = release.release_root(sample_source, src)
    gmm = os.path.join(root, src["outputs"].get("gmm", "gmm.npz"))
    saved = str(tmp_path / "saved.npz")
    shutil.copy(gmm, saved)
    check = reading.verify_release

    def check_then_swap(path, manifest=None, **kwargs):
        got = check(path, manifest, **kwargs)
        with open(gmm, "r+b") as f:  # same size, other bytes
            data = bytearray(f.read())
            data[-1] ^= 0xFF
            f.seek(0)
            f.write(data)
        return got

    monkeypatch.setattr(reading, "verify_release", check_then_swap)
    out = str(tmp_path / "swapped")
    try:
        with pytest.raises(sample.SampleError, match="not the mixture its "
                           "manifest lists"):
            sample.run(sample.SampleSpec(sample_source, out, 50))
    finally:
        shutil.copy(saved, gmm)
    assert not os.path.exists(out)


# ------------------------------------------------- issue 58 item 8

@pytest.fixture(scope="module")
def private_source(tmp_path_factory) -> str:
    """A private release (secure noise), beside the seeded
    ``sample_source`` (tests/conftest.py)."""
    out = str(tmp_path_factory.mktemp("sample-private") / "source")
    assert cli.main(["generate", "--output", out, "--epsilon", "2"]) == 0
    return out


def _tree(path) -> dict:
    """Every file under ``path`` and its bytes: the state to compare."""
    out = {}
    for folder, _, files in os.walk(path):
        for name in files:
            full = os.path.join(folder, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = f.read()
    return out


@pytest.mark.parametrize("which", ["sample_source", "private_source"])
def test_the_sample_claims_what_its_source_claims(which, request, tmp_path,
                                                  capsys):
    """The sample's private flag and warnings are its source's; a sample
    of a non-private source never calls its mixture DP, nor itself free of
    privacy cost without saying NOT PRIVATE."""
    path = request.getfixturevalue(which)
    src = release.read_manifest(path)
    out = str(tmp_path / "drawn")
    assert cli.main(["sample", path, "--rows", "50", "--output", out]) == 0
    said = capsys.readouterr()
    manifest = release.read_manifest(out)
    assert manifest["private"] is src["private"]
    assert manifest["warnings"] == src["warnings"]
    text = json.dumps({k: manifest[k] for k in ("noise", "privacy_cost")})
    if src["private"]:
        assert which == "private_source"
        assert "DP mixture" in text and "NOT PRIVATE" not in text
        assert "no privacy cost" in said.out
    else:
        assert which == "sample_source"  # --noise-seed
        assert src["warnings"] and "NOT PRIVATE" in " ".join(src["warnings"])
        assert "DP" not in text and "NOT PRIVATE" in manifest["noise"]
        assert "NOT PRIVATE" in said.out and "no privacy cost" not in said.out
        for warning in src["warnings"]:
            assert warning in said.err


def _spellings(src: Path, cwd: Path) -> list[str]:
    """--output spellings that name the source, a parent or a child."""
    link = cwd / "link-to-parent"
    link.symlink_to(src.parent)
    rel = os.path.relpath(src, cwd)
    return [
        str(src) + "/", str(src) + "//", "/" + str(src),
        str(src.parent / ".." / src.parent.name / src.name),
        "file://" + str(src), str(link / src.name),
        "/proc/self/cwd/" + rel, rel, "./" + rel + "/.",
        str(src.parent),  # a parent: --overwrite would delete the source
        str(src.parent.parent), str(link),
        str(src / "inside"), str(src / "v-x" / ".." / "deeper"),  # children
        "file://" + str(src / "inside"),
    ]


def test_output_never_overlaps_the_source_in_any_spelling(
        private_source, tmp_path, monkeypatch, capsys):
    """``sample SRC --output SRC/ --overwrite`` deleted its own source:
    every spelling of the source, of a folder holding it and of a folder
    inside it is refused (SampleError, one line) and the source's bytes
    and the rest of the tree are left as they were."""
    import shutil
    src = tmp_path / "area" / "rel"
    src.parent.mkdir()
    shutil.copytree(private_source, src)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    before = _tree(tmp_path)
    for output in _spellings(src, cwd):
        with pytest.raises(sample.SampleError) as err:
            sample.run(sample.SampleSpec(str(src), output, 10,
                                         overwrite=True))
        assert type(err.value) is sample.SampleError
        assert "\n" not in str(err.value), output
        assert "source release" in str(err.value), output
        code = cli.main(["sample", str(src), "--rows", "10", "--output",
                         output, "--overwrite"])
        err_text = capsys.readouterr().err.strip()
        assert code == 2 and len(err_text.splitlines()) == 1, (output,
                                                                err_text)
        assert _tree(tmp_path) == {**before, **{
            k: v for k, v in _tree(tmp_path).items() if k not in before}}
        assert _tree(src) == _tree(tmp_path / "area" / "rel")
        assert set(_tree(tmp_path)) == set(before), output  # nothing written
    assert _tree(tmp_path) == before
    # A sibling is fine (and the source still reads).
    assert cli.main(["sample", str(src), "--rows", "10", "--output",
                     str(tmp_path / "area" / "rel-2")]) == 0
    reading.load_release(str(src))


def test_gcs_output_overlapping_a_gcs_source_is_refused():
    """The object-store spellings: '..', '//', a trailing '/', a parent."""
    for output in ("gs://b/r/", "gs://b/r//", "gs://b/x/../r", "gs://b/",
                   "gs://b/r/inside", "gs://b//r/../r/inside"):
        with pytest.raises(sample.SampleError, match="source release"):
            sample.SampleSpec("gs://b/r", output, 10)
    sample.SampleSpec("gs://b/r", "gs://b/r-2", 10)  # a sibling
    sample.SampleSpec("gs://b/r", "gs://other/r", 10)
