"""The one release writer (transforms/write.py): TFRecord bytes that
TensorFlow's own reader and parser accept, Parquet shards, gs:// output.

Why the project frames TFRecords itself instead of building one
tf.train.Example per row: benchmarks/write_speed.py
(results/write_speed.md).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import numpy as np
import pytest

from dpsynth.transforms import io as tio
from dpsynth.transforms import write

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gcs_emulator import gcs, gcs_server  # noqa: E402,F401  (fixtures)


def _rows(n=25, d=7, seed=0):
    return np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)


def test_tfrecord_bytes_read_by_tf_data_and_parse_example(tmp_path):
    import tensorflow as tf
    x = _rows()
    path = tmp_path / "s.tfrecord"
    path.write_bytes(write.tfrecord_bytes(x, 4, "vec", "cls"))
    spec = {"vec": tf.io.FixedLenFeature([7], tf.float32),
            "cls": tf.io.FixedLenFeature([], tf.int64)}
    ds = tf.data.TFRecordDataset([str(path)]).batch(10).map(
        lambda r: tf.io.parse_example(r, spec))
    got = list(ds.as_numpy_iterator())
    np.testing.assert_array_equal(np.concatenate([b["vec"] for b in got]), x)
    assert np.concatenate([b["cls"] for b in got]).tolist() == [4] * 25


def test_frame_records_matches_the_vectorised_frames_and_tf_reads_it(tmp_path):
    import tensorflow as tf
    x = _rows(9, 5)
    head, tail = write.example_layout(5, 2)
    payloads = [head + row.tobytes() + tail for row in x]
    assert write.frame_records(payloads) == write.tfrecord_bytes(x, 2)
    odd = [b"", b"a", b"\x00" * 1000, bytes(range(256))]  # any sizes
    path = tmp_path / "odd.tfrecord"
    path.write_bytes(write.frame_records(odd))
    read = [r.numpy() for r in tf.data.TFRecordDataset([str(path)])]
    assert read == odd  # TensorFlow checks both CRCs of every record


def test_parquet_bytes_round_trip_through_the_reader(tmp_path):
    x = _rows(30, 6)
    path = tmp_path / "s.parquet"
    path.write_bytes(write.parquet_bytes(x, 3, "vec", "cls"))
    xs, ys = tio.load_arrays(str(path), embedding_feature="vec",
                             label_feature="cls")
    np.testing.assert_array_equal(xs, x.astype(np.float64))
    assert ys.tolist() == [3] * 30
    empty = tmp_path / "e.parquet"
    empty.write_bytes(write.parquet_bytes(x[:0], 3))
    import pyarrow.parquet as pq
    assert pq.read_table(empty).num_rows == 0


@pytest.mark.parametrize("fmt", write.OUTPUT_FORMATS)
def test_a_shard_drawn_in_pieces_holds_the_rows_of_one_draw(tmp_path, fmt):
    """A writer draws and writes its shard ``WRITE_PIECE`` rows at a time
    (a Parquet piece is one row group): the file holds the class's rows
    [start, stop) in order, as one draw of them gives; an empty range is
    still a valid file."""
    from dpsynth.dp_ops import generator
    from dpsynth.dp_ops.config import GeneratorConfig
    cfg = GeneratorConfig(labels=(6,))
    rng = np.random.default_rng(3)
    mix = generator.ClassMixture(6, np.array([0.5, 0.5]),
                                 rng.normal(size=(2, 5)),
                                 np.full((2, 5), 0.1), 30000.0)
    start, stop, total = 700, 700 + 2 * write.WRITE_PIECE + 300, 30000
    fn = write._WriteShard(str(tmp_path), "vec", "cls", fmt, cfg)
    [info] = fn.process((6, 0, (start, stop, total, None)), {6: mix})
    [empty] = fn.process((6, 1, (stop, stop, total, None)), {6: mix})
    assert (info["samples"], empty["samples"]) == (stop - start, 0)
    data = tmp_path / write.DATA_DIR
    xs, ys = tio.load_arrays(str(data / info["shard"]), fmt,
                             embedding_feature="vec", label_feature="cls")
    np.testing.assert_array_equal(
        xs, generator.sample_rows(mix, cfg, total, start, stop))
    assert set(ys.tolist()) == {6}
    if fmt == "parquet":
        import pyarrow.parquet as pq
        assert pq.ParquetFile(data / info["shard"]).metadata \
            .num_row_groups == 3
        assert pq.read_table(data / empty["shard"]).num_rows == 0
    else:
        assert (data / empty["shard"]).stat().st_size == 0


def test_a_parquet_shard_has_no_empty_row_group(tmp_path):
    """The vote filter can keep no row of a piece: that piece adds no row
    group (an empty shard is one empty row group, a valid file)."""
    import pyarrow.parquet as pq
    x = _rows(20, 4)
    path = tmp_path / "s.parquet"
    with open(path, "wb") as f:
        shard = write.ParquetShard(f, 2, "vec", "cls")
        for piece in (x[:8], x[:0], x[8:]):
            shard.write(piece)
        shard.close()
    meta = pq.ParquetFile(path).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] \
        == [8, 12]
    xs, _ = tio.load_arrays(str(path), embedding_feature="vec",
                            label_feature="cls")
    np.testing.assert_array_equal(xs, x)


def _calls(path: Path) -> set[str]:
    """Dotted names of everything called or referenced in a module."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Name):
            names.add(node.id)
    return names


