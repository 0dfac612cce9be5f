"""Image readers: layouts, decoding in workers, bad-image reporting and budget."""

from __future__ import annotations

import io
import os
import sys

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from PIL import Image

from tests.conftest import shared_image_subset, shared_path
from dpsynth.transforms import images as ti

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gcs_emulator import gcs, gcs_server  # noqa: E402,F401  (fixtures)


def _jpeg(seed: int, size=(12, 10)) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def _png_gray(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((6, 7), seed, dtype=np.uint8), mode="L").save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def tree(tmp_path):
    """root/<class>/ with 2 good images per class, one corrupt and one truncated file, one non-image."""
    root = tmp_path / "imgs"
    for c, name in enumerate(["cat", "airplane", "dog"]):
        (root / name).mkdir(parents=True)
        (root / name / "a.jpg").write_bytes(_jpeg(c))
        (root / name / "b.PNG").write_bytes(_png_gray(c + 10))
    (root / "cat" / "corrupt.jpg").write_bytes(b"not an image at all")
    (root / "dog" / "truncated.jpg").write_bytes(_jpeg(7, (40, 40))[:300])
    (root / "dog" / "notes.txt").write_text("ignored: not an image file name")
    (root / "dog" / "deeper").mkdir()
    (root / "dog" / "deeper" / "x.jpg").write_bytes(_jpeg(9))  # not ROOT/<class>/<file>: ignored
    return str(root)


def _options():
    return PipelineOptions(runner="FnApiRunner")


def _collect(tmp_path, name):
    """A sink that writes what it sees to a file (works across worker processes)."""
    out = tmp_path / name
    out.mkdir()

    def sink(element):
        import pickle
        import uuid
        (out / uuid.uuid4().hex).write_bytes(pickle.dumps(element))
    return sink, lambda: [__import__("pickle").loads(p.read_bytes()) for p in out.iterdir()]


def test_detect_layout():
    assert ti.detect_layout("gs://b/imgs/") == "folder"
    assert ti.detect_layout("/data/train-*.tfrecord") == "tfrecord"
    assert ti.detect_layout("/data/part.tfrecord.gz") == "tfrecord"
    assert ti.detect_layout("/data/*.npz") == "npz"
    assert ti.detect_layout("/data/x", "npz") == "npz"
    with pytest.raises(ti.ImageInputError, match="--image-layout"):
        ti.detect_layout("/data/x", "zip")
    with pytest.raises(ti.ImageInputError, match="glob"):
        ti.detect_layout("/data/*/imgs")


def test_list_classes_sorted(tree):
    assert ti.list_classes(tree) == ["airplane", "cat", "dog"]
    with pytest.raises(ti.ImageInputError, match="no ROOT/<class>"):
        ti.list_classes(os.path.join(tree, "cat"))


def test_list_classes_shared_cifar():
    root = shared_path("data", "cifar10-images", "train")
    assert ti.list_classes(root) == ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                                     "ship", "truck"]


def test_decode_image_variants():
    assert ti.decode_image(_jpeg(1)).shape == (12, 10, 3)
    gray = ti.decode_image(_png_gray(5))
    assert gray.shape == (6, 7, 3) and gray.dtype == np.uint8 and (gray == 5).all()
    with pytest.raises(ValueError, match="Pillow"):
        ti.decode_image(b"garbage")
    with pytest.raises(OSError, match="(?i)truncated"):
        ti.decode_image(_jpeg(7, (40, 40))[:300])


def test_folder_reader_reports_bad_files(tree, tmp_path):
    sink_ok, read_ok = _collect(tmp_path, "ok")
    sink_bad, read_bad = _collect(tmp_path, "bad")
    with beam.Pipeline(options=_options()) as p:
        read = p | ti.ReadImages(tree)
        read["images"] | "SinkOk" >> beam.Map(lambda e: sink_ok((e[0], e[1], e[2].shape)))
        summary = read["bad"] | ti.CheckBadImages(max_bad=2, report_path=str(tmp_path / "bad.tsv"))
        summary | "SinkBad" >> beam.Map(sink_bad)
    rows = sorted(read_ok())
    names = [(os.path.relpath(s, tree), label, shape) for s, label, shape in rows]
    assert names == [("airplane/a.jpg", 0, (12, 10, 3)), ("airplane/b.PNG", 0, (6, 7, 3)),
                     ("cat/a.jpg", 1, (12, 10, 3)), ("cat/b.PNG", 1, (6, 7, 3)),
                     ("dog/a.jpg", 2, (12, 10, 3)), ("dog/b.PNG", 2, (6, 7, 3))]
    assert read_bad() == [{"bad_images": 2, "report": str(tmp_path / "bad.tsv")}]
    report = (tmp_path / "bad.tsv").read_text().splitlines()
    assert [line.split("\t")[0] for line in report] == [os.path.join(tree, "cat", "corrupt.jpg"),
                                                        os.path.join(tree, "dog", "truncated.jpg")]
    assert "truncated" in report[1].lower()


