"""Bad input and bad flags: a clear error naming the file, row or flag, and
nothing left behind (no release, no staging directory).

Most cases fail before the Beam pipeline starts (flag checks, listing the
input, reading the schema), which takes milliseconds. The cases that can
only be found while the workers read the data (a bad row deep in a file)
run the real pipeline and check that the worker's error reaches the user as
one ``dpsynth: error:`` line. Runs use ``--accountant rdp`` because its
calibration is ~30x faster than PLD's; the accountant plays no part here.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from dpsynth.pipelines import cli, console
from tests.conftest import gmm_data


# ----------------------------------------------------------------- helpers

def _generate(*argv, accountant: str = "rdp") -> int:
    """cli.main(['generate', ...]); argparse's exit becomes its code."""
    args = ["generate", *map(str, argv)]
    if accountant and "--accountant" not in args:
        args += ["--accountant", accountant]
    try:
        return cli.main(args)
    except SystemExit as stop:
        return int(stop.code)


def _left_behind(out) -> list[str]:
    """The output path and any staging directory next to it."""
    parent, name = os.path.split(str(out))
    return sorted(p for p in os.listdir(parent)
                  if p == name or p.startswith(name + ".staging-")
                  or p.startswith(name + ".replaced-"))


def _fails(capsys, out, *argv, expect: tuple[str, ...]) -> str:
    """Runs, asserts exit 2, each expected text in the error, nothing left."""
    rc = _generate("--output", out, *argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    for text in expect:
        assert text in err, f"{text!r} not in {err!r}"
    assert "Traceback" not in err
    assert _left_behind(out) == []
    return err


def _npz(path, x, y) -> str:
    np.savez(path, embeddings=x, labels=y)
    return str(path)


def _data(n=240, d=6, classes=2, seed=0):
    return gmm_data(n, d=d, classes=classes, seed=seed)


def _example(embedding=None, label=None, emb_name="embedding",
             label_name="label") -> bytes:
    import tensorflow as tf
    feature = {}
    if embedding is not None:
        feature[emb_name] = tf.train.Feature(
            float_list=tf.train.FloatList(value=list(embedding)))
    if label is not None:
        feature[label_name] = tf.train.Feature(
            int64_list=tf.train.Int64List(value=[int(label)]))
    return tf.train.Example(features=tf.train.Features(
        feature=feature)).SerializeToString()


def _tfrecord(path, records) -> str:
    import tensorflow as tf  # arbitrary (also malformed) records
    with tf.io.TFRecordWriter(str(path)) as w:
        for record in records:
            w.write(record)
    return str(path)


def _parquet(path, rows, labels) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"embedding": rows, "label": labels}), str(path))
    return str(path)


@pytest.fixture
def good(tmp_path):
    x, y = _data()
    return _npz(tmp_path / "good.npz", x, y)


# ------------------------------------------- flags: refused before any read

