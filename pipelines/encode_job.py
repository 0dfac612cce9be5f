"""The `dpsynth encode` job (its command line: pipelines/cli/encode.py): the Beam graph that reads labelled
images, encodes them in the workers with RunInference and writes embeddings + labels, and the pieces
`dpsynth generate --images` reuses (`encoded_image_blocks`).
"""

from __future__ import annotations

import io
import json
import logging
import os
import zlib
from typing import Optional, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems

from dpsynth.models.encoders import get_encoder
from dpsynth.pipelines.runners.temp_cleanup import pipeline_run
from dpsynth.pipelines.runners import locality
from dpsynth.pipelines.runners.options import UsageError, beam_options, local_blas_threads
from dpsynth.pipelines.spec import EncodeSpec, ImageOptions
from dpsynth.transforms.formats import ImageInputError
from dpsynth.transforms.images import CheckBadImages, ReadImages, gate_on

log = logging.getLogger("dpsynth")

OUTPUT_FORMATS = {".npz": "npz", ".tfrecord": "tfrecord", ".tfrecords": "tfrecord", ".tfr": "tfrecord"}


# ------------------------------------------------------------------ graph pieces

def encoder_for(images: ImageOptions, num_threads: Optional[int] = None):
    """The encoder the image options name (``num_threads`` overrides ``images.encoder_threads``)."""
    return get_encoder(images.encoder, weights=images.encoder_weights, image_size=images.image_size,
                       pixel_scale=images.pixel_scale, resize_mode=images.resize_mode,
                       output_key=images.encoder_output_key, num_threads=num_threads or images.encoder_threads)


class _EncodedRows(beam.PTransform):
    """PBegin → (source, label, embedding) rows, released only after the bad-image check passed."""

    def __init__(self, reader: ReadImages, encode, max_bad_images: Optional[int], bad_report_path: Optional[str]):
        super().__init__()
        self.reader, self.encode = reader, encode
        self.check = CheckBadImages(max_bad_images, bad_report_path)

    def expand(self, pbegin):
        read = pbegin | "ReadImages" >> self.reader
        summary = read["bad"] | "CheckBadImages" >> self.check
        rows = read["images"] | "Encode" >> self.encode
        return gate_on(rows, summary)


def encoded_rows(pipeline, images_pattern: str, encoder, *, batch_size: int = 64, l2_normalize: bool = False,
                 max_bad_images: Optional[int] = 0, bad_report_path: Optional[str] = None,
                 classes: Optional[Sequence[str]] = None, layout: Optional[str] = None,
                 image_key: Optional[str] = None, label_key: Optional[str] = None, label: str = "EncodeImages"):
    """→ (rows, reader): rows are (source, label, float32 embedding), released only after the bad-image check."""
    from dpsynth.transforms.encode import EncodeImages  # lazy: Beam's RunInference module imports torch when present
    reader = ReadImages(images_pattern, layout=layout, classes=classes, image_key=image_key, label_key=label_key)
    encode = EncodeImages(encoder, batch_size=batch_size, l2_normalize=l2_normalize)  # fails fast if unavailable
    rows = pipeline | label >> _EncodedRows(reader, encode, max_bad_images, bad_report_path)
    return rows, reader