def test_one_writer_in_the_product_code():
    """Nothing but transforms/write.py frames TFRecords: no second writer
    (the old io.serialize_examples / io.write_tfrecord), no private Beam
    writer, no TensorFlow writer with its own filesystem layer."""
    assert not hasattr(tio, "write_tfrecord")
    assert not hasattr(tio, "serialize_examples")
    banned = {"write_record", "TFRecordWriter", "WriteToTFRecord",
              "write_tfrecord", "serialize_examples"}
    for folder in ("pipelines", "transforms", "models", "deploy"):
        for path in (ROOT / folder).rglob("*.py"):
            used = _calls(path) & banned
            assert not used, f"{path.relative_to(ROOT)} writes TFRecords " \
                             f"with {sorted(used)}; use dpsynth.transforms.write"


@pytest.mark.parametrize("fmt", write.OUTPUT_FORMATS)
def test_shards_are_written_to_gcs_and_read_back(gcs, fmt):
    x = _rows(250, 4)
    staging = gcs.uri("rel.staging")
    fn = write._WriteShard(staging, "embedding", "label", fmt, None)
    infos = [i for task in write.shard_tasks((6, x), 100)
             for i in fn.process(task)]
    names = [write.shard_name(6, i, fmt) for i in range(3)]
    assert [i["shard"] for i in infos] == names
    assert [i["samples"] for i in infos] == [83, 83, 84]  # even split
    assert gcs.names("rel.staging/data/") == [
        f"rel.staging/data/{name}" for name in names]
    got = [b for name in names
           for b in tio.read_file_blocks(
               f"{staging}/data/{name}",
               tio.InputSpec(name, tio.detect_format(name)))]
    np.testing.assert_array_equal(np.vstack([b[0] for b in got]),
                                  x.astype(np.float64))
    assert np.concatenate([b[1] for b in got]).tolist() == [6] * 250


@pytest.mark.parametrize("total,per,want", [
    (0, 50, [(0, 0)]), (50, 50, [(0, 50)]), (51, 50, [(0, 25), (25, 51)]),
    (200_277, 50_000, [(0, 40055), (40055, 80110), (80110, 120166),
                       (120166, 160221), (160221, 200277)])])
def test_a_class_is_split_into_equal_shards(total, per, want):
    """As few shards as --rows-per-shard allows, equal to one row: a
    200,277-row class is five ~40k shards, not four of 50k and one of 277
    (DirectRunner deals shards out to its workers by count)."""
    assert write.shard_bounds(total, per) == want
    sizes = [b - a for a, b in want]
    assert max(sizes) <= per and max(sizes) - min(sizes) <= 1


def test_vote_filtered_shards_split_the_kept_rows_evenly():
    keep = np.zeros(1000, bool)
    keep[::3] = True  # 334 kept
    tasks = list(write.shard_tasks((2, write.KeptRows(1000, keep)), 100))
    kept = [int(t[2][3].sum()) for t in tasks]
    assert kept == [83, 84, 83, 84] and sum(kept) == keep.sum()
    starts = [t[2][0] for t in tasks]
    assert starts == sorted(starts) and tasks[0][2][0] == 0


@pytest.mark.parametrize("fmt", ["tfrecord", "parquet"])
def test_a_drawn_shard_is_the_rows_drawn_whole(tmp_path, fmt):
    """Shards drawn in WRITE_PIECE pieces (TFRecord) hold exactly the rows
    and bytes of the range drawn in one call, from an unaligned start."""
    from dpsynth.dp_ops import generator
    from dpsynth.dp_ops.config import GeneratorConfig
    rng = np.random.default_rng(2)
    d = 6
    mix = generator.ClassMixture(
        4, np.array([0.3, 0.7]), rng.normal(size=(2, d)),
        rng.uniform(0.1, 0.2, size=(2, d)), 5e4, rng.normal(size=(d, 2)))
    cfg = GeneratorConfig(labels=(4,))
    start, stop, total = 1000, 1000 + 2 * write.WRITE_PIECE + 77, 50_000
    (tmp_path / write.DATA_DIR).mkdir()
    fn = write._WriteShard(str(tmp_path), "embedding", "label", fmt, cfg)
    (meta,) = fn.process((4, 3, (start, stop, total, None)), {4: mix})
    assert meta["samples"] == stop - start
    whole = generator.sample_rows(mix, cfg, total, start, stop)
    got = (tmp_path / write.DATA_DIR / meta["shard"]).read_bytes()
    if fmt == "tfrecord":
        assert got == write.tfrecord_bytes(whole, 4)
    else:
        x, y = tio.load_arrays(str(tmp_path / write.DATA_DIR / meta["shard"]))
        assert np.array_equal(x, whole.astype(np.float64))
        assert set(y.tolist()) == {4}


def test_strided_checksums_equal_the_one_record_checksum():
    buf = np.random.default_rng(4).bytes(5000)
    got = tio.masked_crc32c_strided(buf, 3, 50, 100, 40)
    assert got.dtype == np.uint32
    assert [int(c) for c in got] == [tio.masked_crc32c(buf[3 + 100 * k:
                                                           53 + 100 * k])
                                     for k in range(40)]
    assert tio.masked_crc32c_strided(buf, 0, 10, 10, 0).size == 0
