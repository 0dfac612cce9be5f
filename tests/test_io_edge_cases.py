"""Input edge cases where one record, or the absence of any, must not
change how the rest is read (issue 25 item 8):

* a TFRecord record whose payload holds bytes that look like a record,
  across a ``--split-bytes`` boundary, is read like any other at every
  split size (ranges start at boundaries found by walking the records);
* damaged TFRecord framing fails the run naming the file and byte offset,
  in the embedding reader at any split and in the image reader (which
  skipped the rest of the file before);
* an empty .npz or fixed-size-list Parquet input takes the release path of
  a one-row input: the format records the dimension.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpsynth.pipelines import cli
from dpsynth.transforms import images, io
from dpsynth.transforms.write import example_layout, tfrecord_bytes

DIM = 64


def _frame(payload: bytes) -> bytes:
    length = struct.pack("<Q", len(payload))
    return (length + struct.pack("<I", io.masked_crc32c(length)) + payload
            + struct.pack("<I", io.masked_crc32c(payload)))


def _mimic_file(path) -> tuple[str, np.ndarray, np.ndarray, int]:
    """40 records of DIM floats; record 13's embedding holds a whole valid
    TFRecord frame (finite float32 values) that starts after byte 4096
    while record 13 starts before it."""
    fake = np.frombuffer(_frame(np.array([0.5, 1.0], np.float32).tobytes()),
                         "<f4")
    assert np.isfinite(fake).all()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, DIM)).astype(np.float32)
    x[13, 3:3 + len(fake)] = fake
    y = np.arange(40) % 2
    blob = b"".join(tfrecord_bytes(x[i:i + 1], int(y[i])) for i in range(40))
    record = len(blob) // 40
    head = len(example_layout(DIM, 1)[0])
    at = 13 * record + 12 + head + 12  # the fake frame's first byte
    assert blob[at:at + len(fake) * 4] == fake.tobytes()
    assert 13 * record < 4096 <= at < 14 * record
    path.write_bytes(blob)
    return str(path), x, y, 13 * record


def _read(path: str, split: int) -> tuple[np.ndarray, np.ndarray]:
    spec = io.InputSpec(path, split_bytes=split, block_size=7)
    ranges = io.file_ranges(path, os.path.getsize(path), spec)
    blocks = [b for r in ranges for b in io.read_range_blocks(r, spec)]
    return (np.vstack([b[0] for b in blocks]),
            np.concatenate([b[1] for b in blocks]))


def test_a_payload_that_looks_like_a_record_reads_the_same_at_every_split(
        tmp_path):
    path, x, y, _ = _mimic_file(tmp_path / "m.tfrecord")
    for split in (1024, 4096, 1 << 40):
        got_x, got_y = _read(path, split)
        np.testing.assert_array_equal(got_x, x.astype(np.float64))
        np.testing.assert_array_equal(got_y, y)


def _generate(*argv) -> int:
    try:
        return cli.main(["generate", *map(str, argv), "--accountant", "rdp"])
    except SystemExit as stop:
        return int(stop.code)


def _release_files(out) -> dict[str, bytes]:
    """The release's files (the version folder's name aside) and bytes."""
    manifest = json.loads((out / "_manifest.json").read_text())
    root = out / manifest["root"] if manifest.get("root") else out
    files = {}
    for folder, _, names in os.walk(root):
        for name in names:
            full = os.path.join(folder, name)
            files[os.path.relpath(full, root)] = open(full, "rb").read()
    return files


def test_the_release_is_the_same_at_every_split(tmp_path):
    path, _, _, _ = _mimic_file(tmp_path / "m.tfrecord")
    releases = []
    for split in (1024, 4096, 1 << 40):
        out = tmp_path / f"out-{split}"
        assert _generate("--input", path, "--num-classes", 2, "--output", out,
                         "--noise-seed", 1, "--split-bytes", split,
                         "--embedding-dim", DIM) == 0
        files = _release_files(out)
        data = {k: v for k, v in files.items() if k.startswith("data")}
        assert data
        releases.append((data, files["_gmm.npz"]))
    assert releases[0] == releases[1] == releases[2]


def _damage(path, x, y, at: int) -> int:
    """Writes the file with byte ``at`` of record 30 flipped; its offset."""
    blob = bytearray(b"".join(tfrecord_bytes(x[i:i + 1], int(y[i]))
                              for i in range(len(y))))
    offset = 30 * (len(blob) // len(y))
    blob[offset + at] ^= 0xFF
    path.write_bytes(bytes(blob))
    return offset


@pytest.mark.parametrize("at, what", [(3, "length checksum mismatch"),
                                      (100, "data checksum mismatch")])
def test_damage_is_named_by_its_byte_offset_at_every_split(tmp_path, at, what):
    """A damaged length stops the walk that finds the range starts: the
    range holding the damage reads on to the end and names it."""
    x = np.ones((40, DIM), np.float32)
    path = tmp_path / "d.tfrecord"
    offset = _damage(path, x, np.zeros(40, int), at)
    for split in (1024, 4096, 1 << 40):
        with pytest.raises(io.InputError, match=(
                rf"d.tfrecord: TFRecord record (30 )?at byte {offset} is "
                rf"corrupt \({what}\)")):
            _read(str(path), split)


def test_a_truncated_file_is_named_at_every_split(tmp_path):
    blob = tfrecord_bytes(np.ones((40, DIM), np.float32), 0)
    path = tmp_path / "t.tfrecord"
    path.write_bytes(blob[:-50])
    offset = 39 * (len(blob) // 40)
    for split in (1024, 4096, 1 << 40):
        with pytest.raises(io.InputError, match=(
                rf"t.tfrecord: TFRecord record (39 )?at byte {offset} is "
                rf"truncated")):
            _read(str(path), split)


# ------------------------------------------------------------ image TFRecord

def _image_records(path, count: int) -> list[int]:
    """A TFRecord file of ``count`` records; their byte offsets."""
    records = [b"image-%d" % i * 10 for i in range(count)]
    blob = b"".join(_frame(r) for r in records)
    path.write_bytes(blob)
    offsets, pos = [], 0
    for r in records:
        offsets.append(pos)
        pos += len(r) + 16
    return offsets


def test_image_reader_fails_on_a_corrupt_frame_naming_file_and_offset(
        tmp_path):
    path = tmp_path / "imgs.tfrecord"
    offsets = _image_records(path, 5)
    good = list(images._tfrecord_records(str(path)))
    assert [s for s, _ in good] == [f"{path}#{i}" for i in range(5)]
    data = bytearray(path.read_bytes())
    data[offsets[2] + 14] ^= 0xFF  # a payload byte of record 2
    path.write_bytes(bytes(data))
    with pytest.raises(images.ImageInputError, match=(
            rf"imgs.tfrecord: TFRecord record 2 at byte {offsets[2]} is "
            rf"corrupt \(data checksum mismatch\)")):
        list(images._tfrecord_records(str(path)))
    _image_records(path, 5)  # undamaged, then cut inside record 4
    path.write_bytes(path.read_bytes()[:offsets[4] + 20])
    with pytest.raises(images.ImageInputError, match=(
            rf"record 4 at byte {offsets[4]} is truncated")):
        list(images._tfrecord_records(str(path)))


def test_image_pipeline_stops_on_a_corrupt_frame(tmp_path):
    """The run fails with the one-line error (no images silently lost)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from dpsynth.pipelines import console
    path = tmp_path / "imgs.tfrecord"
    offsets = _image_records(path, 3)
    data = bytearray(path.read_bytes())
    data[offsets[1] + 9] ^= 0xFF  # the length checksum of record 1
    path.write_bytes(bytes(data))
    with pytest.raises(Exception) as caught:
        with beam.Pipeline(options=PipelineOptions(
                runner="FnApiRunner")) as p:
            _ = p | images.ReadImages(str(path))
    # As the CLI reports it (``console.run_command``).
    line = console.inner_error(caught.value) or str(caught.value)
    assert line.split(" [while running")[0] == (
        f"{path}: TFRecord record 1 at byte {offsets[1]} is corrupt (length "
        f"checksum mismatch); not a valid TFRecord file")


