"""dpsynth.transforms.example_wire reads tf.train.Example records as TensorFlow does,
without TensorFlow (issue 15: a TensorFlow import per Beam worker)."""

import subprocess
import sys

import numpy as np
import pytest

from dpsynth.transforms import example_wire
from dpsynth.transforms.write import tfrecord_bytes

tf = pytest.importorskip("tensorflow")


def tf_example(emb=None, label=None, extra=None, label_first=False,
               emb_kind="float") -> bytes:
    feature = {}
    items = []
    if emb is not None:
        value = (tf.train.Feature(float_list=tf.train.FloatList(value=emb))
                 if emb_kind == "float" else
                 tf.train.Feature(int64_list=tf.train.Int64List(value=emb)))
        items.append(("emb", value))
    if label is not None:
        items.append(("label", tf.train.Feature(
            int64_list=tf.train.Int64List(value=label))))
    if label_first:
        items.reverse()
    for key, value in items + list((extra or {}).items()):
        feature[key] = value
    return tf.train.Example(features=tf.train.Features(
        feature=feature)).SerializeToString()


def tf_parse(records):
    feats = {"emb": tf.io.RaggedFeature(tf.float32),
             "label": tf.io.RaggedFeature(tf.int64)}
    parsed = tf.io.parse_example(tf.constant(records), feats)
    return ([r.numpy() for r in parsed["emb"]],
            [r.numpy() for r in parsed["label"]])


def assert_same_as_tensorflow(records):
    p = example_wire.parse_examples(records, "emb", "label")
    embs, labs = tf_parse(records)
    assert p.emb_lengths.tolist() == [len(e) for e in embs]
    assert p.lab_lengths.tolist() == [len(v) for v in labs]
    if len(set(p.emb_lengths.tolist())) == 1 and set(p.lab_lengths) == {1}:
        x, y = p.arrays()
        np.testing.assert_array_equal(x.view(np.uint32),
                                      np.stack(embs).view(np.uint32))
        np.testing.assert_array_equal(y, np.concatenate(labs))
    return p


def count_library_parses(monkeypatch) -> list:
    calls = []
    real = example_wire.parse_one

    def counted(*a):
        calls.append(1)
        return real(*a)
    monkeypatch.setattr(example_wire, "parse_one", counted)
    return calls


def test_mixed_layouts_read_like_tensorflow(monkeypatch):
    calls = count_library_parses(monkeypatch)
    rng = np.random.default_rng(0)
    odd = np.float32([np.nan, -0.0, np.inf, 1e-45])
    records = []
    for i in range(300):
        emb = rng.standard_normal(4).astype(np.float32)
        label = [int(v) for v in rng.choice([0, 5, 127, 128, 300, -1, 2**40])
                 .reshape(1)]
        records.append(tf_example(emb if i % 7 else odd, label,
                                  label_first=bool(i % 3 == 0)))
    # an extra bytes feature, as encode writes (source ids)
    records.append(tf_example([1.0] * 4, [3], extra={
        "source": tf.train.Feature(bytes_list=tf.train.BytesList(
            value=[b"a/b.png"]))}))
    p = assert_same_as_tensorflow(records)
    assert p.arrays()[0].shape == (301, 4)
    # templates (a few per record length and layout) plus the odd record
    assert len(calls) < 30


def test_our_writer_fast_path_matches_tensorflow():
    x = np.random.default_rng(1).standard_normal((50, 16)).astype(np.float32)
    blob = tfrecord_bytes(x, 130, embedding_feature="emb")
    size = len(blob) // 50
    records = [blob[i * size + 12:(i + 1) * size - 4] for i in range(50)]
    p = assert_same_as_tensorflow(records)
    got, labels = p.arrays()
    np.testing.assert_array_equal(got, x)
    assert set(labels) == {130}


def test_missing_features_and_ragged_rows_are_reported_not_guessed():
    records = [tf_example([1.0, 2.0], [1]), tf_example(None, [2]),
               tf_example([1.0], None), tf_example([1.0, 2.0, 3.0], [1, 2])]
    p = assert_same_as_tensorflow(records)
    assert p.emb_lengths.tolist() == [2, 0, 1, 3]
    assert p.lab_lengths.tolist() == [1, 1, 0, 2]


def test_fast_and_slow_paths_agree(monkeypatch):
    rng = np.random.default_rng(2)
    records = [tf_example(rng.standard_normal(8).astype(np.float32),
                          [int(rng.integers(0, 1000))]) for _ in range(200)]
    fast = example_wire.parse_examples(records, "emb", "label").arrays()
    monkeypatch.setattr(example_wire, "_MAX_TEMPLATES", 0)
    slow = example_wire.parse_examples(records, "emb", "label").arrays()
    for a, b in zip(fast, slow):
        np.testing.assert_array_equal(a, b)


def test_a_record_with_another_structure_of_the_same_length_is_not_misread():
    # Same length as the template, the label entry first: the template's
    # offsets would read label bytes as floats.
    a = tf_example([1.5, 2.5], [7])
    b = tf_example([3.5, 4.5], [9], label_first=True)
    assert len(a) == len(b) and a != b
    x, y = example_wire.parse_examples([a, b], "emb", "label").arrays()
    np.testing.assert_array_equal(x, [[1.5, 2.5], [3.5, 4.5]])
    assert y.tolist() == [7, 9]


@pytest.mark.parametrize("bad", [b"\xff\xff\xff", b"\x0a\x05abc",
                                 "int64 embedding"])
def test_a_record_that_is_not_an_example_is_named(bad):
    if bad == "int64 embedding":
        bad = tf_example([1, 2], [1], emb_kind="int64")
    good = tf_example([1.0, 2.0], [1])
    with pytest.raises(example_wire.WireError) as err:
        example_wire.parse_examples([good, good, bad], "emb", "label")
    assert err.value.index == 2


def test_reading_tfrecords_does_not_import_tensorflow():
    code = ("import sys; import dpsynth.transforms.io, dpsynth.transforms.write, "
            "dpsynth.pipelines.cli.generate; print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "False"


def _with_source(i: int, emb, label) -> bytes:
    source = tf.train.Feature(bytes_list=tf.train.BytesList(
        value=[f"images/{'x' * (i % 37)}/{i}.png".encode()]))
    return tf_example(emb, label, extra={"source": source})


def test_records_without_a_common_layout_are_batch_parsed(monkeypatch):
    """encode's records carry a source id of varying length: no template
    fits, and 300 records one by one through the protobuf library would be
    slow, so they go to TensorFlow's batch parser (same values)."""
    calls = count_library_parses(monkeypatch)
    rng = np.random.default_rng(5)
    records = [_with_source(i, rng.standard_normal(8).astype(np.float32),
                            [i % 5]) for i in range(300)]
    assert_same_as_tensorflow(records)
    assert len(calls) == 0


def test_a_bad_record_in_a_batch_without_layout_is_named():
    rng = np.random.default_rng(6)
    records = [_with_source(i, rng.standard_normal(8).astype(np.float32),
                            [1]) for i in range(200)]
    records[137] = tf_example([1, 2], [1], emb_kind="int64")
    with pytest.raises(example_wire.WireError) as err:
        example_wire.parse_examples(records, "emb", "label")
    assert err.value.index == 137
