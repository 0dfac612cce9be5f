"""Release formats (TFRecord, Parquet), schema.json and the manifest's
description of the outputs (normalisation, effective covariance rank)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.pipelines import cli
from dpsynth.pipelines.release.reading import load_gmm, load_release
from tests.conftest import gmm_data, release_dir
from dpsynth.transforms import write

ROOT = Path(__file__).resolve().parent.parent
DIM = 10


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    """The same run (same seeds) written as TFRecord and as Parquet; the
    Parquet one with custom feature names."""
    tmp = tmp_path_factory.mktemp("formats")
    x, y = gmm_data(900, d=DIM, classes=3, spread=0.2)
    xt, yt = gmm_data(300, d=DIM, classes=3, seed=5, spread=0.2)
    np.savez(tmp / "train.npz", embeddings=x, labels=y)
    np.savez(tmp / "test.npz", embeddings=xt, labels=yt)
    common = ["generate", "--input", str(tmp / "train.npz"), "--num-classes",
              "3", "--epsilon", "4", "--noise-seed", "7",
              "--rows-per-shard", "120", "--covariance-rank", "32"]
    out = {"tmp": tmp}
    for fmt, extra in (("tfrecord", []),
                       ("parquet", ["--embedding-feature", "vec",
                                    "--label-feature", "cls"])):
        out[fmt] = tmp / fmt
        assert cli.main([*common, "--output", str(out[fmt]),
                         "--output-format", fmt, *extra]) == 0
    return out


def test_both_formats_hold_the_same_rows(releases):
    xt, yt, mt = load_release(str(releases["tfrecord"]))
    xp, yp, mp = load_release(str(releases["parquet"]))
    assert mt["outputs"]["format"] == "tfrecord"
    assert mp["outputs"]["format"] == "parquet"
    assert len(yt) == mt["samples_total"] > 0
    np.testing.assert_array_equal(yp, yt)
    np.testing.assert_array_equal(xp, xt)
    shards = sorted(p.name for p in (release_dir(releases["parquet"]) / "data").iterdir())
    assert shards and all(re.fullmatch(r"synthetic-class\d{5}-\d{5}\.parquet",
                                       s) for s in shards)
    assert len(shards) > 3  # several shards per class (--rows-per-shard)


def test_parquet_columns_are_float32_lists_and_int64(releases):
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = sorted((release_dir(releases["parquet"]) / "data").iterdir())[0]
    table = pq.read_table(path)
    vec, cls = table.schema.field("vec"), table.schema.field("cls")
    assert pa.types.is_fixed_size_list(vec.type)
    assert vec.type.list_size == DIM
    assert vec.type.value_type == pa.float32()
    assert not vec.nullable and not vec.type.value_field.nullable
    assert cls.type == pa.int64() and not cls.nullable
    # Plain float rows (nothing to gain from compression, a dictionary or
    # min/max of a float column); the label keeps its statistics, so a
    # reader filtering on it skips other classes' shards.
    group = pq.ParquetFile(path).metadata.row_group(0)
    assert group.column(0).compression == "UNCOMPRESSED"
    assert group.column(1).statistics.min == group.column(1).statistics.max
    rows = np.asarray(table.column("vec").to_pylist(), np.float32)
    assert rows.shape == (table.num_rows, DIM)
    assert set(table.column("cls").to_pylist()) == {0}


def _readme_snippet() -> str:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    found = [b for b in blocks if "_schema.json" in b and "parse_example" in b]
    assert len(found) == 1, "README: the schema.json tf.data snippet"
    return found[0]


def test_readme_schema_snippet_reads_the_release_with_tf_data(releases):
    """The README's snippet, as written, with only the release path set."""
    code = _readme_snippet()
    release_line = re.search(r'^release = ".*"$', code, re.M)
    assert release_line
    code = code.replace(release_line.group(0),
                        f"release = {str(releases['tfrecord'])!r}")
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    rows = [batch for batch in scope["dataset"].as_numpy_iterator()]
    emb = np.concatenate([b["embedding"] for b in rows])
    lab = np.concatenate([b["label"] for b in rows])
    xt, yt, _ = load_release(str(releases["tfrecord"]))
    order = np.lexsort(np.column_stack([emb, lab]).T)
    ref = np.lexsort(np.column_stack([xt, yt]).T)
    np.testing.assert_array_equal(lab[order], yt[ref])
    np.testing.assert_array_equal(emb[order], xt[ref].astype(np.float32))