FLAG_CASES = {
    "epsilon-zero": (["--epsilon", "0"], ["--epsilon", "must be > 0"]),
    "epsilon-negative": (["--epsilon", "-1"], ["--epsilon", "must be > 0"]),
    "epsilon-nan": (["--epsilon", "nan"], ["--epsilon"]),
    "epsilon-not-a-number": (["--epsilon", "lots"], ["--epsilon", "not a number"]),
    "delta-zero": (["--delta", "0"], ["--delta must be in (0, 1)"]),
    "delta-negative": (["--delta=-1e-5"], ["--delta must be in (0, 1)"]),
    "delta-one": (["--delta", "1"], ["--delta must be in (0, 1)"]),
    "delta-above-one": (["--delta", "2"], ["--delta must be in (0, 1)"]),
    "delta-nan": (["--delta", "nan"], ["--delta must be in (0, 1)"]),
    "delta-large": (["--delta", "0.5"], ["--delta 0.5 is larger than 0.0001",
                                         "--allow-large-delta"]),
    "clip-norm-zero": (["--clip-norm", "0"], ["--clip-norm", "> 0"]),
    "clip-norm-negative": (["--clip-norm", "-2"], ["--clip-norm", "> 0"]),
    "clip-norm-inf": (["--clip-norm", "inf"], ["--clip-norm", "finite"]),
    "k-zero": (["--clusters", "0"], ["--clusters must be >= 1"]),
    "covariance-unknown": (["--covariance", "full"], ["--covariance"]),
    "k-negative": (["--clusters", "-4"], ["--clusters must be >= 1"]),
    "weights-sum-not-one": (["--clusters", "4", "--budget-weights",
                             "centre=0.1,tree=0.2,lloyd=0.2,moments=0.1,covariance=0.1"],
                            ["--budget-weights must sum to 1", "0.7"]),
    "weights-unknown-stage": (["--clusters", "4", "--budget-weights",
                               "centre=0.01,tree=0.2,lloyd=0.2,moments=0.39,covariance=0.1,vote=0.1"],
                              ["--budget-weights", "not enabled ['vote']"]),
    "weights-missing-stage": (["--clusters", "4", "--budget-weights",
                               "tree=0.5,moments=0.4,covariance=0.1"],
                              ["--budget-weights", "missing ['centre', 'lloyd']"]),
    "weights-negative": (["--clusters", "4", "--budget-weights",
                          "centre=0.01,tree=-0.2,lloyd=0.2,moments=0.89,covariance=0.1"],
                         ["--budget-weights must all be > 0"]),
    "weights-malformed": (["--budget-weights", "tree:0.5"],
                          ["--budget-weights", "expected stage=weight"]),
    "weights-not-a-number": (["--budget-weights", "tree=lots"],
                             ["--budget-weights", "'lots' is not a number"]),
    "no-label-set": (["--num-classes", None], ["--num-classes N or --labels"]),
    "num-classes-zero": (["--num-classes", "0"], ["--num-classes must be >= 1"]),
    "labels-duplicate": (["--labels", "0,1,1"], ["--labels has duplicates"]),
    "labels-not-integers": (["--labels", "0,one"], ["--labels",
                                                    "comma-separated integers"]),
    "block-size-zero": (["--block-size", "0"], ["--block-size"]),
    "rows-per-shard-zero": (["--rows-per-shard", "0"], ["--rows-per-shard"]),
    "tree-depth-zero": (["--tree-depth", "0"], ["--tree-depth"]),
    "lloyd-rounds-negative": (["--lloyd-rounds", "-1"], ["--lloyd-rounds"]),
    "samples-per-class-zero": (["--samples-per-class", "0"],
                               ["--samples-per-class"]),
    "variance-floor-zero": (["--variance-floor", "0"], ["--variance-floor"]),
    "vote-oversample-below-one": (["--vote-filter", "--vote-oversample", "0.5"],
                                  ["--vote-oversample"]),
    "unknown-input-format": (["--input-format", "xlsx"], ["--input-format",
                                                          "invalid choice"]),
    "unknown-accountant": (["--accountant", "moments"], ["--accountant",
                                                         "invalid choice"]),
    "run-id-path": (["--run-id", "../../elsewhere"], ["--run-id must match"]),
    "multi-threading-refused": (["--direct_running_mode=multi_threading"],
                                ["multi_threading is not supported"]),
    "multi-threading-refused-two-words": (
        ["--direct_num_workers", "2", "--direct_running_mode",
         "multi_threading"], ["multi_threading is not supported"]),
}


@pytest.mark.parametrize("case", sorted(FLAG_CASES))
def test_bad_flag_is_refused_naming_the_flag(case, good, tmp_path, capsys):
    extra, expect = FLAG_CASES[case]
    argv = ["--input", good, "--num-classes", "2"]
    if extra[:2] == ["--num-classes", None]:
        argv, extra = ["--input", good], []
    _fails(capsys, tmp_path / "out", *argv, *extra, expect=tuple(expect))


