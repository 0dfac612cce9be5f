"""tf.train.Example records decoded without TensorFlow.

Why not ``tf.io.parse_example``: importing TensorFlow costs each Beam worker
process ~3-5 s (two worker processes per pipeline run, two runs per default
job: a quarter of a 1M-row job's wall time when profiled), and the
job never needs TensorFlow otherwise. Why not only the protobuf library: one
``ParseFromString`` plus a Python list of 384 floats per row is ~10x slower
than numpy on a block.

So a block is decoded in two ways that give the same answer:

* **fast path** (numpy, whole block): records of one byte length that share
  every byte with a *template* record except the float32 payload of the
  embedding and the label's varint have the template's structure, so their
  values sit at the template's offsets. The template's offsets come from a
  small walker over the protobuf wire format and are cross-checked against
  the protobuf library's own parse of the template.
* **slow path**: every other record. A few go through the protobuf library
  (an ``Example`` message class built from the public field numbers of
  TensorFlow's ``example.proto``/``feature.proto`` in a private descriptor
  pool); a batch of more than ``_LIBRARY_LIMIT`` through TensorFlow's own
  parser (files whose records have no common layout, e.g. ``dpsynth
  encode``'s with a source id per record, pay its import once per worker).

Both return, per record, the embedding's float values and the label's int64
values (empty where a feature is absent), like TensorFlow's RaggedFeature;
the caller checks their lengths.
"""

from __future__ import annotations

import functools
from typing import Optional

import numpy as np

# Field numbers of tensorflow/core/example/{example,feature}.proto.
_EXAMPLE_FEATURES = 1        # Example.features (Features)
_FEATURES_MAP = 1            # Features.feature: map<string, Feature>
_ENTRY_KEY, _ENTRY_VALUE = 1, 2
_FLOAT_LIST, _INT64_LIST = 2, 3   # Feature oneof kind (1 = bytes_list)
_LIST_VALUE = 1              # {Float,Int64}List.value (packed)
_MAX_TEMPLATES = 4           # layouts tried per length before the slow path
_MIN_TEMPLATE_GROUP = 16     # records of one length worth a template
_LIBRARY_LIMIT = 64          # more records without a layout: TensorFlow