def test_bad_image_budget_stops_run(tree, tmp_path):
    wrote, _ = _collect(tmp_path, "gated")
    with pytest.raises(Exception) as info:
        with beam.Pipeline(options=_options()) as p:
            read = p | ti.ReadImages(tree)
            summary = read["bad"] | ti.CheckBadImages(max_bad=1)
            ti.gate_on(read["images"], summary) | beam.Map(wrote)
    text = str(info.value)
    assert "2 unreadable images, more than --max-bad-images=1" in text
    assert "corrupt.jpg" in text and "truncated.jpg" in text
    assert not list((tmp_path / "gated").iterdir()), "gated output must not run when the budget is exceeded"


def test_explicit_classes_order(tree, tmp_path):
    sink, read = _collect(tmp_path, "ok")
    with beam.Pipeline(options=_options()) as p:
        reader = ti.ReadImages(tree, classes=["dog", "cat"])
        (p | reader)["images"] | beam.Map(lambda e: sink((os.path.basename(os.path.dirname(e[0])), e[1])))
    assert reader.classes == ["dog", "cat"]
    assert sorted(set(read())) == [("cat", 1), ("dog", 0)]


def test_npz_reader(tmp_path):
    rng = np.random.default_rng(0)
    good = tmp_path / "a.npz"
    np.savez(good, images=rng.integers(0, 256, (5, 8, 8, 3), dtype=np.uint8), labels=np.arange(5) % 2,
             classes=np.array(["x", "y"]))
    np.savez(tmp_path / "b.npz", images=rng.integers(0, 256, (3, 8, 8), dtype=np.uint8), labels=np.ones(3, int))
    sink, read = _collect(tmp_path, "ok")
    bad_sink, read_bad = _collect(tmp_path, "bad")
    with beam.Pipeline(options=_options()) as p:
        reader = ti.ReadImages(str(tmp_path / "*.npz"))
        out = p | reader
        out["images"] | beam.Map(lambda e: sink((os.path.basename(e[0]), e[1], e[2].shape, e[2].dtype.str)))
        out["bad"] | "Bad" >> beam.Map(lambda e: bad_sink((os.path.basename(e[0]), e[1])))
    assert reader.classes == ["x", "y"]
    rows = sorted(read())
    assert rows[:2] == [("a.npz#0", 0, (8, 8, 3), "|u1"), ("a.npz#1", 1, (8, 8, 3), "|u1")]
    assert [r[0] for r in rows[5:]] == ["b.npz#0", "b.npz#1", "b.npz#2"] and rows[5][2] == (8, 8, 3)
    assert read_bad() == []