# ------------------------------------------------------ empty inputs (n = 0)

def _npz(path, n: int, d: int = 6) -> str:
    np.savez(path, embeddings=np.full((n, d), 0.5), labels=np.zeros(n, int))
    return str(path)


def _fixed_parquet(path, n: int, d: int = 6) -> str:
    emb = pa.FixedSizeListArray.from_arrays(pa.array(np.full(n * d, 0.5)), d)
    pq.write_table(pa.table({"embedding": emb, "label": pa.array(
        np.zeros(n, np.int64))}), str(path))
    return str(path)


def _structure(value):
    """The manifest's keys (recursively), without its values."""
    if isinstance(value, dict):
        return {k: _structure(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_structure(v) for v in value[:1]]
    return type(value).__name__ if value is not None else "null"


@pytest.mark.parametrize("write", [_npz, _fixed_parquet])
def test_an_empty_input_is_released_like_one_row(tmp_path, write):
    """No --embedding-dim: the .npz header and the Parquet fixed-size list
    give d = 6 without rows, so n = 0 and n = 1 take the same path."""
    ext = "npz" if write is _npz else "parquet"
    outs = []
    for n in (0, 1):
        path = write(tmp_path / f"n{n}.{ext}", n)
        assert io.input_schema([path], io.InputSpec(path)) == (6, path)
        out = tmp_path / f"out{n}"
        assert _generate("--input", path, "--num-classes", 2, "--output", out,
                         "--noise-seed", 1) == 0
        outs.append(out)
    manifests = [json.loads((o / "_manifest.json").read_text()) for o in outs]
    assert _structure(manifests[0]) == _structure(manifests[1])
    assert [m["embedding_dim"] for m in manifests] == [6, 6]
    assert [[c["label"] for c in m["classes"]] for m in manifests] == [
        [0, 1], [0, 1]]
    assert ({k for k in _release_files(outs[0]) if not k.startswith("data")}
            == {k for k in _release_files(outs[1]) if not k.startswith("data")})


def test_an_empty_file_of_another_width_is_refused_like_one_row(tmp_path):
    """An empty 0 x 5 file among 6-d ones is refused as a 1 x 5 one is."""
    _npz(tmp_path / "a.npz", 10, 6)
    for n in (0, 1):
        path = _npz(tmp_path / "b.npz", n, 5)
        spec = io.InputSpec(str(tmp_path / "*.npz"))
        dim, source = io.input_schema(io.match_files(spec.pattern), spec)
        assert dim == 6 and source.endswith("a.npz")
        with pytest.raises(io.InputError, match=(
                r"b.npz: .* has dimension 5, expected 6")):
            list(io.read_file_blocks(path, spec, dim, source))


def _empty_tfrecord(path) -> str:
    path.write_bytes(b"")
    return str(path)


def _empty_list_parquet(path) -> str:
    pq.write_table(pa.table({"embedding": pa.array([], pa.list_(pa.float32())),
                             "label": pa.array([], pa.int64())}), str(path))
    return str(path)


def _one_row_tfrecord(path) -> str:
    path.write_bytes(tfrecord_bytes(np.full((1, 6), 0.5, np.float32), 0))
    return str(path)


def _one_row_list_parquet(path) -> str:
    pq.write_table(pa.table({
        "embedding": pa.array([[0.5] * 6], pa.list_(pa.float32())),
        "label": pa.array([0], pa.int64())}), str(path))
    return str(path)


@pytest.mark.parametrize("writers, ext", [
    ((_empty_tfrecord, _one_row_tfrecord), "tfrecord")])
def test_without_a_recorded_dimension_n0_and_n1_fail_alike(
        tmp_path, capsys, writers, ext):
    """TFRecord does not record d: without --embedding-dim an empty input
    and a one-row input (neighbouring datasets) are refused with the same
    line, before any row is read; with it both are released alike."""
    errors, manifests = [], []
    for n, write in enumerate(writers):
        path = write(tmp_path / f"n{n}.{ext}")
        out = tmp_path / f"out{n}"
        assert _generate("--input", path, "--num-classes", 2,
                         "--output", out) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--embedding-dim" in err
        errors.append(err.replace(path, "<input>"))
        assert not out.exists()
        assert _generate("--input", path, "--num-classes", 2, "--output", out,
                         "--embedding-dim", 6, "--noise-seed", 1) == 0
        capsys.readouterr()
        manifests.append(json.loads((out / "_manifest.json").read_text()))
    assert errors[0] == errors[1]
    assert _structure(manifests[0]) == _structure(manifests[1])


def test_a_parquet_list_column_gives_d_from_its_first_row(tmp_path, capsys):
    """A variable-length Parquet list column (issue 72): d is the first
    row's length, so one row is released without --embedding-dim and only
    an empty input is refused, naming the flag; with it both are released
    alike."""
    empty = _empty_list_parquet(tmp_path / "n0.parquet")
    one = _one_row_list_parquet(tmp_path / "n1.parquet")
    assert _generate("--input", one, "--num-classes", 2, "--output",
                     tmp_path / "a", "--noise-seed", 1) == 0
    assert _generate("--input", empty, "--num-classes", 2, "--output",
                     tmp_path / "b") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--embedding-dim" in err[-1] and not (tmp_path / "b").exists()
    manifests = []
    for n, path in enumerate((empty, one)):
        out = tmp_path / f"dim{n}"
        assert _generate("--input", path, "--num-classes", 2, "--output", out,
                         "--embedding-dim", 6, "--noise-seed", 1) == 0
        manifests.append(json.loads((out / "_manifest.json").read_text()))
    assert _structure(manifests[0]) == _structure(manifests[1])