class WireError(ValueError):
    """A record that is not a tf.train.Example with the expected kinds."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


# --------------------------------------------------------------- slow path

@functools.lru_cache(maxsize=1)
def _example_class():
    """``Example`` from the public schema, in a private descriptor pool (no
    clash with TensorFlow's own classes if TensorFlow is loaded too)."""
    from google.protobuf import descriptor_pb2, descriptor_pool
    from google.protobuf import message_factory

    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name="dpsynth_example.proto", package="dpsynth_wire", syntax="proto3")

    def add(parent, name: str, fields, oneof: Optional[str] = None):
        m = parent.add(name=name)
        if oneof:
            m.oneof_decl.add(name=oneof)
        for number, fname, ftype, label, type_name in fields:
            fd = m.field.add(name=fname, number=number, type=ftype,
                             label=label)
            if type_name:
                fd.type_name = type_name
            if oneof:
                fd.oneof_index = 0
        return m

    rep, opt = f.LABEL_REPEATED, f.LABEL_OPTIONAL
    add(fdp.message_type, "BytesList", [(1, "value", f.TYPE_BYTES, rep, "")])
    add(fdp.message_type, "FloatList", [(1, "value", f.TYPE_FLOAT, rep, "")])
    add(fdp.message_type, "Int64List", [(1, "value", f.TYPE_INT64, rep, "")])
    add(fdp.message_type, "Feature", [
        (1, "bytes_list", f.TYPE_MESSAGE, opt, ".dpsynth_wire.BytesList"),
        (2, "float_list", f.TYPE_MESSAGE, opt, ".dpsynth_wire.FloatList"),
        (3, "int64_list", f.TYPE_MESSAGE, opt, ".dpsynth_wire.Int64List")],
        oneof="kind")
    features = add(fdp.message_type, "Features", [
        (1, "feature", f.TYPE_MESSAGE, rep,
         ".dpsynth_wire.Features.FeatureEntry")])
    entry = add(features.nested_type, "FeatureEntry", [
        (1, "key", f.TYPE_STRING, opt, ""),
        (2, "value", f.TYPE_MESSAGE, opt, ".dpsynth_wire.Feature")])
    entry.options.map_entry = True
    add(fdp.message_type, "Example", [
        (1, "features", f.TYPE_MESSAGE, opt, ".dpsynth_wire.Features")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("dpsynth_wire.Example"))


def _kind_values(example, name: str, kind: str, dtype) -> np.ndarray:
    features = example.features.feature
    if name not in features:
        return np.empty(0, dtype)
    feature = features[name]
    which = feature.WhichOneof("kind")
    if which is None:
        return np.empty(0, dtype)
    if which != kind:
        raise ValueError(f"feature {name!r} is a {which}, not a {kind}")
    return np.asarray(getattr(feature, kind).value, dtype)


def parse_one(record: bytes, embedding: str, label: str
              ) -> tuple[np.ndarray, np.ndarray]:
    """(float32 embedding values, int64 label values) of one record, by the
    protobuf library; ValueError if it is not such an Example."""
    example = _example_class()()
    try:
        example.ParseFromString(record)
    except Exception as err:  # the library's DecodeError, by backend
        raise ValueError(f"not a protobuf message ({err})") from None
    return (_kind_values(example, embedding, "float_list", np.float32),
            _kind_values(example, label, "int64_list", np.int64))


# --------------------------------------------------------------- fast path

def _varint_at(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("bad varint")
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        shift += 7
        if not byte & 0x80:
            return value, pos


def _fields(buf: bytes, start: int, stop: int):
    """(field number, wire type, payload start, payload stop) of each field
    in buf[start:stop]; varints have their payload at [start, stop)."""
    pos = start
    while pos < stop:
        key, pos = _varint_at(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, end = _varint_at(buf, pos)
        elif wire == 1:
            end = pos + 8
        elif wire == 2:
            length, pos = _varint_at(buf, pos)
            end = pos + length
        elif wire == 5:
            end = pos + 4
        else:
            raise ValueError("unsupported wire type")
        if end > stop:
            raise ValueError("field runs past its message")
        yield number, wire, pos, end
        pos = end


def _only(buf: bytes, start: int, stop: int, number: int, wire: int
          ) -> Optional[tuple[int, int]]:
    """The payload of the message's only field, if it is (number, wire)."""
    fields = list(_fields(buf, start, stop))
    if len(fields) != 1 or fields[0][:2] != (number, wire):
        return None
    return fields[0][2:]


def _locate(buf: bytes, embedding: str, label: str
            ) -> Optional[tuple[int, int, int, int]]:
    """(embedding offset, float count, label offset, label varint length)
    in a record with the plain layout: each feature one map entry whose
    Feature holds one packed list; None for anything else."""
    entries = {}
    for number, wire, s, e in _fields(buf, 0, len(buf)):
        if (number, wire) != (_EXAMPLE_FEATURES, 2):
            return None
        for n2, w2, s2, e2 in _fields(buf, s, e):
            if (n2, w2) != (_FEATURES_MAP, 2):
                return None
            key = value = None
            for n3, w3, s3, e3 in _fields(buf, s2, e2):
                if (n3, w3) == (_ENTRY_KEY, 2) and key is None:
                    key = bytes(buf[s3:e3])
                elif (n3, w3) == (_ENTRY_VALUE, 2) and value is None:
                    value = (s3, e3)
                else:
                    return None
            if key is None or value is None or key in entries:
                return None
            entries[key] = value
    emb, lab = entries.get(embedding.encode()), entries.get(label.encode())
    if emb is None or lab is None:
        return None
    floats = _only(buf, *emb, _FLOAT_LIST, 2)
    ints = _only(buf, *lab, _INT64_LIST, 2)
    if floats is None or ints is None:
        return None
    values = _only(buf, *floats, _LIST_VALUE, 2)
    varint = _only(buf, *ints, _LIST_VALUE, 2)
    if values is None or varint is None or (values[1] - values[0]) % 4:
        return None
    _, end = _varint_at(buf, varint[0])
    if end != varint[1]:
        return None  # more than one label value
    return (values[0], (values[1] - values[0]) // 4, varint[0],
            varint[1] - varint[0])


def _decode_varints(b: np.ndarray) -> np.ndarray:
    """int64 values of equal-length varints, one per row of ``b``."""
    value = np.zeros(len(b), np.uint64)
    for j in range(b.shape[1]):
        value |= (b[:, j] & 0x7F).astype(np.uint64) << np.uint64(7 * j)
    return value.view(np.int64)


def _match(rows: np.ndarray, template: np.ndarray,
           layout: tuple[int, int, int, int]) -> np.ndarray:
    """Rows that share the template's structure bytes and hold a varint of
    the template's length at its label offset."""
    off, dim, lab, lab_len = layout
    fixed = np.ones(rows.shape[1], bool)
    fixed[off:off + 4 * dim] = False
    fixed[lab:lab + lab_len] = False
    ok = (rows[:, fixed] == template[fixed]).all(axis=1)
    varint = rows[:, lab:lab + lab_len]
    ok &= (varint[:, :-1] >= 0x80).all(axis=1) & (varint[:, -1] < 0x80)
    return ok


def _template_layout(record: bytes, embedding: str, label: str
                     ) -> Optional[tuple[int, int, int, int]]:
    try:
        layout = _locate(record, embedding, label)
    except ValueError:
        return None
    if layout is None:
        return None
    # The library must read the same values at these offsets.
    try:
        emb, lab = parse_one(record, embedding, label)
    except ValueError:
        return None
    off, dim, at, n = layout
    mine = np.frombuffer(record, "<f4", dim, off)
    theirs = np.frombuffer(record, np.uint8, n, at)[None, :]
    if (emb.shape != (dim,) or lab.shape != (1,)
            or not np.array_equal(mine.view(np.uint32), emb.view(np.uint32))
            or _decode_varints(theirs)[0] != lab[0]):
        return None
    return layout


class Parsed:
    """Decoded records: per record the number of embedding values and of
    label values (0 where the feature is absent), and the values."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.emb_lengths = np.zeros(n, np.int64)
        self.lab_lengths = np.zeros(n, np.int64)
        self._blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._single: list[tuple[int, np.ndarray, np.ndarray]] = []

    def add_block(self, index: np.ndarray, x: np.ndarray, y: np.ndarray
                  ) -> None:
        self.emb_lengths[index] = x.shape[1]
        self.lab_lengths[index] = 1
        self._blocks.append((index, x, y))

    def add_one(self, i: int, emb: np.ndarray, lab: np.ndarray) -> None:
        self.emb_lengths[i], self.lab_lengths[i] = len(emb), len(lab)
        self._single.append((i, emb, lab))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """x [n, d] float32 and y [n] int64; only once every record has the
        same number d of embedding values and one label value."""
        d = int(self.emb_lengths[0]) if self.n else 0
        x = np.empty((self.n, d), np.float32)
        y = np.empty(self.n, np.int64)
        for index, xs, ys in self._blocks:
            x[index], y[index] = xs, ys
        for i, emb, lab in self._single:
            x[i], y[i] = emb, lab[0]
        return x, y


def parse_examples(records: list[bytes], embedding: str, label: str
                   ) -> Parsed:
    """The float32 values of feature ``embedding`` and the int64 values of
    feature ``label`` of each record. WireError names the first record that
    is not a tf.train.Example (with a float list ``embedding`` and an int64
    list ``label`` where present)."""
    out = Parsed(len(records))
    lengths = np.fromiter(map(len, records), np.int64, len(records))
    rest: list[tuple[int, bytes]] = []
    for length in np.unique(lengths):
        index = np.flatnonzero(lengths == length)
        if len(index) < _MIN_TEMPLATE_GROUP:  # e.g. a per-record source id
            rest += [(i, records[i]) for i in index.tolist()]
            continue
        rows = np.frombuffer(b"".join(records[i] for i in index),
                             np.uint8).reshape(len(index), int(length))
        rest += _parse_equal(rows, index, out, embedding, label)
    _parse_rest(rest, out, embedding, label)
    return out


def parse_rows(rows: np.ndarray, embedding: str, label: str) -> Parsed:
    """``parse_examples`` of records of one length, given as the rows of a
    uint8 array (as the TFRecord reader finds them: no bytes objects)."""
    out = Parsed(len(rows))
    rest = _parse_equal(rows, np.arange(len(rows)), out, embedding, label)
    _parse_rest(rest, out, embedding, label)
    return out


def _parse_equal(rows: np.ndarray, index: np.ndarray, out: Parsed,
                 embedding: str, label: str) -> list[tuple[int, bytes]]:
    """Records of one length (rows) at positions ``index`` of ``out``; the
    ones no template fits are returned (position, bytes)."""
    todo = index
    for _ in range(_MAX_TEMPLATES):
        if not len(todo):
            return []
        layout = _template_layout(rows[0].tobytes(), embedding, label)
        if layout is None:
            break
        ok = _match(rows, rows[0], layout)
        off, dim, at, k = layout
        out.add_block(todo[ok], rows[ok, off:off + 4 * dim].view("<f4"),
                      _decode_varints(rows[ok, at:at + k]))
        todo, rows = todo[~ok], rows[~ok]
    return [(i, row.tobytes()) for i, row in zip(todo.tolist(), rows)]


def _parse_rest(rest: list[tuple[int, bytes]], out: Parsed, embedding: str,
                label: str) -> None:
    """Records without a common layout (e.g. encode's, whose source-id
    feature differs in length per record). A few go through the protobuf
    library (~27 us a record); many through TensorFlow's batch parser
    (~2 us a record once imported, the import ~3 s once per worker)."""
    if len(rest) > _LIBRARY_LIMIT and _tensorflow_parse(rest, out, embedding,
                                                        label):
        return
    for i, record in rest:
        try:
            out.add_one(i, *parse_one(record, embedding, label))
        except ValueError as err:
            raise WireError(i, str(err)) from None


def _tensorflow_parse(rest: list[tuple[int, bytes]], out: Parsed,
                      embedding: str, label: str) -> bool:
    """TensorFlow's parse of ``rest`` into ``out``; False when TensorFlow
    rejects the batch (the caller then names the bad record)."""
    import tensorflow as tf
    feats = {embedding: tf.io.RaggedFeature(tf.float32),
             label: tf.io.RaggedFeature(tf.int64)}
    try:
        parsed = tf.io.parse_example(tf.constant([r for _, r in rest]), feats)
    except Exception:  # TensorFlow's InvalidArgumentError and kin
        return False
    emb, lab = parsed[embedding], parsed[label]
    emb_len, lab_len = emb.row_lengths().numpy(), lab.row_lengths().numpy()
    index = np.array([i for i, _ in rest])
    flat_x, flat_y = emb.flat_values.numpy(), lab.flat_values.numpy()
    if len(set(emb_len.tolist())) == 1 and emb_len[0] > 0 and \
            np.all(lab_len == 1):
        out.add_block(index, flat_x.reshape(len(rest), -1), flat_y)
        return True
    x_at, y_at = np.cumsum(emb_len) - emb_len, np.cumsum(lab_len) - lab_len
    for j, i in enumerate(index.tolist()):
        out.add_one(i, flat_x[x_at[j]:x_at[j] + emb_len[j]],
                    flat_y[y_at[j]:y_at[j] + lab_len[j]])
    return True