@pytest.mark.parametrize("name", ["c.npz", "d.npz"])
def test_an_unreadable_npz_of_images_fails_naming_it(tmp_path, name):
    """A whole file holds many people's records: skipping it would let one
    damaged file drop the others, so the run fails, naming the file."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "a.npz", images=rng.integers(0, 256, (2, 8, 8, 3), dtype=np.uint8), labels=np.zeros(2, int))
    if name == "c.npz":  # float images: malformed
        np.savez(tmp_path / name, images=rng.random((2, 8, 8, 3)), labels=np.zeros(2, int))
    else:
        (tmp_path / name).write_bytes(b"PK broken")
    with pytest.raises(Exception, match=rf"{name}: cannot read this .npz of images"):
        with beam.Pipeline(options=_options()) as p:
            _ = p | ti.ReadImages(str(tmp_path / "*.npz"))


def test_tfrecord_reader(tmp_path):
    tf = pytest.importorskip("tensorflow")
    path = str(tmp_path / "imgs.tfrecord")

    def example(image: bytes | None, label: int | None) -> bytes:
        feature = {}
        if image is not None:
            feature["image/encoded"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[image]))
        if label is not None:
            feature["image/class/label"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    with tf.io.TFRecordWriter(path) as w:
        w.write(example(_jpeg(1), 3))
        w.write(example(b"broken", 1))
        w.write(example(_png_gray(4), None))
        w.write(example(_png_gray(4), 0))
    sink, read = _collect(tmp_path, "ok")
    bad_sink, read_bad = _collect(tmp_path, "bad")
    with beam.Pipeline(options=_options()) as p:
        out = p | ti.ReadImages(path)
        out["images"] | beam.Map(lambda e: sink((os.path.basename(e[0]), e[1], e[2].shape)))
        out["bad"] | "Bad" >> beam.Map(lambda e: bad_sink((os.path.basename(e[0]), e[1])))
    assert sorted(read()) == [("imgs.tfrecord#0", 3, (12, 10, 3)), ("imgs.tfrecord#3", 0, (6, 7, 3))]
    bad = dict(read_bad())
    assert set(bad) == {"imgs.tfrecord#1", "imgs.tfrecord#2"}
    assert "label" in bad["imgs.tfrecord#2"]


def test_shared_images_subset_reads(tmp_path):
    root = shared_image_subset("test", 2, tmp_path / "cifar")
    sink, read = _collect(tmp_path, "ok")
    with beam.Pipeline(options=_options()) as p:
        (p | ti.ReadImages(str(root)))["images"] | beam.Map(lambda e: sink((e[1], e[2].shape)))
    assert sorted(read()) == [(0, (32, 32, 3))] * 2 + [(1, (32, 32, 3))] * 2


# ------------------------------------------------------------------ gs:// (fake-gcs-server emulator)

def test_gcs_folder_layout_encode_to_gcs(gcs, tree, tmp_path, monkeypatch):
    """Images, model and output all on gs://: listing, reading, bad files and writing go through FileSystems.
    The model's local copy is gone once it is loaded."""
    import tempfile

    import keras
    from dpsynth.pipelines import encode_job
    from dpsynth.pipelines.cli import encode
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # FnApiRunner: this process
    bucket = gcs.client().bucket(gcs.bucket)
    for dirpath, _, files in os.walk(tree):
        for f in files:
            rel = os.path.relpath(os.path.join(dirpath, f), tree).replace(os.sep, "/")
            bucket.blob(f"imgs/{rel}").upload_from_filename(os.path.join(dirpath, f))
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(3, 3), keras.layers.GlobalAveragePooling2D()])
    model.save(str(tmp_path / "m.keras"))
    bucket.blob("models/m.keras").upload_from_filename(str(tmp_path / "m.keras"))
    assert ti.list_classes(gcs.uri("imgs")) == ["airplane", "cat", "dog"]

    args, beam_argv = encode.parser().parse_known_args(
        ["--images", gcs.uri("imgs"), "--encoder", "keras:" + gcs.uri("models", "m.keras"), "--output",
         gcs.uri("out", "emb.npz"), "--max-bad-images", "2", "--keep-source-ids", "--runner=FnApiRunner"])
    encode_job.run(encode.spec_from_args(args, beam_argv))
    assert {"out/emb.npz", "out/emb.labels.json", "out/emb.bad_images.tsv"} <= set(gcs.names("out/"))
    local = tmp_path / "emb.npz"
    bucket.blob("out/emb.npz").download_to_filename(str(local))
    got = np.load(local)
    assert [s.split("/imgs/")[1] for s in got["sources"]] == [
        "airplane/a.jpg", "airplane/b.PNG", "cat/a.jpg", "cat/b.PNG", "dog/a.jpg", "dog/b.PNG"]
    assert got["labels"].tolist() == [0, 0, 1, 1, 2, 2] and got["embeddings"].shape == (6, 3)
    report = bucket.blob("out/emb.bad_images.tsv").download_as_text()
    assert "imgs/cat/corrupt.jpg" in report and "imgs/dog/truncated.jpg" in report
    assert not list(scratch.glob("dpsynth-model-*"))