def encoded_blocks(pipeline, images_pattern: str, encoder_name: str, *, encoder_weights: Optional[str] = None,
                   batch_size: int = 64, l2_normalize: bool = False, max_bad_images: Optional[int] = 0,
                   bad_report_path: Optional[str] = None, classes: Optional[Sequence[str]] = None,
                   block_size: int = 2048, layout: Optional[str] = None, image_key: Optional[str] = None,
                   label_key: Optional[str] = None, image_size: Optional[tuple[int, int]] = None,
                   pixel_scale: Optional[str] = None, resize_mode: Optional[str] = None,
                   num_threads: Optional[int] = None, label: str = "EncodeImages"):
    """Images → PCollection of blocks (x [b, d] float64, y [b] int64), b ≤ block_size: the element type the
    DP generation pipeline consumes. Labels: folder layout → index in `classes` (default: sorted class
    folder names, see `dpsynth.transforms.images.list_classes`); tfrecord/npz → the stored int labels.

    The blocks are only produced after the bad-image budget check passed (the run fails otherwise), so no
    DP step sees data from a run that should have stopped. Raises ImageInputError / EncoderError /
    EncoderUnavailableError while building the graph for bad flags, missing files or missing weights.
    `label` names the composite step (use distinct labels to encode several image sets in one pipeline).
    """
    encoder = get_encoder(encoder_name, weights=encoder_weights, image_size=image_size, pixel_scale=pixel_scale,
                          resize_mode=resize_mode, num_threads=num_threads)
    rows, _ = encoded_rows(pipeline, images_pattern, encoder, batch_size=batch_size, l2_normalize=l2_normalize,
                           max_bad_images=max_bad_images, bad_report_path=bad_report_path, classes=classes,
                           layout=layout, image_key=image_key, label_key=label_key, label=label)
    from dpsynth.transforms.encode import ToBlocks
    return rows | f"{label}ToBlocks" >> ToBlocks(block_size)


def encoded_image_blocks(pipeline, images: ImageOptions, num_threads: Optional[int] = None):
    """`encoded_blocks` for `generate --images` (a DP release: unreadable images are skipped one by one, so
    there is no bad-image budget)."""
    return encoded_blocks(
        pipeline, images.path, images.encoder, encoder_weights=images.encoder_weights,
        batch_size=images.batch_size, l2_normalize=images.l2_normalize, max_bad_images=None,
        bad_report_path=images.bad_images_report, classes=list(images.classes) if images.classes else None,
        layout=images.layout, image_key=images.image_feature, label_key=images.label_feature,
        image_size=images.image_size, pixel_scale=images.pixel_scale, resize_mode=images.resize_mode,
        num_threads=num_threads or images.encoder_threads)


# ------------------------------------------------------------------ writers

def output_format(path: str) -> str:
    ext = os.path.splitext(path.rstrip("/"))[1].lower()
    if ext not in OUTPUT_FORMATS:
        raise ImageInputError(f"--output {path!r}: use a .npz or .tfrecord file name")
    return OUTPUT_FORMATS[ext]


def sidecar_path(output: str, suffix: str) -> str:
    """OUT.npz → OUT<suffix> (e.g. OUT.labels.json) in the same folder."""
    return os.path.splitext(output)[0] + suffix


def _write_bytes(path: str, data: bytes) -> None:
    with FileSystems.create(path) as out:
        out.write(data)


def _stack_rows(rows: list) -> tuple:
    return ([r[0] for r in rows], np.stack([r[2] for r in rows]).astype(np.float32),
            np.asarray([r[1] for r in rows], dtype=np.int64))


def _write_npz(blocks: list, path: str, classes: Optional[list], keep_sources: bool) -> int:
    if not blocks:
        raise ImageInputError(f"no image could be encoded; nothing written to {path}")
    sources = np.asarray([s for b in blocks for s in b[0]])
    x = np.concatenate([b[1] for b in blocks])
    y = np.concatenate([b[2] for b in blocks])
    order = np.argsort(sources, kind="stable")  # independent of worker count and bundle order
    arrays = {"embeddings": x[order], "labels": y[order]}
    if classes:
        arrays["classes"] = np.asarray(classes)
    if keep_sources:
        arrays["sources"] = sources[order]
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    _write_bytes(path, buf.getvalue())
    log.info("wrote embeddings to %s", path)  # no row count: it is the exact private dataset size
    return len(y)


def _example_bytes(row, keep_sources: bool) -> bytes:
    from tensorflow.core.example import example_pb2, feature_pb2 as f  # TF only in the writing workers
    source, label, emb = row
    feature = {"embedding": f.Feature(float_list=f.FloatList(value=np.asarray(emb, np.float32).tolist())),
               "label": f.Feature(int64_list=f.Int64List(value=[int(label)]))}
    if keep_sources:
        feature["source"] = f.Feature(bytes_list=f.BytesList(value=[source.encode()]))
    return example_pb2.Example(features=f.Features(feature=feature)).SerializeToString()