# --------------------------------------------------------- the output path

def test_output_holding_a_release_is_refused_without_overwrite(good, tmp_path,
                                                                capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text('{"run_id": "earlier"}')
    rc = _generate("--input", good, "--num-classes", 2, "--output", out)
    err = capsys.readouterr().err
    assert rc == 2 and f"--output {out} already holds a release" in err
    assert "--overwrite" in err
    assert os.listdir(out) == ["manifest.json"]
    assert json.loads((out / "manifest.json").read_text())["run_id"] == "earlier"
    assert _left_behind(out) == ["out"]


def test_output_that_is_a_non_release_directory_is_refused(good, tmp_path,
                                                           capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    rc = _generate("--input", good, "--num-classes", 2, "--output", out,
                   "--overwrite")
    err = capsys.readouterr().err
    assert rc == 2 and "exists and is not a release" in err
    assert os.listdir(out) == ["notes.txt"]


def test_output_that_is_a_file_is_refused(good, tmp_path, capsys):
    out = tmp_path / "out"
    out.write_text("not a directory")
    rc = _generate("--input", good, "--num-classes", 2, "--output", out,
                   "--overwrite")
    assert rc == 2 and "is not a release" in capsys.readouterr().err
    assert out.read_text() == "not a directory"


def test_partial_staging_of_a_crashed_attempt_is_discarded(good, tmp_path,
                                                           capsys):
    """A crashed attempt's partial files (no staged manifest) never reach a
    release: the retry of that run id starts a fresh staging directory."""
    out = tmp_path / "out"
    stale = tmp_path / "out.staging-run1@0123abcd"
    (stale / "data").mkdir(parents=True)
    (stale / "data" / "old-shard.tfrecord").write_bytes(b"stale")
    rc = _generate("--input", good, "--num-classes", 2, "--output", out,
                   "--run-id", "run1")
    assert rc == 0, capsys.readouterr().err
    assert not stale.exists()
    assert not list(out.rglob("old-shard.tfrecord"))


# ------------------------------------------- input refused before Beam runs

def test_glob_matching_nothing(tmp_path, capsys):
    _fails(capsys, tmp_path / "out", "--input", tmp_path / "nothing-*.npz",
           "--num-classes", 2, expect=("nothing-*.npz", "no files match"))


def test_input_that_is_a_directory(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    _fails(capsys, tmp_path / "out", "--input", tmp_path / "data",
           "--num-classes", 2, expect=("is a directory", "pass a glob"))


def test_unreadable_path_dangling_link(tmp_path, capsys):
    link = tmp_path / "gone.npz"
    os.symlink(tmp_path / "deleted-target.npz", link)
    _fails(capsys, tmp_path / "out", "--input", link, "--num-classes", 2,
           expect=("gone.npz", "cannot be read"))


def test_unreadable_file_permission_denied(good, tmp_path, capsys,
                                          monkeypatch):
    """Root can read anything here, so the permission error is simulated
    where every reader opens files (Beam's FileSystems)."""
    from apache_beam.io.filesystems import FileSystems

    def denied(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", path)
    monkeypatch.setattr(FileSystems, "open", denied)
    _fails(capsys, tmp_path / "out", "--input", good, "--num-classes", 2,
           expect=("good.npz: cannot read", "Permission denied"))


def test_glob_matching_only_a_directory(tmp_path, capsys):
    (tmp_path / "part-0.npz").mkdir()
    _fails(capsys, tmp_path / "out", "--input", tmp_path / "part-*.npz",
           "--num-classes", 2, expect=("part-*.npz", "no files match"))


def test_empty_tfrecord_file_without_a_dimension(tmp_path, capsys):
    """TFRecord records no dimension: it needs --embedding-dim, with rows
    or without (an empty .npz has it in its header and is released, like
    n = 1)."""
    path = _tfrecord(tmp_path / "empty.tfrecord", [])
    _fails(capsys, tmp_path / "out", "--input", path, "--num-classes", 2,
           expect=("TFRecord input does not record", "--embedding-dim"))


def test_all_matched_files_empty(tmp_path, capsys):
    for i in range(2):
        _tfrecord(tmp_path / f"part-{i}.tfrecord", [])
    _fails(capsys, tmp_path / "out", "--input", tmp_path / "part-*.tfrecord",
           "--num-classes", 2, expect=("part-*.tfrecord", "--embedding-dim"))


@pytest.mark.parametrize("rows", [0, 1])
def test_with_a_public_dimension_n0_and_n1_are_both_released(tmp_path, rows):
    """Whether a release exists never depends on an exact count: with
    --embedding-dim (public) an empty input is released like one row."""
    x = np.full((rows, 6), 0.5)
    path = _npz(tmp_path / "in.npz", x, np.zeros(rows, int))
    out = tmp_path / "out"
    assert _generate("--input", path, "--num-classes", 2, "--embedding-dim",
                     6, "--output", out) == 0
    manifest = json.loads((out / "_manifest.json").read_text())
    assert [c["label"] for c in manifest["classes"]] == [0, 1]
    assert manifest["embedding_dim"] == 6


def test_truncated_npz(good, tmp_path, capsys):
    data = open(good, "rb").read()
    path = tmp_path / "cut.npz"
    path.write_bytes(data[: len(data) // 2])
    _fails(capsys, tmp_path / "out", "--input", path, "--num-classes", 2,
           expect=("cut.npz", "not a readable .npz"))


def test_npz_without_labels_array(tmp_path, capsys):
    path = tmp_path / "x.npz"
    np.savez(path, embeddings=np.ones((5, 3)))
    _fails(capsys, tmp_path / "out", "--input", path, "--num-classes", 2,
           expect=("x.npz", "lacks arrays ['labels']"))


def test_npz_embeddings_not_2d(tmp_path, capsys):
    path = _npz(tmp_path / "flat.npz", np.ones(10), np.zeros(10, int))
    _fails(capsys, tmp_path / "out", "--input", path, "--num-classes", 2,
           expect=("flat.npz", "must be 2-D"))


def test_npz_labels_length_mismatch(tmp_path, capsys):
    path = _npz(tmp_path / "m.npz", np.ones((10, 3)), np.zeros(9, int))
    _fails(capsys, tmp_path / "out", "--input", path, "--num-classes", 2,
           expect=("m.npz", "'labels' must be 1-D with 10 rows"))


def test_unknown_file_extension(tmp_path, capsys):
    path = tmp_path / "table.txt"
    path.write_text("1,2,3\n")
    _fails(capsys, tmp_path / "out", "--input", path, "--num-classes", 2,
           expect=("table.txt", "--input-format"))


def test_tfrecord_missing_feature_name(tmp_path, capsys):
    path = _tfrecord(tmp_path / "a.tfrecord",
                     [_example([0.1, 0.2, 0.3], 0) for _ in range(4)])
    _fails(capsys, tmp_path / "out", "--input", path, "--num-classes", 2,
           "--embedding-feature", "emb", "--embedding-dim", 3,
           expect=("a.tfrecord", "row 0 has no feature 'emb'",
                   "--embedding-feature"))


def test_parquet_missing_column(tmp_path, capsys):
    path = _parquet(tmp_path / "a.parquet", [[0.1, 0.2]] * 3, [0, 1, 0])
    _fails(capsys, tmp_path / "out", "--input", path, "--num-classes", 2,
           "--label-feature", "class",
           expect=("a.parquet", "no column 'class'", "--label-feature"))


def test_parquet_embedding_column_not_a_list(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = tmp_path / "s.parquet"
    pq.write_table(pa.table({"embedding": [0.5, 0.1], "label": [0, 1]}), path)
    _fails(capsys, tmp_path / "out", "--input", path, "--num-classes", 2,
           expect=("s.parquet", "'embedding' must be a list of floats"))


def test_corrupt_tfrecord_first_record(tmp_path, capsys):
    path = tmp_path / "bad.tfrecord"
    path.write_bytes(b"this is not a tfrecord file at all")
    _fails(capsys, tmp_path / "out", "--input", path, "--num-classes", 2,
           "--embedding-dim", 3, expect=("bad.tfrecord", "record 0 at byte 0 is corrupt"))


# --------------------------------------- found by the workers, inside Beam

def _tf_rows(n, d=5, seed=0):
    x, y = _data(n, d=d, seed=seed)
    return [_example(r, l) for r, l in zip(x, y)]


def test_nan_row_is_refused_with_file_and_row(tmp_path, capsys):
    x, y = _data()
    x[137, 3] = np.nan
    path = _npz(tmp_path / "in.npz", x, y)
    _fails(capsys, tmp_path / "out", "--input", path, "--num-classes", 2,
           "--block-size", 50,
           expect=("in.npz: row 137 has NaN or infinite values",
                   "--non-finite drop"))


def test_inf_row_in_parquet_is_refused(tmp_path, capsys):
    x, y = _data(60)
    x[41, 0] = np.inf
    path = _parquet(tmp_path / "in.parquet", x.tolist(), y.tolist())
    _fails(capsys, tmp_path / "out", "--input", path, "--num-classes", 2,
           "--embedding-dim", 6, expect=("in.parquet: row 41 has NaN or infinite values",))


def test_dimension_differs_across_files(tmp_path, capsys):
    x, y = _data(d=6)
    _npz(tmp_path / "part-0.npz", x, y)
    x2, y2 = _data(d=7, seed=1)
    _npz(tmp_path / "part-1.npz", x2, y2)
    _fails(capsys, tmp_path / "out", "--input", tmp_path / "part-*.npz",
           "--num-classes", 2,
           expect=("part-1.npz: row 0 has dimension 7, expected 6",
                   "the first file matching --input", "part-*.npz",
                   "same embedding dimension"))


def test_dimension_differs_inside_a_tfrecord(tmp_path, capsys):
    records = _tf_rows(40)
    records[23] = _example([0.1, 0.2, 0.3], 1)  # 3 values instead of 5
    path = _tfrecord(tmp_path / "in.tfrecord", records)
    _fails(capsys, tmp_path / "out", "--input", path, "--num-classes", 2,
           "--embedding-dim", 5, expect=("in.tfrecord: row 23 has 3 embedding values, expected 5",))


def test_dimension_differs_inside_a_parquet_file(tmp_path, capsys):
    x, y = _data(30, d=4)
    rows = x.tolist()
    rows[17] = rows[17][:2]
    path = _parquet(tmp_path / "in.parquet", rows, y.tolist())
    _fails(capsys, tmp_path / "out", "--input", path, "--num-classes", 2,
           "--embedding-dim", 4, expect=("in.parquet: row 17 has 2 embedding values, expected 4",))


def test_label_outside_the_declared_set(tmp_path, capsys):
    x, y = _data()
    y[201] = 7
    path = _npz(tmp_path / "in.npz", x, y)
    _fails(capsys, tmp_path / "out", "--input", path, "--num-classes", 2,
           expect=("in.npz: row 201 has label 7",
                   "not in --labels/--num-classes [0, 1]"))


def test_non_integer_label(tmp_path, capsys):
    x, y = _data()
    y = y.astype(float)
    y[88] = 0.5
    path = _npz(tmp_path / "in.npz", x, y)
    _fails(capsys, tmp_path / "out", "--input", path, "--num-classes", 2,
           expect=("in.npz: row 88 has non-integer label 0.5",))


def test_string_labels(tmp_path, capsys):
    x, _ = _data(10)
    path = _npz(tmp_path / "in.npz", x, np.array(["cat", "dog"] * 5))
    _fails(capsys, tmp_path / "out", "--input", path, "--num-classes", 2,
           expect=("in.npz", "labels must be integers"))


def test_corrupt_tfrecord_in_the_middle(tmp_path, capsys):
    path = _tfrecord(tmp_path / "in.tfrecord", _tf_rows(20))
    data = bytearray(open(path, "rb").read())
    per_record = len(data) // 20
    data[per_record * 11 + 30] ^= 0xFF  # a payload byte of record 11
    open(path, "wb").write(bytes(data))
    err = _fails(capsys, tmp_path / "out", "--input", path,
                 "--num-classes", 2, "--embedding-dim", 5,
                 expect=("in.tfrecord: TFRecord record 11 at byte",
                         "corrupt (data checksum mismatch)"))
    assert "\\x" not in err and len(err) < 600  # no hex dump of private bytes


def test_truncated_tfrecord(tmp_path, capsys):
    path = _tfrecord(tmp_path / "in.tfrecord", _tf_rows(20))
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-7])
    _fails(capsys, tmp_path / "out", "--input", path, "--num-classes", 2,
           "--embedding-dim", 5, expect=("in.tfrecord: TFRecord record 19", "truncated"))


def test_tfrecord_row_without_label(tmp_path, capsys):
    records = _tf_rows(30)
    records[12] = _example([0.1] * 5, None)
    path = _tfrecord(tmp_path / "in.tfrecord", records)
    _fails(capsys, tmp_path / "out", "--input", path, "--num-classes", 2,
           "--embedding-dim", 5, expect=("in.tfrecord: row 12 has no feature 'label'",))


def test_worker_error_prints_one_clear_line_and_no_traceback(tmp_path,
                                                             capfd):
    x, y = _data()
    x[99, 0] = -np.inf
    path = _npz(tmp_path / "in.npz", x, y)
    rc = _generate("--input", path, "--num-classes", 2, "--output",
                   tmp_path / "out")
    out, err = capfd.readouterr()
    assert rc == 2
    assert "Traceback" not in out + err
    lines = [l for l in err.splitlines() if l.startswith("dpsynth: error:")]
    assert lines == [f"dpsynth: error: {path}: row 99 has NaN or infinite "
                     f"values (use --non-finite drop to drop such rows)"]
    assert _left_behind(tmp_path / "out") == []


def test_a_runner_failure_is_not_reported_as_bad_input(good, tmp_path,
                                                       monkeypatch):
    """Only bad input gets exit 2 and one line; a failure inside the runner
    (here a ValueError from a worker step) keeps its traceback (exit 1)."""
    from dpsynth.transforms import write

    def broken(*args, **kwargs):
        raise ValueError("simulated runner failure")
    monkeypatch.setattr(write, "_write_summary", broken)
    with pytest.raises(ValueError, match="simulated runner failure"):
        _generate("--input", good, "--num-classes", 2, "--output",
                  tmp_path / "out")
    assert _left_behind(tmp_path / "out") == []


def test_wrapped_worker_error_is_unwrapped():
    """Portable runners wrap worker errors in a RuntimeError whose text holds
    the remote traceback; the CLI shows only our message."""
    text = ("Pipeline failed: Traceback (most recent call last):\n  File "
            "\"transforms/io.py\", line 1, in process\ntransforms.io."
            "InputError: /data/a.npz: row 5 has NaN or infinite values "
            "[while running 'Read/ReadBlocks']\n\nmore worker noise")
    assert console.inner_error(RuntimeError(text)) == (
        "/data/a.npz: row 5 has NaN or infinite values "
        "[while running 'Read/ReadBlocks']")


# ------------------------------------------ valid inputs that must succeed

def _keys(doc) -> list:
    if isinstance(doc, dict):
        return [k for k in doc] + [k for v in doc.values() for k in _keys(v)]
    if isinstance(doc, list):
        return [k for v in doc for k in _keys(v)]
    return []


def _manifest(out) -> dict:
    return json.loads((out / "_manifest.json").read_text())


def test_empty_class_succeeds_with_a_noisy_mixture_and_delta_warning(
        tmp_path, capsys):
    """Class 2 has no rows: valid, it gets a mixture of pure noise (DP can't
    say a class is empty). The same run has delta > 1/n: a warning with the
    noisy n (not the true one) goes to the manifest."""
    from dpsynth.pipelines.release.reading import load_gmm
    x, y = _data(300, classes=2)
    path = _npz(tmp_path / "in.npz", x, y)
    out = tmp_path / "out"
    assert _generate("--input", path, "--labels", "0,1,2", "--output", out,
                     "--delta", 0.01, "--allow-large-delta", "--clusters", 3,
                     "--noise-seed", 3) == 0
    manifest = _manifest(out)
    assert [c["label"] for c in manifest["classes"]] == [0, 1, 2]
    gmm = load_gmm(str(out))
    assert set(gmm.mixtures) == {0, 1, 2}
    assert gmm.mixtures[2].means.shape == (3, 6)
    noisy_n = sum(max(c["noisy_count"], 0) for c in manifest["classes"])
    warning = [w for w in manifest["warnings"] if "not far below 1/n" in w]
    assert warning and f"n~{noisy_n:.0f}" in warning[0]
    assert "delta=0.01" in warning[0]
    # The empty class is flagged from its noisy count (DP), not its size.
    empty = [w for w in manifest["warnings"] if w.startswith("class 2:")]
    noisy = manifest["classes"][2]["noisy_count"]
    assert empty and f"noisy count {noisy:.1f}" in empty[0]


def test_fewer_records_than_clusters_succeeds(tmp_path):
    """n = 5 < k = 8: DP cannot know n, so this is a normal (noisy) run."""
    x, y = _data(5, classes=1)
    path = _npz(tmp_path / "tiny.npz", x, np.zeros(5, int))
    out = tmp_path / "out"
    assert _generate("--input", path, "--num-classes", 1, "--clusters", 8,
                     "--output", out, "--noise-seed", 1) == 0
    manifest = _manifest(out)
    assert manifest["classes"][0]["label"] == 0
    assert manifest["config"]["clusters"] == 8


def test_non_finite_rows_dropped_with_drop_policy(tmp_path):
    x, y = _data(200)
    x[[3, 50, 199], 1] = [np.nan, np.inf, -np.inf]
    path = _npz(tmp_path / "in.npz", x, y)
    out = tmp_path / "out"
    assert _generate("--input", path, "--num-classes", 2, "--output", out,
                     "--non-finite", "drop", "--noise-seed", 2) == 0
    manifest = _manifest(out)
    assert manifest["input"]["non_finite"] == "drop"
    # The (private) number of dropped rows is not released anywhere.
    keys = json.dumps(_keys(manifest))
    assert "drop" not in keys.replace('"non_finite"', "")


def test_empty_class_reaches_its_mechanisms_in_the_adaptive_plan(tmp_path):
    """The default plan (--covariance auto) with class 2 empty: its phase-2
    sums are absent from the combine (no rows), and the noise step still
    gives it the zero aggregate, so its mechanisms run and it gets a
    mixture, as every other class does."""
    from dpsynth.pipelines.release.reading import load_gmm
    x, y = _data(300, classes=2)
    path = _npz(tmp_path / "in.npz", x, y)
    out = tmp_path / "out"
    assert _generate("--input", path, "--labels", "0,1,2", "--output", out,
                     "--delta", 0.01, "--allow-large-delta",
                     "--noise-seed", 3) == 0
    manifest = _manifest(out)
    assert [c["label"] for c in manifest["classes"]] == [0, 1, 2]
    names = {m["name"] for m in manifest["privacy"]["mechanisms"]}
    for label in (0, 1, 2):
        assert any(n.startswith(f"class={label}/moments") for n in names)
    assert set(load_gmm(str(out)).mixtures) == {0, 1, 2}