def test_schema_file_needs_no_manifest(releases):
    schema = json.loads((release_dir(releases["parquet"]) / "_schema.json").read_text())
    assert schema["format"] == "parquet"
    assert schema["files"] == "data/*.parquet"
    assert schema["features"] == {
        "vec": {"dtype": "float32", "shape": [DIM], "role": "embedding"},
        "cls": {"dtype": "int64", "shape": [], "role": "label"}}
    assert schema["labels"] == [0, 1, 2]
    assert schema["normalisation"]["normalize"] == "unit"
    assert "L2 norm" in schema["normalisation"]["apply_to_real_inputs"]


def test_manifest_states_normalisation_and_effective_rank(releases):
    manifest = json.loads((releases["tfrecord"] / "_manifest.json").read_text())
    outputs = manifest["outputs"]
    assert outputs["schema"] == "_schema.json"
    assert outputs["normalisation"]["normalize"] == "unit"
    assert outputs["normalisation"]["clip_norm"] is None  # centred release
    cov = outputs["covariance"]
    # the default (--covariance auto) picks one matrix per class for these
    # 300-row classes in 10 dimensions at epsilon 4
    assert cov["mode"] == manifest["adaptive_plan"]["mode"] == "per-class"
    assert cov["requested_rank"] == 32
    gmm = load_gmm(str(releases["tfrecord"]))
    ranks = [gmm.mixtures[c].factors.shape[1] for c in (0, 1, 2)]
    assert cov["effective_rank"] == {"min": min(ranks), "max": max(ranks)}
    assert [c["covariance_rank"] for c in manifest["classes"]] == ranks
    with np.load(release_dir(releases["tfrecord"]) / "_gmm.npz") as z:
        assert "shared_factors" not in z.files
        for c, kept in enumerate(ranks):
            assert z[f"class_{c}_factors"].shape == (DIM, kept)
    kept = min(ranks)
    assert max(ranks) <= DIM
    assert "at most 10 factors" in cov["why_smaller"]  # d < requested rank
    if kept < DIM:  # noise left some eigenvalues <= 0
        assert "eigenvalues > 0" in cov["why_smaller"]


def _cfg(**kw) -> GeneratorConfig:
    return GeneratorConfig(labels=(0, 1), **kw)


def test_describe_covariance_cases():
    full = write.describe_covariance(_cfg(covariance_rank=4), 8, [4, 4])
    assert full["effective_rank"] == {"min": 4, "max": 4}
    assert full["why_smaller"] is None
    per_class = write.describe_covariance(
        _cfg(covariance_rank=4, covariance="per-class"), 8, [4, 2])
    assert per_class["effective_rank"] == {"min": 2, "max": 4}
    assert "eigenvalues > 0" in per_class["why_smaller"]
    assert per_class["stored_as"].startswith("class_<label>_factors")
    capped = write.describe_covariance(_cfg(covariance_rank=16), 8, [8, 8])
    assert capped["why_smaller"].startswith("a 8-dimensional covariance")
    diagonal = write.describe_covariance(_cfg(covariance_rank=0), 8, [0, 0])
    assert diagonal["mode"] == "diagonal" and diagonal["why_smaller"] is None


def test_uncentred_release_tells_users_to_clip_too():
    norm = write.normalisation(_cfg(center=False, clip_norm=0.5))
    assert norm["clip_norm"] == 0.5
    assert "down to norm 0.5" in norm["apply_to_real_inputs"]
    assert write.normalisation(_cfg(normalize="none"))[
        "apply_to_real_inputs"] == "use the rows as they are"


def test_evaluate_reads_a_parquet_release(releases, capsys):
    tmp = releases["tmp"]
    rc = cli.main(["evaluate", "--synthetic", str(releases["parquet"]),
                   "--real-train", str(tmp / "train.npz"),
                   "--real-test", str(tmp / "test.npz"), "--seeds", "1",
                   "--models", "logreg", "--no-distribution", "--no-ceiling",
                   "--output", str(tmp / "eval.json")])
    assert rc == 0, capsys.readouterr().err
    report = json.loads((tmp / "eval.json").read_text())
    assert report["synthetic"]["release"] is True
    assert report["protocol"]["rows"]["synthetic"] > 0
    assert report["synthetic_trained"]["logreg"]["mean"] > 0.8


def test_unknown_output_format_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["generate", "--output-format", "csv", "--output",
                  str(tmp_path / "r")])
    assert "--output-format" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_demo_utility_line_reads_a_parquet_release(releases):
    from dpsynth.pipelines import demo
    tmp = releases["tmp"]
    line = demo.utility_line(str(releases["parquet"]), str(tmp / "test.npz"),
                             str(tmp / "train.npz"))
    synth = float(re.search(r"trained on synthetic ([\d.]+)", line).group(1))
    assert synth > 0.8, line