def shard_path(output: str, shard: int, num_shards: int) -> str:
    return output if num_shards == 1 else f"{output}-{shard:05d}-of-{num_shards:05d}"


def _write_tfrecord_shard(item, output: str, num_shards: int, keep_sources: bool) -> int:
    from dpsynth.transforms.write import frame_records
    shard, rows = item
    rows = sorted(rows, key=lambda r: r[0])  # deterministic file content
    with FileSystems.create(shard_path(output, shard, num_shards)) as out:
        out.write(frame_records(_example_bytes(row, keep_sources) for row in rows))
    return len(rows)


def _shard_of(row, num_shards: int) -> tuple[int, tuple]:
    return zlib.crc32(row[0].encode()) % num_shards, row


def write_embeddings(rows, output: str, classes: Optional[list], keep_sources: bool = False,
                     num_shards: int = 1):
    """Writes nothing until rows arrive (they are gated on the bad-image check): no temp files on failure."""
    if output_format(output) == "npz":
        return (rows
                | "BatchRows" >> beam.BatchElements(min_batch_size=1024, max_batch_size=1024)
                | "StackRows" >> beam.Map(_stack_rows)
                | "AllRows" >> beam.combiners.ToList()
                | "WriteNpz" >> beam.Map(_write_npz, output, classes, keep_sources))
    if num_shards < 1:
        raise ImageInputError(f"--num-shards must be >= 1, got {num_shards}")
    return (rows
            | "Shard" >> beam.Map(_shard_of, num_shards)
            | "GroupShards" >> beam.GroupByKey()
            | "WriteTFRecord" >> beam.Map(_write_tfrecord_shard, output, num_shards, keep_sources))


def labels_json(reader: ReadImages, encoder, spec: EncodeSpec) -> dict:
    classes = reader.classes
    return {
        "layout": reader.layout,
        "classes": classes,
        "label_of": {name: i for i, name in enumerate(classes)} if classes else None,
        "note": ("folder layout: label = index of the class folder name in sorted order"
                 if reader.layout == "folder" else "labels as stored in the input files"),
        **encoder.describe(),
        "l2_normalized": bool(spec.images.l2_normalize),
        "output": spec.output,
        "format": output_format(spec.output),
    }


# ------------------------------------------------------------------ run

def run(spec: EncodeSpec) -> dict:
    """Builds and runs the encode pipeline; returns the labels JSON it wrote (with `labels_json` path)."""
    images = spec.images
    fmt = output_format(spec.output)
    if fmt == "npz" and spec.num_shards != 1:
        raise ImageInputError("--num-shards only applies to TFRecord output")
    options = beam_options(list(spec.beam_args))
    try:  # before any image is listed: a cluster elsewhere fails fast
        locality.check_encode_paths(spec, options.get_all_options())
    except ValueError as err:
        raise UsageError(str(err)) from None
    threads = images.encoder_threads or local_blas_threads(options)
    encoder = encoder_for(images, threads)
    report = images.bad_images_report or sidecar_path(spec.output, ".bad_images.tsv")
    if FileSystems.exists(report):  # a stale report from an earlier run would mislead
        FileSystems.delete([report])
    with pipeline_run(options) as p:
        rows, reader = encoded_rows(
            p, images.path, encoder, batch_size=images.batch_size, l2_normalize=images.l2_normalize,
            max_bad_images=spec.max_bad_images, bad_report_path=report,
            classes=list(images.classes) if images.classes else None, layout=images.layout,
            image_key=images.image_feature, label_key=images.label_feature)
        write_embeddings(rows, spec.output, reader.classes, spec.keep_source_ids, spec.num_shards)
    info = labels_json(reader, encoder, spec)
    path = sidecar_path(spec.output, ".labels.json")
    _write_bytes(path, json.dumps(info, indent=2).encode())
    info["labels_json"] = path
    return info
